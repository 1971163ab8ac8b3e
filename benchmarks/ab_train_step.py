"""Interleaved A/B of the GRPO train step: the same step under several arms, in one run.

An arm is a name, a code tree (PYTHONPATH: e.g. a checkout of another commit) and extra
environment (e.g. XLA_FLAGS). Each arm is one long-lived process that builds docs/design.md's
TINY or SMALL synthetic batch (`profile_train.synthetic_batch`: every token real, shared
prompts per group) and compiles `train_step`; then the arms take turns, `--block` steps each
per round for `--rounds` rounds, so load drifts hit every arm alike. Prints each arm's median
(device-synchronised) step time and its ratio to the first arm.

Usage:
    .venv/bin/python benchmarks/ab_train_step.py --shape tiny \\
        --arm base= --arm onednn=XLA_FLAGS=--xla_cpu_use_onednn=true
    .venv/bin/python benchmarks/ab_train_step.py --shape small \\
        --arm new= --arm old=@/path/to/old/tree
An arm spec is NAME=[@CODE_DIR][;VAR=VALUE...] (no @: this tree). AB_GRAD_ACCUM=k in an
arm's environment sets its `LearnerConfig.grad_accum` (unset: the default), e.g.
    .venv/bin/python benchmarks/ab_train_step.py --shape small \\
        --arm auto= --arm k1=AB_GRAD_ACCUM=1 --arm k16=AB_GRAD_ACCUM=16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(shape: str, beta: float) -> int:
    sys.path.insert(0, str(HERE))
    import jax
    from profile_train import SHAPES, synthetic_setup

    from locojax.rl.train_step import train_step

    accum = os.environ.get("AB_GRAD_ACCUM")
    accum = {"grad_accum": int(accum)} if accum else {}
    state, batch, ref, cfg, lcfg = synthetic_setup(shape, SHAPES[shape], beta, **accum)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    for _ in range(2):  # compile, then one warm step
        state, _ = train_step(state, batch, ref, model_cfg=cfg, cfg=lcfg)
        jax.block_until_ready(state)
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            t0 = time.perf_counter()
            state, _ = train_step(state, batch, ref, model_cfg=cfg, cfg=lcfg)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - t0)
        out.write(json.dumps({"times": times}) + "\n")
    return 0


def parse_arm(spec: str):
    name, _, rest = spec.partition("=")
    code, env = str(HERE.parent), {}
    for part in filter(None, rest.split(";")):
        if part.startswith("@"):
            code = part[1:]
        else:
            k, _, v = part.partition("=")
            env[k] = v
    return name, code, env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=["tiny", "small"], default="tiny")
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--arm", action="append", required=True, help="NAME=[@CODE][;VAR=VALUE]")
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.shape, args.beta)
    arms = [parse_arm(a) for a in args.arm]
    print("command: " + " ".join(sys.argv) + "\nload average at start %.2f %.2f %.2f"
          % os.getloadavg(), flush=True)
    procs = {}
    for name, code, env in arms:
        e = dict(os.environ, PYTHONPATH=code, **env)
        procs[name] = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", "--shape", args.shape,
             "--beta", str(args.beta), "--arm", name], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=e)
    for name, p in procs.items():  # compiles run concurrently: not timed
        json.loads(p.stdout.readline())
    times = {name: [] for name in procs}
    names = list(procs)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            p = procs[name]
            p.stdin.write(f"{args.block}\n")
            p.stdin.flush()
            times[name] += json.loads(p.stdout.readline())["times"]
    for p in procs.values():
        p.stdin.close()
        p.wait()
    base = statistics.median(times[names[0]])
    for (name, code, env) in arms:
        m = statistics.median(times[name])
        print(f"{name:>12}: median {m:.4f} s over {len(times[name])} steps, "
              f"{base / m:.2f}x vs {names[0]}  ({code}; {env})")
    print("load average at end %.2f %.2f %.2f" % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
