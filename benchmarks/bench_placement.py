"""Placement: disaggregated (DA) vs colocated step time at 4 hosts, and async throughput vs k.

Every point is a real `locojax train` run in a subprocess, exactly as a user would start it:

    colocated        locojax launch --hosts 4 -- train ... --mode colocated
    DA, fraction f   locojax train ... --mode disaggregated --hosts 4 --rollout-fraction f
                     (f x 4 rollout workers, the rest one learner group; k = 1: the rollout
                     of step s + 1 overlaps training step s)
    async, k         locojax train ... --mode async --hosts 4 --workers 3 --learner-hosts 1
                     --max-staleness k  (workers pull the newest version)

The Ray runs join one local Ray cluster this script starts (`--ray-address`), so cluster
start-up is paid once and is not in any figure. Runs are interleaved: every repeat runs
every point once, in a rotated order, so machine load falls on all points alike.

Held fixed (strong scaling): the global batch (B prompts x G samples per step), the model,
the sampling, 4 hosts of 1 device. Two workloads, both TINY (random f32 weights):
- `--workload arith` (default): --rollout.ignore-eos, so every completion is exactly
  --new-tokens long, much longer than the prompt; on XLA:CPU this stays train-dominated;
- `--workload swe`: multi-turn (`train swe`, level-1 repositories), 2 model turns around an
  error observation, then a sandboxed test run for every row: rollout-heavy through its env
  phase (the test runs), which DA moves off the learner hosts.
Training is one AdamW step on those rows.

Timing: the learner host 0's `perf/step_time` (compile excluded): for DA and async that is
the wall time between updates, waiting for rollouts included. Medians over steady steps
(the first --skip steps and the last, checkpoint, step dropped). Trained samples/s = B x G /
step time.

**On a machine with fewer cores than hosts the simulated hosts share the cores.** Then DA
cannot win by parallel hardware: its rollout workers and learner compete for the same CPUs,
so overlapping them only fills the time one of them would leave a core idle (Python,
gloo waits, small kernels that do not use both cores). Colocated's 4 processes share the
cores the same way. The script prints the machine's CPU count and load so the tables are
read with that in mind.

Usage:
    .venv/bin/python -m benchmarks.bench_placement --quick        # 1 repeat, few steps
    .venv/bin/python -m benchmarks.bench_placement --repeats 2
    .venv/bin/python -m benchmarks.bench_placement --workload swe --steps 6 --skip 2
    .venv/bin/python -m benchmarks.bench_placement --report-only  # the tables again, from the
                                                                  # runs in --work-dir
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path


from benchmarks import harness
from benchmarks.harness import med
from benchmarks.workloads import HOSTS, Point, placement_argv, placement_points

# Colocated's rollout phases (what DA moves to its workers); swe adds extend and env.
ROLLOUT_PHASES = ("admission", "prefill", "decode", "extend", "env", "detokenize_reward")



def workload_line(args) -> str:
    if args.workload == "swe":
        return (f"swe level 1 (2 turns of <= {args.new_tokens} tokens, then a sandboxed test "
                f"run per row: {args.prompts * args.group} per step)")
    return f"arith level 3, exactly {args.new_tokens} new tokens, 16 prompt columns"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=("arith", "swe"), default="arith",
                    help="arith: exactly --new-tokens per completion; swe: multi-turn, 2 turns "
                    "of at most --new-tokens around an error observation, then a sandboxed test "
                    "run per row (host-heavy: its env phase dominates)")
    ap.add_argument("--fractions", nargs="*", type=float, default=[0.25, 0.5, 0.75],
                    help="DA's rollout fractions (none: no DA point)")
    ap.add_argument("--ks", nargs="*", type=int, default=[1, 2, 4],
                    help="async's max staleness (none: no async point)")
    ap.add_argument("--prompts", type=int, default=12, help="B (splits over 1-4 hosts)")
    ap.add_argument("--group", type=int, default=4, help="G")
    ap.add_argument("--new-tokens", type=int, default=None,
                    help="arith: exact completion length (default 128); swe: tokens per turn "
                    "(default 32)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--rotate", type=int, default=0,
                    help="start the point order this many places later (a second invocation "
                    "with another rotation interleaves differently)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--work-dir", default="/tmp/locojax_bench_placement")
    ap.add_argument("--quick", action="store_true", help="--steps 6 --skip 2, one repeat")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: print the tables from the finished runs in --work-dir "
                    "(same --steps/--skip/--prompts/--group as the run)")
    args = ap.parse_args(argv)
    if args.new_tokens is None:
        args.new_tokens = 32 if args.workload == "swe" else 128
    if args.quick:
        args.steps, args.skip, args.repeats = 6, 2, 1
    if args.steps < args.skip + 2:
        ap.error("--steps must leave a steady step after --skip and before the last step")
    work = Path(args.work_dir)
    pts = placement_points(args.fractions, args.ks)
    if args.report_only:
        results, loads = collect(work, pts, args)
    else:
        results, loads = measure(work, pts, args)
    report(results, loads, args)
    return 0


def collect(work: Path, pts: list[Point], args) -> tuple[dict, dict]:
    """The steady rows and start loads of every finished run in `work`."""
    loads_file = work / "loads.json"
    saved = json.loads(loads_file.read_text()) if loads_file.exists() else {}
    results: dict[str, list[dict]] = {p.name: [] for p in pts}
    loads: dict[str, list[float]] = {p.name: [] for p in pts}
    for p in pts:
        for run_dir in sorted(work.glob(f"{p.name}-r*")):
            if run_dir.is_dir() and (run_dir / "final_model").exists():
                results[p.name] += harness.steady_rows(run_dir, args.steps, args.skip)
                if run_dir.name in saved:
                    loads[p.name].append(saved[run_dir.name])
    per_run = args.steps - args.skip - 1
    print(f"# report from {work}: runs per point "
          + ", ".join(f"{k} x{len(v) // per_run}" for k, v in results.items()))
    return results, loads


def measure(work: Path, pts: list[Point], args) -> tuple[dict, dict]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    harness.share_jax_cache(work)
    results: dict[str, list[dict]] = {p.name: [] for p in pts}
    loads: dict[str, list[float]] = {p.name: [] for p in pts}
    by_run: dict[str, float] = {}
    with harness.local_ray() as address:
        print(harness.header("bench_placement"))
        print(f"# {os.cpu_count()} CPUs, {HOSTS} simulated hosts of 1 device: "
              f"{'the hosts share the cores' if os.cpu_count() < HOSTS else 'a core per host'}")
        print(f"# held fixed: B={args.prompts} prompts x G={args.group}, TINY random f32, "
              f"{workload_line(args)}, {args.steps} steps, "
              f"steady = steps {args.skip + 1}..{args.steps - 1}")
        print(f"# load average before: {harness.load():.1f}")
        for rep in range(args.repeats):
            for p in harness.rotated(pts, rep + args.rotate):
                run_dir = work / f"{p.name}-r{rep}"
                argv = placement_argv(p, args, run_dir, address)
                print(f"$ {shlex.join(argv)}", flush=True)
                loads[p.name].append(harness.load())
                by_run[run_dir.name] = loads[p.name][-1]
                (work / "loads.json").write_text(json.dumps(by_run))
                t = time.perf_counter()
                code, _ = harness.run_logged(argv, work / f"{p.name}-r{rep}.log", args.timeout)
                if code:
                    print(f"# FAILED (exit {code}); see {work / f'{p.name}-r{rep}.log'}")
                    continue
                rows = harness.steady_rows(run_dir, args.steps, args.skip)
                results[p.name] += rows
                print(f"# {med(rows, 'perf/step_time'):.3f} s/step, wall "
                      f"{time.perf_counter() - t:.0f}s, load {loads[p.name][-1]:.1f}", flush=True)
    return results, loads


def report(results: dict, loads: dict, args) -> None:
    rows_per_step = args.prompts * args.group
    colo = med(results["colocated"], "perf/step_time")

    def line(name: str, label: str = "") -> list[str]:
        r = results[name]
        st = med(r, "perf/step_time")
        return [f"{name}{label}", f"{st:.3f}", f"{colo / st:.2f}", f"{rows_per_step / st:.1f}",
                f"{med(r, 'perf/phase/wait_rollouts'):.3f}", f"{med(r, 'perf/phase/train'):.3f}",
                f"{med(r, 'perf/rollout/step_time'):.3f}", f"{med(r, 'perf/sync/seconds'):.4f}",
                f"{statistics.mean(loads[name]) if loads[name] else float('nan'):.1f}"]

    head = ["point", "s/step", "colocated / point", "trained samples/s", "wait rollouts",
            "train", "rollout unit (worker)", "weight sync", "load avg"]
    print(f"\n## DA vs colocated at {HOSTS} hosts (median s/step; > 1 in column 3: DA faster)\n")
    workers = {f: int(f * HOSTS + 0.5) for f in args.fractions}
    print("\n".join(harness.table(head, [line("colocated"), *(
        line(f"da-{f:g}", f" ({workers[f]} worker{'s' if workers[f] > 1 else ''})")
        for f in args.fractions)])))
    # What a core per host would give: colocated's measured phases, rescaled by the share of
    # hosts each side gets (perfect strong scaling assumed), overlapped as DA overlaps them.
    c = results["colocated"]
    roll = sum(med(c, f"perf/phase/{k}") for k in ROLLOUT_PHASES
               if any(f"perf/phase/{k}" in r for r in c))
    train = med(c, "perf/phase/train") + med(c, "perf/phase/batch")
    # A second model: decode time that does not shrink with fewer rows per host (memory-bound
    # decode on an accelerator), the rest of the rollout scaling as above. Under the first
    # model DA can at best tie (max(R/f, T/(1-f)) >= R + T, equal at f = R/(R+T)); it wins
    # only where rollout does not strong-scale, which the second model is an instance of.
    dec = med(c, "perf/phase/decode")
    print(f"\n# model, not a measurement: with a core per host DA's step would be about "
          f"max(R/f, T/(1-f)) from colocated's rollout R = {roll:.3f} s (decode {dec:.3f} s) "
          f"and train T = {train:.3f} s at {HOSTS} hosts (perfect strong scaling); with "
          f"decode that does not scale (memory-bound), max(D + (R-D)/f, T/(1-f)):")
    for f in args.fractions:
        ideal = max(roll / f, train / (1 - f))
        flat = max(dec + (roll - dec) / f, train / (1 - f))
        print(f"#   f={f:g}: {ideal:.3f} s, colocated / DA = {(roll + train) / ideal:.2f}; "
              f"flat decode {flat:.3f} s, {(roll + train) / flat:.2f} "
              f"(measured here on {os.cpu_count()} shared cores: "
              f"{colo / med(results[f'da-{f:g}'], 'perf/step_time'):.2f})")
    if args.fractions:
        best = min((f"da-{f:g}" for f in args.fractions),
                   key=lambda n: med(results[n], "perf/step_time"))
        ratio = colo / med(results[best], "perf/step_time")
        print(f"\n# best DA point: {best}, {'faster' if ratio > 1 else 'slower'} than colocated "
              f"by {abs(ratio - 1) * 100:.0f}% (colocated / DA = {ratio:.2f})")
    if not args.ks:
        return
    print(f"\n## async throughput vs max staleness k ({HOSTS - 1} workers, 1 learner host)\n")
    print("\n".join(harness.table(head, [line(f"async-k{k}") for k in args.ks])))


if __name__ == "__main__":
    sys.exit(main())
