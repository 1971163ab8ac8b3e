"""Interleaved A/B of the GRPO train step: the same step under several arms, in one run.

An arm is a name, a code tree (PYTHONPATH: e.g. a checkout of another commit) and extra
environment (e.g. XLA_FLAGS). Each arm is one long-lived process that builds docs/design.md's
TINY or SMALL synthetic batch (`profile_train.synthetic_batch`: every token real, shared
prompts per group) and compiles the step as a run takes it (`train_step.update`: the checks,
at β > 0 the reference logprobs wherever that tree computes them, the step, the metrics
fetched to the host); then the arms take turns, `--block` steps each
per round for `--rounds` rounds, so load drifts hit every arm alike. Prints each arm's median
(device-synchronised) step time and its ratio to the first arm.

Usage:
    .venv/bin/python -m benchmarks.ab_train_step --shape tiny \\
        --arm base= --arm onednn=XLA_FLAGS=--xla_cpu_use_onednn=true
    .venv/bin/python -m benchmarks.ab_train_step --shape small \\
        --arm new= --arm old=@/path/to/old/tree
An arm spec is NAME=[@CODE_DIR][;VAR=VALUE...] (no @: this tree). AB_GRAD_ACCUM=k in an
arm's environment sets its `LearnerConfig.grad_accum` (unset: the default), e.g.
    .venv/bin/python -m benchmarks.ab_train_step --shape small \\
        --arm auto= --arm k1=AB_GRAD_ACCUM=1 --arm k16=AB_GRAD_ACCUM=16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


from benchmarks import harness


def worker(shape: str, beta: float) -> int:
    import jax

    from benchmarks.profile_train import SHAPES, synthetic_setup
    from locojax.rl.train_step import update

    accum = os.environ.get("AB_GRAD_ACCUM")
    accum = {"grad_accum": int(accum)} if accum else {}
    state, batch, ref, cfg, lcfg = synthetic_setup(shape, SHAPES[shape], beta, **accum)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    for _ in range(2):  # compile, then one warm step
        state, _ = update(state, batch, cfg, lcfg, ref)
        jax.block_until_ready(state)
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            t0 = time.perf_counter()
            state, _ = update(state, batch, cfg, lcfg, ref)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - t0)
        out.write(json.dumps({"times": times}) + "\n")
    return 0


def parse_arm(spec: str):
    name, _, rest = spec.partition("=")
    code, env = str(harness.ROOT), {}
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
    print(harness.command_line() + "\n" + harness.header("ab_train_step"), flush=True)
    procs = {name: start_worker(name, code, env, args) for name, code, env in arms}
    for name, p in procs.items():  # compiles run concurrently: not timed
        json.loads(p.stdout.readline())

    def block(p: subprocess.Popen):
        def run() -> list[float]:
            p.stdin.write(f"{args.block}\n")
            p.stdin.flush()
            return json.loads(p.stdout.readline())["times"]
        return run

    runs = harness.interleave({name: block(p) for name, p in procs.items()}, args.rounds,
                              "rotate")
    for p in procs.values():
        p.stdin.close()
        p.wait()
    times = {name: [t for r in rs for t in r] for name, rs in runs.items()}
    first = arms[0][0]
    base = harness.median(times[first])
    for (name, code, env) in arms:
        m = harness.median(times[name])
        print(f"{name:>12}: median {m:.4f} s over {len(times[name])} steps, "
              f"{base / m:.2f}x vs {first}  ({code}; {env})")
    print(f"load average at end {harness.loads()}")
    return 0


def start_worker(name: str, code: str, env: dict, args) -> subprocess.Popen:
    """One arm's worker: `-P -m`, so that nothing is put before PYTHONPATH, whose first entry
    is the arm's tree (its locojax; its benchmarks too where it has the package) and whose
    second is this tree (for `benchmarks.profile_train` in a tree without it)."""
    path = os.pathsep.join([code, str(harness.ROOT)])
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "benchmarks.ab_train_step", "--worker", "--shape",
         args.shape, "--beta", str(args.beta), "--arm", name], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, PYTHONPATH=path, **env))


if __name__ == "__main__":
    sys.exit(main())
