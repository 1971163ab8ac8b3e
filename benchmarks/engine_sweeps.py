"""bench_engine.py's measurements behind the engine's constants, and a per-op decode trace.

`--sweep blocks`: generate time at small-1024 per decoder.BLOCK; `--sweep rows`: time per
decode step at 128 ... 2 rows and what one compaction costs (engine.MIN_ROWS); `--sweep
folds`: time per decode step per attention.FOLD_SLOTS; `--sweep refill`: refilled rows
against the plain generate per shape; `--trace SHAPE`: a steady decode
step's time per XLA op (jax.profiler). Arms run interleaved, each compiled first.

    .venv/bin/python -m benchmarks.bench_engine --sweep rows --runs 3
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import engine_work, harness
from benchmarks.engine_runners import locojax_runner
from benchmarks.engine_work import SHAPES, Shape, model
from locojax.engine.decode import compact_jit
from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config as model_config
from locojax.model import params


def trace_decode(s: Shape, start: int, steps: int = 20, weights_dtype=None):
    """Where a steady decode step's time goes, per XLA op: `steps` decode steps of the full
    batch from step `start` (a context of P + start slots), traced with `jax.profiler` and
    summed by op as `profile_train.py` sums a train step's."""
    import tempfile
    from pathlib import Path

    from benchmarks.profile_train import trace_summary
    from locojax.engine.engine import Decoding

    cfg, weights = model(s)
    prompts = np.asarray(jax.random.randint(
        jax.random.key(1), (s.prompts, s.prompt_tokens), 1, cfg.vocab_size - 1), np.int32)
    engine = Engine(cfg, weights_dtype=weights_dtype)
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


def learner_logprobs(cfg, weights, prompts, prompt_mask, out, group: int, temperature: float):
    """[R, N] log π(token) of a generate's tokens under `weights` by the trainer's forward
    over prompt + completion (`decoder.token_logprobs`, as the learner scores a rollout)."""
    from locojax.model import decoder

    p = prompts.shape[1]
    tokens = jnp.concatenate([jnp.repeat(prompts, group, 0), out.tokens], 1)  # [R, P + N]
    mask = jnp.concatenate([jnp.repeat(prompt_mask, group, 0), out.mask], 1)
    positions = jnp.maximum(jnp.cumsum(mask, 1) - 1, 0)

    @jax.jit
    def score(weights, tokens, positions, mask):
        hidden, _ = decoder.forward(weights, tokens, positions, cfg, mask=mask)
        return decoder.token_logprobs(weights, hidden[:, p - 1:-1], tokens[:, p:], cfg,
                                      temperature)[0]

    return score(weights, tokens, positions, mask)


WEIGHT_ARMS = {"f32": {}, "bf16 weights": {"weights_dtype": "bf16"},
               "bf16 weights + cache": {"weights_dtype": "bf16", "cache_dtype": "bf16"}}


def step_roofline(cfg, weights, rows: int, context: int, cache_itemsize: int):
    """(FLOPs, bytes) of one decode step at `rows` rows attending to `context` slots: every
    weight read once, each row's keys and values at every layer."""
    nbytes = engine_work.weight_bytes(weights) + (
        rows * context * engine_work.slot_bytes(cfg, cache_itemsize))
    return rows * cfg.flops_per_token(context), nbytes


def sweep_weights(shapes: list[Shape], runs: int, steps: int = 20):
    """f32 against a bf16 rollout copy of the weights (`Engine(weights_dtype="bf16")`), and with
    a bf16 cache too, at each shape's rows: ms per decode step over `steps` steps from token 4
    (arms interleaved) and its share of the roofline (`harness.roofline_share`: the step's
    FLOPs at the matmul peak or its weight and cache bytes at the read bandwidth, measured
    here); then, on the first shape, the sampler-learner gap: each arm's generate of chat
    prompts scored by the f32 learner's forward, mean and max |Δ logprob| over the sampled
    tokens."""
    from locojax.engine.engine import Decoding, pad_prompts, rollout_copy
    from locojax.train import build

    cfg, weights = model(shapes[0])
    arms = {}
    for s in shapes:
        prompts = np.asarray(jax.random.randint(
            jax.random.key(1), (s.prompts, s.prompt_tokens), 1, cfg.vocab_size - 1), np.int32)
        sampling = SamplingConfig(max_new_tokens=s.new_tokens, temperature=1.0, ignore_eos=True)
        for arm, kw in WEIGHT_ARMS.items():
            engine = Engine(cfg, min_rows=None, **kw)

            def run(engine=engine, prompts=prompts, sampling=sampling, s=s):
                d = Decoding(engine, engine.prefill(weights, prompts, jax.random.key(0),
                                                    sampling, num_samples=s.group))
                d.advance(4)
                jax.block_until_ready(d.turn)
                t0 = time.perf_counter()
                d.advance(steps)
                jax.block_until_ready(d.turn)
                return (time.perf_counter() - t0) / steps  # the rest is not decoded

            arms[s, arm] = run
    for fn in arms.values():
        fn()
    bandwidth, peak = harness.read_bandwidth(), harness.matmul_peak()
    times = harness.interleave(arms, runs)
    bandwidth, peak = max(bandwidth, harness.read_bandwidth()), max(peak, harness.matmul_peak())
    print(f"  read bandwidth {bandwidth / 1e9:.1f} GB/s, matmul peak {peak / 1e9:.0f} GFLOP/s "
          f"(best of before and after); load {harness.loads()}")
    head = ["shape", "rows", "weights / cache", "ms per decode step (runs)", "roofline ms",
            "share of roofline"]
    table = []
    for (s, arm), v in times.items():
        kw = WEIGHT_ARMS[arm]
        w = weights if "weights_dtype" not in kw else rollout_copy(weights, jnp.dtype("bfloat16"))
        flops, nbytes = step_roofline(cfg, w, s.rows, s.prompt_tokens + 4 + steps // 2,
                                      2 if "cache_dtype" in kw else 4)
        sec = statistics.median(v)
        runs_ms = " ".join(f"{1000 * t:.1f}" for t in v)
        table.append([s.name, s.rows, arm, f"{1000 * sec:.1f} ({runs_ms})",
                      f"{1000 * harness.roofline_seconds(flops, nbytes, peak, bandwidth):.1f}",
                      engine_work.roofline(sec, flops, nbytes, peak, bandwidth)])
    print("\n".join(harness.table(head, table)), flush=True)

    s = shapes[0]
    tok = build.tokenizer_of(s.model, "chat")
    rng = np.random.default_rng(0)
    texts = [f"What is {a} + {b}? Explain step by step."
             for a, b in rng.integers(0, 100, (s.prompts, 2))]
    prompts, prompt_mask = pad_prompts([tok.encode(t) for t in texts], tok.pad_id)
    sampling = SamplingConfig(max_new_tokens=s.new_tokens, temperature=1.0,
                              stop_token_ids=tuple(tok.stop_ids), pad_token_id=tok.pad_id)
    for arm, kw in WEIGHT_ARMS.items():
        out = Engine(cfg, **kw).generate(
            weights, prompts, jax.random.key(0), sampling, num_samples=s.group,
            prompt_mask=prompt_mask)
        learner = learner_logprobs(cfg, weights, prompts, prompt_mask, out, s.group, 1.0)
        gap = np.abs(np.asarray(learner) - np.asarray(out.logprobs))[np.asarray(out.mask)]
        print(f"  sampler ({arm}) vs f32 learner, {s.rows} rows of chat "
              f"prompts ({prompts.shape[1]} tokens), {gap.size} sampled tokens: "
              f"|Δ logprob| mean {gap.mean():.2e}, max {gap.max():.2e}", flush=True)


def sweep_refill(shapes: list[Shape], runs: int, slots: list[int], at: int = 0):
    """Refilling finished rows (`Engine(refill=Refill(R))`) against the plain generate
    (finished rows compacted out), at each shape's forced lengths: each arm's generate time
    (arms interleaved, each compiled first) and ms per generated token, and each arm's
    per-token time relative to small-512's in the same arm (the 1.5x target of issue 40)."""
    from locojax.engine.refill import Refill

    arms, tokens = {}, {}
    for s in shapes:
        cfg, weights = model(s)
        prompts = np.asarray(jax.random.randint(
            jax.random.key(1), (s.prompts, s.prompt_tokens), 1, cfg.vocab_size - 1), np.int32)
        tokens[s.name] = int(s.lengths().sum())
        for r in [0, *slots]:
            if r >= s.rows:
                continue
            kw = dict(refill=Refill(r, at)) if r else {}
            arms[s.name, f"refill {r}" if r else "plain"] = locojax_runner(
                cfg, weights, prompts, s, **kw)
    def timed(fn):  # then the arm's cache freed: every arm's at once did not fit in memory
        seconds = harness.timed(fn)
        fn.engine.release_cache()
        return seconds

    first = {k: timed(fn) for k, fn in arms.items()}
    print(f"  compiled; load {harness.loads()}", flush=True)
    times = harness.interleave({k: (lambda fn=fn: timed(fn)) for k, fn in arms.items()}, runs)
    head = ["shape", "arm", "first run s", "steady s (runs)", "ms / token",
            "vs plain", "ms/token vs small-512 (same arm)"]
    table = []
    for (name, arm), v in times.items():
        sec = statistics.median(v)
        per = sec / tokens[name]
        base = times.get(("small-512", arm)) or times.get(("small-512", "plain"))
        rel = "" if base is None else harness.fmt(per / (statistics.median(base)
                                                          / tokens["small-512"]), ".2f") + "x"
        plain = statistics.median(times[name, "plain"])
        table.append([name, arm, f"{first[name, arm]:.1f}",
                      f"{sec:.2f} (" + " ".join(f"{t:.2f}" for t in v) + ")",
                      f"{1000 * per:.3f}", f"{plain / sec:.2f}x", rel])
    print("\n".join(harness.table(head, table)), flush=True)
