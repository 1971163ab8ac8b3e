"""Interleaved A/B of whole `locojax train` runs across code trees (e.g. before/after a change).

A point is one run of `bench_modes.py` or `bench_placement.py` (the same argv those scripts
build); an arm is a code tree, run with its own directory as the working directory and on
PYTHONPATH (`python -m` puts the working directory first on sys.path, so the cwd decides
which tree runs; the Ray modes forward PYTHONPATH to their actors). Every round runs every
point once in every tree, the trees' order alternating, so machine load falls on all alike.
Prints, per point, each tree's median steady step time (compile excluded, first `--skip`
steps and the checkpoint step dropped) and the ratio to the first tree.

Usage:
    .venv/bin/python -m benchmarks.ab_runs --tree before=/path/to/old --tree after=. \\
        --points single-2 colocated-2 colocated-4 da-0.5 async-k2 --rounds 2
Points: single-N and colocated-N (bench_modes, TINY arith, N hosts or devices; `@small`
after either runs SMALL's shape), da-F and async-kK (bench_placement's 4 hosts, TINY arith).

Two arms may be one tree run two ways: `--launch-flag NAME=FLAG` adds FLAG to `locojax
launch` in that arm's colocated points, e.g. hosts pinned or not:
    .venv/bin/python -m benchmarks.ab_runs --tree unpinned=. --tree pinned=. \
        --launch-flag pinned=--pin-cpus --points colocated-2 --rounds 4
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path


from benchmarks import harness
from benchmarks.workloads import CLI, SHAPES, placement_argv, placement_points, train_argv


def argv_of(point: str, run_dir: Path, steps: int, ray_address: str,
            launch_flags: tuple[str, ...] = ()) -> list[str]:
    """The point's `locojax` argv, without the interpreter (each tree runs its own);
    `launch_flags` go to `locojax launch` (colocated points)."""
    point, _, shape_name = point.partition("@")
    kind, _, value = point.rpartition("-")
    if kind in ("single", "colocated"):
        shape = SHAPES[shape_name or "tiny"]
        argv = train_argv(shape, "arith", shape.arch, kind, int(value), steps, 0.0, run_dir)
        if kind == "colocated":
            at = argv.index("launch") + 1
            argv = [*argv[:at], *launch_flags, *argv[at:]]
    else:
        args = argparse.Namespace(workload="arith", prompts=12, group=4, new_tokens=128,
                                  steps=steps)
        p = (placement_points([float(value)], []) if kind == "da"
             else placement_points([], [int(value[1:])]))[1]
        argv = placement_argv(p, args, run_dir, ray_address)
    return argv[len(CLI):]


def run_in_tree(tree: Path, cmd: list[str], log: Path, timeout: float) -> int:
    """Run cmd with `tree` as the working directory and on PYTHONPATH: `python -m` puts the
    working directory first on sys.path, so the cwd decides which tree runs."""
    os.environ["PYTHONPATH"] = str(tree)
    cwd = os.getcwd()
    os.chdir(tree)
    try:
        return harness.run_logged(cmd, log, timeout)[0]
    finally:
        os.chdir(cwd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--launch-flag", action="append", default=[],
                    help="NAME=FLAG: FLAG to `locojax launch` in arm NAME's colocated points")
    ap.add_argument("--points", nargs="+", default=["single-2", "colocated-2", "da-0.5",
                                                    "async-k2"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--work-dir", default="/tmp/locojax_ab_runs")
    args = ap.parse_args(argv)
    trees = [(n, Path(d).resolve()) for n, d in (t.split("=", 1) for t in args.tree)]
    if len({n for n, _ in trees}) < len(trees):
        ap.error("each --tree needs its own NAME")
    flags: dict[str, tuple[str, ...]] = {}
    for item in args.launch_flag:
        name, _, flag = item.partition("=")
        if name not in {n for n, _ in trees} or not flag:
            ap.error(f"--launch-flag {item!r}: NAME=FLAG with NAME one of the --tree names")
        flags[name] = (*flags.get(name, ()), flag)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    times: dict[tuple[str, str], list[float]] = {}
    # a Ray cluster only for the DA and async points: single and colocated runs never join one
    needs_ray = any(not p.startswith(("single-", "colocated-")) for p in args.points)
    with harness.local_ray() if needs_ray else contextlib.nullcontext("") as address:
        print(harness.header("ab_runs"))
        print("# trees " + ", ".join(f"{n}={d}{''.join(' ' + f for f in flags.get(n, ()))}"
                                     for n, d in trees) + f"; {args.steps} steps, "
              f"steady {args.skip + 1}..{args.steps - 1}; load before {harness.load():.1f}")
        for r in range(args.rounds):
            for point in args.points:
                for name, tree in harness.order(trees, r, "alternate"):
                    run_dir = work / f"{point}-{name}-r{r}"
                    cmd = [sys.executable, "-m", "locojax.cli",
                           *argv_of(point, run_dir, args.steps, address,
                                    flags.get(name, ()))]
                    print(f"$ (cd {tree} && PYTHONPATH={tree} {shlex.join(cmd)})", flush=True)
                    load = harness.load()
                    log = work / f"{run_dir.name}.log"
                    if code := run_in_tree(tree, cmd, log, args.timeout):
                        print(f"# FAILED (exit {code}): {log}")
                        continue
                    rows = harness.steady_rows(run_dir, args.steps, args.skip)
                    t = harness.med(rows, "perf/step_time")
                    times.setdefault((point, name), []).append(t)
                    print(f"# {point} {name}: {t:.4f} s/step (load {load:.1f})", flush=True)
    print("\n".join(report(times, [n for n, _ in trees], args.points)))
    return 0


def report(times: dict[tuple[str, str], list[float]], trees: list[str],
           points: list[str]) -> list[str]:
    """Per point, each tree's median (and its runs) and the first tree's over each other's."""
    first, rows = trees[0], []
    for point in points:
        runs = {name: times.get((point, name), []) for name in trees}
        med = {name: harness.median(runs[name]) for name in trees}
        rows.append([point, *(f"{med[n]:.4f} ({', '.join(f'{x:.4f}' for x in runs[n])})"
                              for n in trees),
                     ", ".join(f"{med[first] / med[n]:.3f}" for n in trees[1:])])
    return ["", *harness.table(["point", *(f"{n} s/step (runs)" for n in trees),
                                f"{first} / other"], rows)]


if __name__ == "__main__":
    sys.exit(main())
