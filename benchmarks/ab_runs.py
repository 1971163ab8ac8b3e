"""Interleaved A/B of whole `locojax train` runs across code trees (e.g. before/after a change).

A point is one run of `bench_modes.py` or `bench_placement.py` (the same argv those scripts
build); an arm is a code tree, run with its own directory as the working directory and on
PYTHONPATH (`python -m` puts the working directory first on sys.path, so the cwd decides
which tree runs; the Ray modes forward PYTHONPATH to their actors). Every round runs every
point once in every tree, the trees' order alternating, so machine load falls on all alike.
Prints, per point, each tree's median steady step time (compile excluded, first `--skip`
steps and the checkpoint step dropped) and the ratio to the first tree.

Usage:
    .venv/bin/python benchmarks/ab_runs.py --tree before=/path/to/old --tree after=. \\
        --points single-2 colocated-2 colocated-4 da-0.5 async-k2 --rounds 2
Points: single-N and colocated-N (bench_modes, TINY arith, N hosts or devices), da-F and
async-kK (bench_placement's 4 hosts, TINY arith).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path

import bench_modes  # the script's folder is on sys.path (python puts it first)
import bench_placement
import local_ray


def argv_of(point: str, run_dir: Path, steps: int, ray_address: str) -> list[str]:
    """The point's `locojax` argv, without the interpreter (each tree runs its own)."""
    kind, _, value = point.rpartition("-")
    if kind in ("single", "colocated"):
        shape = bench_modes.SHAPES["tiny"]
        argv = bench_modes.train_argv(shape, "arith", shape.arch, kind, int(value), steps, 0.0,
                                      run_dir)
    else:
        args = argparse.Namespace(workload="arith", prompts=12, group=4, new_tokens=128,
                                  steps=steps)
        p = (bench_placement.points([float(value)], []) if kind == "da"
             else bench_placement.points([], [int(value[1:])]))[1]
        argv = bench_placement.train_argv(p, args, run_dir, ray_address)
    return argv[len(bench_modes.CLI):]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--points", nargs="+", default=["single-2", "colocated-2", "da-0.5",
                                                    "async-k2"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--work-dir", default="/tmp/locojax_ab_runs")
    args = ap.parse_args(argv)
    trees = [(n, Path(d).resolve()) for n, d in (t.split("=", 1) for t in args.tree)]
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    import ray

    address = local_ray.start()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; trees "
          + ", ".join(f"{n}={d}" for n, d in trees) + f"; {args.steps} steps, steady "
          f"{args.skip + 1}..{args.steps - 1}; load before {os.getloadavg()[0]:.1f}")
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for r in range(args.rounds):
            for point in args.points:
                order = trees if r % 2 == 0 else trees[::-1]
                for name, tree in order:
                    run_dir = work / f"{point}-{name}-r{r}"
                    cli = argv_of(point, run_dir, args.steps, address)
                    cmd = [sys.executable, "-m", "locojax.cli", *cli]
                    print(f"$ (cd {tree} && PYTHONPATH={tree} {shlex.join(cmd)})", flush=True)
                    load = os.getloadavg()[0]
                    os.environ["PYTHONPATH"] = str(tree)
                    cwd = os.getcwd()
                    os.chdir(tree)
                    try:
                        code = bench_placement.run(cmd, work / f"{run_dir.name}.log",
                                                   args.timeout)
                    finally:
                        os.chdir(cwd)
                    if code:
                        print(f"# FAILED (exit {code}): {work / f'{run_dir.name}.log'}")
                        continue
                    rows = bench_placement.steady(run_dir, args.steps, args.skip)
                    t = bench_placement.med(rows, "perf/step_time")
                    times.setdefault((point, name), []).append(t)
                    print(f"# {point} {name}: {t:.4f} s/step (load {load:.1f})", flush=True)
    finally:
        ray.shutdown()
    first = trees[0][0]
    print("\n| point | " + " | ".join(f"{n} s/step (runs)" for n, _ in trees)
          + f" | {first} / other |")
    print("|---|" + "---|" * (len(trees) + 1))
    for point in args.points:
        cells, med = [], {}
        for name, _ in trees:
            runs = times.get((point, name), [])
            med[name] = statistics.median(runs) if runs else float("nan")
            cells.append(f"{med[name]:.4f} ({', '.join(f'{x:.4f}' for x in runs)})")
        ratios = ", ".join(f"{med[first] / med[n]:.3f}" for n, _ in trees[1:])
        print(f"| {point} | " + " | ".join(cells) + f" | {ratios} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
