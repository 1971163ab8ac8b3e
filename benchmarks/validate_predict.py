"""Validate `locojax predict` on this machine: predict bench_modes.py at N = 2 and 4 and
bench_placement.py at 4 hosts from the cpu-here profile calibrated at N = 1
(calibrate_predict.py), and print predicted against measured, per phase and per step.

Each prediction goes through the command's own builder (`locojax.predict.from_train`), on
the exact `train` arguments the benchmark ran: the pairing of docs/pod_scale.md. Target:
step time within 25% at every held-out point; the table marks a miss and the term to blame
(the phase with the largest absolute error).

bench_modes runs N = 1 too, in the same session as N = 2 and 4. Those points are not held
out: they are printed apart, and give a second prediction of each held-out point,
"rescaled": every phase of the prediction multiplied by measured / predicted of that phase
at N = 1 in the same session (same shape, workload and mode). It uses N = 1 runs only, and
removes what the machine's load did between the calibration session and this one.

Usage:
    .venv/bin/python benchmarks/validate_predict.py --measure        # run both benchmarks
    .venv/bin/python benchmarks/validate_predict.py                  # report from saved runs
    .venv/bin/python benchmarks/validate_predict.py --measure --shapes tiny --no-placement
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_modes  # noqa: E402
import bench_placement  # noqa: E402

from locojax.predict import from_train, modes, placement  # noqa: E402

PY = sys.executable
HERE = Path(__file__).parent
CAL = Path("/tmp/locojax_calibrate")  # calibrate_predict.py's work dir: SFT models, dumps
PHASES = ("admission", "prefill", "decode", "detokenize_reward", "batch", "train",
          "wait_rollouts")
TARGET = 0.25


def measure(args) -> None:
    out = Path(args.work_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.shapes:
        cmd = [PY, str(HERE / "bench_modes.py"), "--shapes", *args.shapes, "--workloads",
               *args.workloads, "--hosts", "1", "2", "4", "--repeats", str(args.repeats),
               "--modes", "single", "colocated", "--scaling", "strong", "--no-split",
               "--work-dir", str(CAL), "--json", str(out / "modes.json")]
        print(f"$ {shlex.join(cmd)}   # load {os.getloadavg()[0]:.2f}", flush=True)
        subprocess.run(cmd, check=False)
    if args.placement:
        cmd = [PY, str(HERE / "bench_placement.py"), "--steps", "10", "--skip", "3",
               "--repeats", "1", "--work-dir", str(out / "placement")]
        print(f"$ {shlex.join(cmd)}   # load {os.getloadavg()[0]:.2f}", flush=True)
        subprocess.run(cmd, check=False)


def train_args(argv: list[str]) -> list[str]:
    """The `train ...` part of a benchmark command (after `launch ... --`, or the CLI)."""
    i = argv.index("train")
    return argv[i + 1:]


def lengths_dir(workload: str, shape: str) -> str:
    if workload != "arith-var":
        return ""
    return str(CAL / f"{shape.lower()}-arith-var-b{bench_modes.SHAPES[shape.lower()].prompts}-c2")


def med(rows: list[dict], key: str) -> float:
    vals = [float(r[key]) for r in rows if key in r]
    return statistics.median(vals) if vals else float("nan")


def rescaled(pred, factors: dict[str, float]):
    """The prediction with each phase times its N = 1 measured / predicted factor."""
    import dataclasses

    phases = {k: v * factors.get(k, 1.0) for k, v in pred.phases.items()}
    return dataclasses.replace(pred, phases=phases)


def phase_factors(pred, measured: list[dict]) -> dict[str, float]:
    out = {}
    for k, v in pred.phases.items():
        m = med(measured, f"perf/phase/{k}")
        if v > 0 and m == m:
            out[k] = m / v
    # What no phase holds (the step's remainder) scales with the step.
    step_m = med(measured, "perf/step_time")
    rest_m = step_m - sum(med(measured, f"perf/phase/{k}") for k in out)
    rest_p = sum(v for k, v in pred.phases.items() if k not in out)
    if rest_p > 0 and rest_m > 0:
        out.update({k: rest_m / rest_p for k in pred.phases if k not in out})
    return out


def row(label: str, pred, measured: list[dict], load: float, again=None,
        again_column: bool = False) -> tuple[str, float]:
    step_m = med(measured, "perf/step_time")
    err = pred.step / step_m - 1
    again_cell = "" if not again_column else " | -" if again is None else (
        f" | {again.step:.3f} ({again.step / step_m - 1:+.0%})")
    cells = []
    worst, worst_abs = "", 0.0
    for ph in PHASES:
        m = med(measured, f"perf/phase/{ph}")
        p = pred.phases.get(ph)
        if p is None and m != m:
            continue
        cells.append(f"{ph} {0 if p is None else p:.3f}/{m:.3f}")
        if p is not None and m == m and abs(p - m) > worst_abs:
            worst, worst_abs = ph, abs(p - m)
    miss = "" if abs(err) <= TARGET else f" MISS ({worst})"
    return (f"| {label} | {pred.step:.3f} | {step_m:.3f} | {err:+.0%}{miss}{again_cell} | "
            f"{'; '.join(cells)} | {load:.2f} |"), err


def report_modes(path: Path) -> list[float]:
    results = json.loads(path.read_text())
    groups: dict[tuple, list] = {}
    for r in results:
        if r["ok"]:
            groups.setdefault((r["shape"], r["workload"], r["n"], r["mode"]), []).append(r)
    preds, factors = {}, {}
    for key, runs in groups.items():
        shape, workload, n, mode = key
        argv = shlex.split(runs[0]["command"])
        run = from_train.parse(train_args(argv), f"cpu-here-{n}",
                               lengths_from=lengths_dir(workload, shape))
        preds[key] = modes.single(run.ctx) if mode == "single" else modes.colocated(run.ctx)
        if n == 1:
            factors[(shape, workload, mode)] = phase_factors(
                preds[key], [s for r in runs for s in r["steady"]])
    head = ("| point | predicted step | measured step | error | rescaled by same-session "
            "N = 1 (error) | phases predicted/measured | load |\n|---|---|---|---|---|---|---|")
    errs = []
    for held_out in (False, True):
        print("\n## bench_modes.py: predicted / measured (s; process 0's phases, medians)"
              + (" -- held out, N = 2 and 4\n" if held_out else
                 " -- N = 1 (the calibration's kind of run, this session: not held out)\n"))
        print(head)
        for key, runs in sorted(groups.items()):
            shape, workload, n, mode = key
            if (n > 1) != held_out:
                continue
            rows = [s for r in runs for s in r["steady"]]
            f = factors.get((shape, workload, mode))
            again = rescaled(preds[key], f) if f and held_out else None
            line, err = row(f"{shape} {workload} N={n} {mode}", preds[key], rows,
                            statistics.mean(r["load_before"] for r in runs), again, True)
            print(line)
            if held_out:
                errs.append(err)
    return errs


def report_placement(work: Path) -> list[float]:
    args = argparse.Namespace(workload="arith", prompts=12, group=4, new_tokens=128, steps=10)
    print("\n## bench_placement.py (4 hosts): predicted / measured\n")
    print("| point | predicted step | measured step | error | phases predicted/measured | "
          "load |")
    print("|---|---|---|---|---|---|")
    loads = json.loads((work / "loads.json").read_text()) if (work / "loads.json").exists() else {}
    errs = []
    for p in bench_placement.points([0.25, 0.5, 0.75], [1, 2, 4]):
        run_dir = work / f"{p.name}-r0"
        if not (run_dir / "perf.jsonl").exists():
            continue
        argv = bench_placement.train_argv(p, args, run_dir, "auto")
        run = from_train.parse(train_args(argv), f"cpu-here-{bench_placement.HOSTS}")
        pl, ctx = run.cfg.placement, run.ctx
        if p.mode == "colocated":
            pred = modes.colocated(ctx)
        elif p.mode == "disaggregated":
            pred = placement.disaggregated(ctx, pl.rollout_fraction, pl.max_staleness)
        else:
            pred = placement.async_(ctx, pl.workers, pl.learner_hosts, pl.max_staleness)
        rows = bench_placement.steady(run_dir, args.steps, 3)
        line, err = row(p.name, pred, rows, loads.get(run_dir.name, float("nan")))
        print(line)
        errs.append(err)
    return errs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--shapes", nargs="*", default=["tiny", "small"])
    ap.add_argument("--workloads", nargs="+", default=["arith", "arith-var"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-placement", dest="placement", action="store_false")
    ap.add_argument("--work-dir", default="/tmp/locojax_validate")
    args = ap.parse_args()
    if args.measure:
        measure(args)
    work = Path(args.work_dir)
    errs = []
    if (work / "modes.json").exists():
        errs += report_modes(work / "modes.json")
    if (work / "placement").exists():
        errs += report_placement(work / "placement")
    if errs:
        within = sum(abs(e) <= TARGET for e in errs)
        print(f"\n{within} of {len(errs)} held-out points within {TARGET:.0%} "
              f"(mean |error| {statistics.mean(abs(e) for e in errs):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
