"""Where a GRPO train step's time goes: a per-op trace of `train_step`, summed by op.

Builds a synthetic batch at a docs/design.md shape (random f32 weights, every prompt and response
token real, random advantages), compiles `train_step`, times steady steps, then traces a
few steps with `jax.profiler` and sums the XLA:CPU events of the trace by op name (and by
op kind: the name without its numeric suffix). Totals are wall time of the events on all
threads, so concurrent ops add up; compare rows against each other, not with the step time.
It also counts the kernels the compiled step launches (fusions, dots and custom calls of its
entry computation) by the JAX operation they came from: at TINY a step is ~600 kernels of
~25 us each, not its FLOPs, which is what bounds it (docs/peers_benchmark.md).

Usage:  .venv/bin/python -m benchmarks.profile_train --shape small [--beta 0.04] [--top 40]
        .venv/bin/python -m benchmarks.profile_train --config CONFIG.json --batch 8,4,256,128
            [--remat]      # a published model at a batch of your own
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from locojax.model import config as model_config
from locojax.model import hf_config
from locojax.model import params as params_lib
from locojax.rl import batch as batch_lib
from locojax.rl import train_state
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
from locojax.rl.train_step import train_step

SHAPES = {"tiny": (8, 4, 16, 32), "small": (16, 8, 32, 64)}  # B prompts, G, P, N


def synthetic_batch(cfg, shape, seed: int = 0) -> batch_lib.TrainBatch:
    b, g, p, n = shape
    rng = np.random.default_rng(seed)
    r = b * g
    prompts = np.repeat(rng.integers(0, cfg.vocab_size, (b, p)), g, axis=0)
    resp = rng.integers(0, cfg.vocab_size, (r, n))
    adv = rng.standard_normal(r).astype(np.float32)
    lp = -rng.random((r, n)).astype(np.float32) * 8
    args = (prompts, np.ones((r, p), bool), resp, np.ones((r, n), bool), lp, adv,
            np.repeat(np.arange(b), g))
    try:
        return batch_lib.from_rollout(*args, group_size=g)
    except TypeError:  # a locojax without shared prefixes (an A/B against an older tree)
        return batch_lib.from_rollout(*args)


def synthetic_setup(preset, shape, beta: float = 0.0, **learner):
    """(state, batch, ref, model config, learner config) of a synthetic train step: the
    preset's (a name, or a ModelConfig) random f32 weights (seed 0), AdamW,
    `synthetic_batch` at `shape`; `ref` a copy of the weights when beta > 0; `learner`:
    further LearnerConfig fields."""
    cfg = model_config.PRESETS[preset]() if isinstance(preset, str) else preset
    weights = params_lib.init(cfg, jax.random.key(0))
    ref = jax.tree.map(jnp.copy, weights) if beta else None
    lcfg = LearnerConfig(algo=AlgoConfig(group_size=shape[1], beta=beta),
                         optim=OptimConfig(lr=1e-5), **learner)
    state = train_state.init(weights, lcfg.optim, cfg)
    return state, jax.device_put(synthetic_batch(cfg, shape)), ref, cfg, lcfg


def trace_summary(trace_dir: Path, top: int) -> str:
    files = sorted(trace_dir.rglob("*.xplane.pb"))
    if not files:
        return "no trace written"
    data = jax.profiler.ProfileData.from_file(str(files[-1]))
    by_name, by_kind = collections.Counter(), collections.Counter()
    counts = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for ev in line.events:
                name = ev.name
                if name.startswith(("$", "PjRt", "Thunk", "ThunkExecutor")):
                    continue
                by_name[name] += ev.duration_ns
                counts[name] += 1
                by_kind[re.sub(r"[.\d]+$", "", name)] += ev.duration_ns
    total = sum(by_kind.values()) or 1
    out = [f"{'op kind':<40} {'ms':>9} {'share':>6}"]
    for k, v in by_kind.most_common(top):
        out.append(f"{k[:40]:<40} {v / 1e6:9.2f} {100 * v / total:5.1f}%")
    out.append(f"\n{'op':<60} {'ms':>9} {'calls':>6}")
    for k, v in by_name.most_common(top):
        out.append(f"{k[:60]:<60} {v / 1e6:9.2f} {counts[k]:6d}")
    return "\n".join(out)


KERNEL = re.compile(r"= \S+ (fusion|dot|custom-call|convolution)\(")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def kernel_summary(hlo: str, top: int) -> str:
    """Kernels of the entry computation of optimized HLO text, by kind and by the first two
    levels of the JAX op that made each (`jvp()/...`: forward; `transpose(jvp())/...`:
    backward), nested `closed_call`s left out."""
    entry = hlo[hlo.index("\nENTRY"):]
    entry = entry[:entry.index("\n}")]
    kinds, origins = collections.Counter(), collections.Counter()
    for line in entry.splitlines():
        kind = KERNEL.search(line)
        if kind is None:
            continue
        kinds[kind.group(1)] += 1
        op = OP_NAME.search(line)
        parts = [p for p in (op.group(1) if op else "").split("/")[1:] if p != "closed_call"]
        origins["/".join(parts[:2]) or "?"] += 1
    out = [f"kernels launched per step: {sum(kinds.values())} "
           f"({', '.join(f'{n} {k}' for k, n in kinds.most_common())})"]
    out += [f"  {n:5d}  {name[:70]}" for name, n in origins.most_common(top)]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=4, help="steady steps timed")
    ap.add_argument("--traced", type=int, default=2, help="steps traced")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--hlo", default="", help="write the optimized HLO text here")
    ap.add_argument("--config", help="an HF config.json: that model (random f32 weights) "
                                     "instead of --shape's preset")
    ap.add_argument("--batch", help="B,G,P,N instead of --shape's (e.g. GSM8K prompts at "
                                    "128 new tokens: 8,4,256,128)")
    ap.add_argument("--remat", action="store_true", help="rematerialise each layer")
    args = ap.parse_args(argv)
    shape = (tuple(int(x) for x in args.batch.split(",")) if args.batch
             else SHAPES[args.shape])
    model = args.shape
    if args.config:
        with open(args.config) as f:
            model = hf_config.config_from_dict(json.load(f), param_dtype="float32")
    learner = {"remat": True} if args.remat else {}
    state, batch, ref, cfg, lcfg = synthetic_setup(model, shape, args.beta, **learner)
    hlo = train_step.lower(state, batch, ref, model_cfg=cfg, cfg=lcfg).compile().as_text()
    if args.hlo:
        Path(args.hlo).write_text(hlo)
    print(kernel_summary(hlo, args.top))
    t0 = time.perf_counter()
    state, m = train_step(state, batch, ref, model_cfg=cfg, cfg=lcfg)
    jax.block_until_ready(state)
    print(f"{args.config or args.shape} {shape} beta={args.beta} remat={args.remat}: first "
          f"step (compile + run) "
          f"{time.perf_counter() - t0:.2f}s")
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, m = train_step(state, batch, ref, model_cfg=cfg, cfg=lcfg)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
    print("steady steps: " + " ".join(f"{t:.4f}" for t in times) +
          f"  median {statistics.median(times):.4f}s")
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(args.traced):
                state, m = train_step(state, batch, ref, model_cfg=cfg, cfg=lcfg)
                jax.block_until_ready(state)
        print(trace_summary(Path(d), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
