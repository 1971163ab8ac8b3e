"""The real SmolLM2's train step alone at a GRPO shape: wall and CPU seconds per step, peak RSS.

One process, one arm: random f32 weights of the checkpoint's config (values do not change a
dense step's work), `profile_train.synthetic_batch` (every token real, a shared prompt per
group), the `bench_real_trl` learner settings (token-mean, ε 0.2, β 0), `train_step.update`
as a run calls it. CPU seconds (`time.process_time`, every thread) are what a loaded shared
machine distorts least; wall seconds are printed beside them. Run arms one after another,
alternating, and under `flock /tmp/locojax_bench.lock` where others share the machine:

    .venv/bin/python -m benchmarks.real_step_seconds --prompts 2 --group 4 --prompt-tokens 256 \\
        --new-tokens 128 --steps 4 --remat off
"""

from __future__ import annotations

import argparse
import resource
import time

import jax

from benchmarks.profile_train import synthetic_batch
from locojax.rl.train_step import update
from locojax.model import loader
from locojax.model import params as params_lib
from locojax.rl import train_state
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4, help="the first holds the compile")
    ap.add_argument("--remat", choices=["on", "off"], default="off")
    args = ap.parse_args(argv)
    cfg = loader.load_config(args.model)
    learner = LearnerConfig(algo=AlgoConfig(group_size=args.group, loss_agg="token-mean",
                                            eps_low=0.2, eps_high=0.2),
                            optim=OptimConfig(lr=1e-5, weight_decay=0.0),
                            remat=args.remat == "on")
    state = train_state.init(params_lib.init(cfg, jax.random.key(0)), learner.optim, cfg)
    shape = (args.prompts, args.group, args.prompt_tokens, args.new_tokens)
    batch = jax.device_put(synthetic_batch(cfg, shape))
    wall, cpu = [], []
    for _ in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        state, _ = update(state, batch, cfg, learner)
        jax.block_until_ready(state)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
    print(f"B {args.prompts} x G {args.group}, P {args.prompt_tokens} + N {args.new_tokens}, "
          f"remat {args.remat}: wall s {' '.join(f'{t:.2f}' for t in wall)}; CPU s "
          f"{' '.join(f'{t:.1f}' for t in cpu)}; peak RSS {rss:.2f} GB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
