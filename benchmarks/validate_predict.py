"""Validate `locojax predict` on this machine: predict bench_modes.py and bench_placement.py
at N = 2 and 4 from the cpu-here profile calibrated at N = 1 (calibrate_predict.py), and
print predicted against measured, per phase and per step.

What is measured (`--measure`), each benchmark as it runs by default unless said:
- bench_modes.py, strong scaling, one repeat, N = 2 and 4 (`--hosts`), its three modes
  (single, colocated, controller) on its three workloads (gsm8k, math, swe) and, with
  `--workloads ... arith arith-var`, its legacy TINY arith shapes;
- bench_placement.py at 4 hosts on both its workloads (arith, swe): colocated, DA at
  rollout fraction 0.5 and async with k = 2 (`--fractions`, `--ks`), 6 steps of which 2
  warm up: the other fractions and k run the same code with other counts, left out to
  keep calibration + validation near 40 minutes. Its DA and async points are simulated as
  the 6-step runs they are, not as a long run's steady state (`placement.Window`): in a
  short run the last steps' rollouts may all be in early.

Each prediction goes through the command's own builder (`locojax.commands.predict_train`), on
the exact `train` arguments the benchmark ran: the pairing of docs/pod_scale.md. Target:
step time within 25% at every held-out point; the table marks a miss and the term to blame
(the phase with the largest absolute error).

Measured phases are process 0's (`perf/phase/*`, medians over the steady steps), with the
split train step (`--profile-split`, bench_modes' default) read as the model's terms:
train = train_compute + train_wait, allreduce = train_collective. In controller mode the
data path is the controller's (`perf/controller/phase/*`): its decode phase waits for the
hosts' generate calls, which queue behind the hosts' previous train step, so the measured
`generate` is the controller's prefill (dispatch) + decode less host 0's train phases and
metrics, compared with the model's prefill + decode + dispatch + dispatch_latency + gather.

With `--hosts 1 2 4`, the N = 1 runs (not held out) are printed apart and give a second
prediction of each held-out point, "rescaled": every phase of the prediction multiplied by
measured / predicted of that phase at N = 1 in the same session (same shape, workload and
mode). It uses N = 1 runs only, and removes what the machine's load did between the
calibration session and this one.

Usage:
    .venv/bin/python -m benchmarks.validate_predict --measure        # run both benchmarks
    .venv/bin/python -m benchmarks.validate_predict                  # report from saved runs
    .venv/bin/python -m benchmarks.validate_predict --measure --workloads gsm8k --no-placement
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path


from benchmarks import harness
from benchmarks import workloads
from benchmarks.harness import med
from locojax.commands import predict_train
from locojax.predict import modes, placement

PY = sys.executable
HERE = Path(__file__).parent
CAL = Path("/tmp/locojax_calibrate")  # calibrate_predict.py's work dir: SFT models, dumps
PHASES = ("admission", "prefill", "decode", "generate", "extend", "env", "detokenize_reward",
          "batch", "scatter", "train", "allreduce", "wait_rollouts")
GENERATE = ("prefill", "decode", "dispatch", "dispatch_latency", "gather")  # controller
TARGET = 0.25
PLACEMENT_SKIP = 2  # bench_placement's warm-up steps here; its steady steps are 3..steps-1


def measure(args) -> None:
    out = Path(args.work_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.workloads:
        cmd = [PY, str(HERE / "bench_modes.py"), "--workloads", *args.workloads,
               "--shapes", *args.shapes, "--hosts", *map(str, args.hosts), "--repeats", "1",
               "--modes", *args.modes, "--scaling", "strong", "--work-dir", str(CAL),
               "--json", str(out / "modes.json")]
        print(f"$ {shlex.join(cmd)}   # load {harness.load():.2f}", flush=True)
        subprocess.run(cmd, check=False)
    for workload in args.placement:
        cmd = [PY, str(HERE / "bench_placement.py"), "--workload", workload, "--fractions",
               *map(str, args.fractions), "--ks", *map(str, args.ks), "--steps",
               str(args.placement_steps), "--skip", str(PLACEMENT_SKIP), "--repeats", "1",
               "--work-dir",
               str(out / f"placement-{workload}")]
        print(f"$ {shlex.join(cmd)}   # load {harness.load():.2f}", flush=True)
        subprocess.run(cmd, check=False)


def train_args(argv: list[str]) -> list[str]:
    """The `train ...` part of a benchmark command (after `launch ... --`, or the CLI)."""
    i = argv.index("train")
    return argv[i + 1:]


def lengths_dir(workload: str, shape: str) -> str:
    if workload != "arith-var":
        return ""
    return str(CAL / f"{shape.lower()}-arith-var-b{workloads.SHAPES[shape.lower()].prompts}-c2")


def measured_terms(rows: list[dict], mode: str) -> dict[str, float]:
    """The model's terms, measured: medians of process 0's phases (module docstring)."""
    def phases(prefix: str) -> dict[str, float]:
        keys = {k[len(prefix):] for r in rows for k in r if k.startswith(prefix)}
        return {k: med(rows, prefix + k) for k in keys if "/" not in k[len(prefix):]}

    m = phases("perf/phase/")
    if "train_compute" in m:
        m["train"] = m.pop("train_compute") + m.pop("train_wait", 0.0)
        m["allreduce"] = m.pop("train_collective", 0.0)
    if any("perf/sync/seconds" in r for r in rows):
        m["weight_sync"] = med(rows, "perf/sync/seconds")
    if mode == "controller":
        c = phases("perf/controller/phase/")
        hosts_train = m.get("train", 0.0) + m.get("allreduce", 0.0) + m.get("metrics", 0.0)
        m["generate"] = (c.pop("prefill", 0.0) + c.pop("decode", 0.0) + c.pop("extend", 0.0)
                         - hosts_train)
        m.update(c)
    return m


def predicted_terms(pred) -> dict[str, float]:
    """The prediction's phases, the controller's generate summed as it is measured."""
    p = dict(pred.phases)
    if pred.mode == "controller":
        p["generate"] = sum(p.pop(k, 0.0) for k in (*GENERATE, "extend"))
    return p


def rescaled_step(p: dict[str, float], p_step: float, factors: dict[str, float]) -> float:
    """The predicted step with each term times its N = 1 measured / predicted factor (the
    remainder, what no listed term holds, by the remainder's factor)."""
    listed = sum(p.get(k, 0.0) for k in PHASES)
    return (sum(v * factors.get(k, 1.0) for k, v in p.items() if k in PHASES)
            + (p_step - listed) * factors.get("rest", 1.0))


def term_factors(p: dict[str, float], p_step: float, m: dict[str, float],
                 m_step: float) -> dict[str, float]:
    out = {k: m[k] / v for k, v in p.items() if k in PHASES and v > 0 and m.get(k, 0) > 0}
    rest_p = p_step - sum(p.get(k, 0.0) for k in PHASES)
    rest_m = m_step - sum(m.get(k, 0.0) for k in PHASES if k in p)
    if rest_p > 0 and rest_m > 0:
        out["rest"] = rest_m / rest_p
    return out


def row(label: str, p_step: float, p: dict[str, float], m_step: float, m: dict[str, float],
        load: float, again: float | None = None, again_column: bool = False) -> tuple[str, float]:
    """One table row: step predicted / measured, the error, and each term predicted/measured
    (`rest`: the step less the listed terms: the model's other/collectives, the run's
    metrics, profiler and unphased time)."""
    err = p_step / m_step - 1
    again_cell = "" if not again_column else " | -" if again is None else (
        f" | {again:.3f} ({again / m_step - 1:+.0%})")
    cells, worst, worst_abs = [], "", 0.0
    for ph in PHASES:
        if ph not in p and ph not in m:
            continue
        pv, mv = p.get(ph, 0.0), m.get(ph, float("nan"))
        if pv == 0 and mv != mv:
            continue
        cells.append(f"{ph} {pv:.3f}/{mv:.3f}")
        if mv == mv and abs(pv - mv) > worst_abs:
            worst, worst_abs = ph, abs(pv - mv)
    rest_p = p_step - sum(p.get(k, 0.0) for k in PHASES)
    rest_m = m_step - sum(m.get(k, 0.0) for k in PHASES if k in m)
    cells.append(f"rest {rest_p:.3f}/{rest_m:.3f}")
    if abs(rest_p - rest_m) > worst_abs:
        worst = "rest"
    miss = "" if abs(err) <= TARGET else f" MISS ({worst})"
    return (f"| {label} | {p_step:.3f} | {m_step:.3f} | {err:+.0%}{miss}{again_cell} | "
            f"{'; '.join(cells)} | {load:.2f} |"), err


def predict_mode(run, mode: str):
    if mode == "single":
        return modes.single(run.ctx)
    if mode == "controller":
        return modes.controller(run.ctx, int(run.cfg.controller.decode_chunk))
    return modes.colocated(run.ctx)


def report_modes(path: Path) -> list[float]:
    results = json.loads(path.read_text())
    groups: dict[tuple, list] = {}
    for r in results:
        if r["ok"]:
            groups.setdefault((r["shape"], r["workload"], r["n"], r["mode"]), []).append(r)
    terms, factors = {}, {}
    for key, runs in groups.items():
        shape, workload, n, mode = key
        argv = shlex.split(runs[0]["command"])
        run = predict_train.parse(train_args(argv), f"cpu-here-{n}",
                               lengths_from=lengths_dir(workload, shape))
        pred = predict_mode(run, mode)
        rows = [s for r in runs for s in r["steady"]]
        terms[key] = (pred.step, predicted_terms(pred), med(rows, "perf/step_time"),
                      measured_terms(rows, mode))
        if n == 1:
            p_step, p, m_step, m = terms[key]
            factors[(shape, workload, mode)] = term_factors(p, p_step, m, m_step)
    head = ("| point | predicted step | measured step | error | rescaled by same-session "
            "N = 1 (error) | terms predicted/measured | load |\n|---|---|---|---|---|---|---|")
    errs = []
    for held_out in (False, True):
        if not any((k[2] > 1) == held_out for k in groups):
            continue
        print("\n## bench_modes.py: predicted / measured (s; process 0's phases, medians)"
              + (" -- held out, N = 2 and 4\n" if held_out else
                 " -- N = 1 (the calibration's kind of run, this session: not held out)\n"))
        print(head)
        for key, runs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
            shape, workload, n, mode = key
            if (n > 1) != held_out:
                continue
            p_step, p, m_step, m = terms[key]
            f = factors.get((shape, workload, mode))
            again = rescaled_step(p, p_step, f) if f and held_out else None
            label = f"{workload}{'' if workload in workloads.PAPER else ' ' + shape} N={n} {mode}"
            line, err = row(label, p_step, p, m_step, m,
                            statistics.mean(r["load_before"] for r in runs), again, True)
            print(line)
            if held_out:
                errs.append(err)
    return errs


def report_placement(work: Path, workload: str, steps: int) -> list[float]:
    new_tokens = 32 if workload == "swe" else 128
    args = argparse.Namespace(workload=workload, prompts=12, group=4, new_tokens=new_tokens,
                              steps=steps)
    print(f"\n## bench_placement.py --workload {workload} (4 hosts): predicted / measured\n")
    print("| point | predicted step | measured step | error | terms predicted/measured | "
          "load |")
    print("|---|---|---|---|---|---|")
    loads = json.loads((work / "loads.json").read_text()) if (work / "loads.json").exists() else {}
    errs = []
    for p in workloads.placement_points([0.25, 0.5, 0.75], [1, 2, 4]):
        run_dir = work / f"{p.name}-r0"
        if not (run_dir / "perf.jsonl").exists():
            continue
        argv = workloads.placement_argv(p, args, run_dir, "auto")
        run = predict_train.parse(train_args(argv), f"cpu-here-{workloads.HOSTS}")
        pl, ctx = run.cfg.placement, run.ctx
        window = placement.Window(steps, PLACEMENT_SKIP)  # the run made, end included
        if p.mode == "colocated":
            pred = modes.colocated(ctx)
        elif p.mode == "disaggregated":
            pred = placement.disaggregated(ctx, pl.rollout_fraction, pl.max_staleness,
                                           window=window)
        else:
            pred = placement.async_(ctx, pl.workers, pl.learner_hosts, pl.max_staleness,
                                    window=window)
        rows = harness.steady_rows(run_dir, steps, PLACEMENT_SKIP)
        line, err = row(p.name, pred.step, predicted_terms(pred), med(rows, "perf/step_time"),
                        measured_terms(rows, p.mode), loads.get(run_dir.name, float("nan")))
        print(line)
        errs.append(err)
    return errs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--workloads", nargs="*", default=["gsm8k", "math", "swe"],
                    choices=workloads.WORKLOADS, help="bench_modes' (none: skip it)")
    ap.add_argument("--shapes", nargs="+", default=["tiny"], help="arith, arith-var only")
    ap.add_argument("--modes", nargs="+", default=list(workloads.MODES))
    ap.add_argument("--hosts", nargs="+", type=int, default=[2, 4],
                    help="bench_modes' N (add 1 for the rescaled column)")
    ap.add_argument("--placement", nargs="*", default=["swe", "arith"],
                    help="bench_placement's workloads (none: skip it)")
    ap.add_argument("--fractions", nargs="+", type=float, default=[0.5])
    ap.add_argument("--ks", nargs="+", type=int, default=[2])
    ap.add_argument("--placement-steps", type=int, default=6)
    ap.add_argument("--work-dir", default="/tmp/locojax_validate")
    args = ap.parse_args()
    if args.measure:
        measure(args)
    work = Path(args.work_dir)
    errs = []
    if (work / "modes.json").exists():
        errs += report_modes(work / "modes.json")
    for workload in ("arith", "swe"):
        if (work / f"placement-{workload}").exists():
            errs += report_placement(work / f"placement-{workload}", workload,
                                     args.placement_steps)
    if errs:
        within = sum(abs(e) <= TARGET for e in errs)
        print(f"\n{within} of {len(errs)} held-out points within {TARGET:.0%} "
              f"(mean |error| {statistics.mean(abs(e) for e in errs):.0%}); load now "
              f"{harness.load():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
