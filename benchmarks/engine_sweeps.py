"""bench_engine.py's measurements behind the engine's constants, and a per-op decode trace.

`--sweep blocks`: generate time at small-1024 per decoder.BLOCK; `--sweep rows`: time per
decode step at 128 ... 2 rows and what one compaction costs (engine.MIN_ROWS); `--sweep
folds`: time per decode step per attention.FOLD_SLOTS; `--trace SHAPE`: a steady decode
step's time per XLA op (jax.profiler). Arms run interleaved, each compiled first.

    .venv/bin/python benchmarks/bench_engine.py --sweep rows --runs 3
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness
from benchmarks.bench_engine import SHAPES, Shape, locojax_runner
from locojax.engine.decode import compact_jit
from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config as model_config
from locojax.model import params


def trace_decode(s: Shape, start: int, steps: int = 20):
    """Where a steady decode step's time goes, per XLA op: `steps` decode steps of the full
    batch from step `start` (a context of P + start slots), traced with `jax.profiler` and
    summed by op as `profile_train.py` sums a train step's."""
    import tempfile
    from pathlib import Path

    from benchmarks.profile_train import trace_summary
    from locojax.engine.engine import Decoding

    cfg = model_config.PRESETS[s.model]()
    weights = params.init(cfg, jax.random.key(0))
    prompts = np.asarray(jax.random.randint(
        jax.random.key(1), (s.prompts, s.prompt_tokens), 1, cfg.vocab_size - 1), np.int32)
    engine = Engine(cfg)
    sampling = SamplingConfig(max_new_tokens=s.new_tokens, temperature=1.0,
                              ignore_eos=not s.long_tail)
    decoding = Decoding(engine, engine.prefill(
        weights, prompts, jax.random.key(0), sampling, num_samples=s.group,
        limits=s.lengths() if s.long_tail else None))
    decoding.advance(start)  # compiles; the batch keeps its R rows until half have finished
    jax.block_until_ready(decoding.turn)
    ms = []
    for _ in range(2):
        t0 = time.perf_counter()
        decoding.advance(steps)
        jax.block_until_ready(decoding.turn)
        ms.append(1000 * (time.perf_counter() - t0) / steps)
    if decoding.finished or decoding.step + steps > s.new_tokens:
        raise SystemExit(f"{s.name}'s decode reaches step {decoding.step} of {s.new_tokens} "
                         f"before the traced steps: lower --trace-start")
    rows, first = decoding.turn.last.shape[0], decoding.step
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            t0 = time.perf_counter()
            decoding.advance(steps)
            jax.block_until_ready(decoding.turn)
            traced = 1000 * (time.perf_counter() - t0) / steps
        print(f"  [{s.name}] decode at {rows} rows, tokens {first}..{first + steps - 1} "
              f"traced: {traced:.1f} ms/step (untraced before: "
              + ", ".join(f"{x:.1f}" for x in ms) + ")\n" + trace_summary(Path(d), 30))


SWEEP_TOKENS = 256  # the rows sweep's tokens a row: about the long-tailed draw's median


def sweep(kind: str, runs: int):
    """qwen3.BLOCK (generate time at small-1024 per block size) or engine.MIN_ROWS (time per
    decode step of SWEEP_TOKENS exact-length tokens a row at 128 ... 2 rows, and what one
    compaction costs): the measurements behind them."""
    cfg = model_config.small()
    weights = params.init(cfg, jax.random.key(0))
    if kind == "blocks":
        s = SHAPES["small-1024"]
        prompts = np.asarray(jax.random.randint(jax.random.key(1), (s.prompts, s.prompt_tokens),
                                                1, cfg.vocab_size - 1), np.int32)
        arms = {b: locojax_runner(cfg, weights, prompts, s, block=b)
                for b in (32, 64, 128, 256, 512, 2048)}
        unit = f"s per generate of {s.name}"
    else:
        arms = {}
        for rows in (128, 64, 32, 16, 8, 4, 2):
            s = Shape(f"rows-{rows}", "small", rows, 1, 32, SWEEP_TOKENS, False)
            prompts = np.asarray(jax.random.randint(jax.random.key(1), (rows, 32), 1,
                                                    cfg.vocab_size - 1), np.int32)
            arms[rows] = locojax_runner(cfg, weights, prompts, s, min_rows=None)
        unit = f"ms per decode step (rows x {SWEEP_TOKENS} tokens, exact length)"
    for fn in arms.values():
        fn()
    times = harness.interleave({k: lambda fn=fn: harness.timed(fn) for k, fn in arms.items()},
                               runs)
    scale = 1.0 if kind == "blocks" else 1000 / (SWEEP_TOKENS - 1)
    for k, v in times.items():
        print(f"  {kind[:-1]} {k}: {scale * statistics.median(v):.3f} {unit} "
              f"(runs {' '.join(f'{scale * t:.3f}' for t in v)})")
    if kind == "rows":  # what one compaction costs: 128 -> 64 rows, every slot written
        engine = Engine(cfg, min_rows=None)
        sampling = SamplingConfig(max_new_tokens=SWEEP_TOKENS)
        written = 32 + SWEEP_TOKENS - 1
        prompts = np.asarray(jax.random.randint(jax.random.key(1), (128, 32), 1,
                                                cfg.vocab_size - 1), np.int32)
        spent = []
        for _ in range(runs + 1):
            turn = engine.prefill(weights, prompts, jax.random.key(0), sampling).prefilled
            cache = dataclasses.replace(turn.cache, index=jnp.int32(written))
            turn = dataclasses.replace(turn, cache=None, done=jnp.arange(128) % 2 == 0)
            jax.block_until_ready((cache, turn))
            t0 = time.perf_counter()
            jax.block_until_ready(compact_jit(cache, turn, None, None, size=64, layout=None))
            spent.append(1000 * (time.perf_counter() - t0))
        print(f"  compact 128 -> 64 rows at {written} written slots: "
              f"{statistics.median(spent[1:]):.1f}"
              f" ms (runs {' '.join(f'{t:.1f}' for t in spent[1:])}; first {spent[0]:.0f})")


FOLD_WRITTEN, FOLD_STEPS = 1056, 16  # the folds sweep's context: ~small-4096's 8-row tail


def sweep_folds(runs: int):
    """attention.FOLD_SLOTS: ms per SMALL decode step at 128 ... 8 rows, FOLD_WRITTEN slots
    written, with m = 1, 2, 4, 8, 16 blocks folded per iteration of attention's loop (up to
    4,096 rows x m x block row-slots an iteration), arms interleaved; each timed span is
    FOLD_STEPS steps of the engine's decode loop from a prefilled cache set FOLD_WRITTEN."""
    from locojax.engine.decode import decode_jit

    cfg = model_config.small()
    weights = params.init(cfg, jax.random.key(0))
    sampling = SamplingConfig(max_new_tokens=FOLD_WRITTEN + FOLD_STEPS, temperature=1.0,
                              ignore_eos=True)
    arms = {}
    for rows in (128, 64, 32, 16, 8):
        engine = Engine(cfg, min_rows=None)
        prompts = np.asarray(jax.random.randint(jax.random.key(1), (rows, 32), 1,
                                                cfg.vocab_size - 1), np.int32)
        for m in (1, 2, 4, 8, 16):
            if rows * m * engine.block > 4096:
                continue

            def run(engine=engine, prompts=prompts, fold_slots=rows * m * engine.block):
                turn = engine.prefill(weights, prompts, jax.random.key(0), sampling).prefilled
                cache = dataclasses.replace(turn.cache, index=jnp.int32(FOLD_WRITTEN),
                                            fold_slots=fold_slots)
                turn = dataclasses.replace(turn, cache=None)
                jax.block_until_ready((cache, turn))
                t0 = time.perf_counter()
                out = decode_jit(weights, cache, turn, None, jnp.int32(1 + FOLD_STEPS),
                                 model_cfg=cfg, sampling=sampling, layout=engine.layout)
                jax.block_until_ready(out)
                spent = time.perf_counter() - t0
                engine.return_cache(out.cache)
                return 1000 * spent / FOLD_STEPS

            arms[rows, m] = run
    for fn in arms.values():
        fn()
    times = harness.interleave(arms, runs)
    for (rows, m), v in times.items():
        print(f"  rows {rows:3d}, fold {m:2d} ({rows * m * 32:5d} row-slots an iteration): "
              f"{statistics.median(v):6.2f} ms per decode step at {FOLD_WRITTEN} slots "
              f"(runs {' '.join(f'{t:.2f}' for t in v)})", flush=True)
