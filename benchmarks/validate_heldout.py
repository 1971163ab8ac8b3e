"""Pre-registered validation of `locojax predict` (issue 37, item 3): calibrate this machine
afresh, run every held-out point of a pre-registered points file with the real
`locojax train` / `locojax launch`, predict each from the fresh profile, and print every
point with its signed error and the verdict against the file's target.

The points, the measurement and the target were committed before the calibration and the
model they test existed, and nothing here feeds back into either: calibrate runs only
micro-benchmarks (`locojax/predict/calibrate.py`), never a train run.

- measured: median over steps 3..S of `perf/step_time` (compile excluded,
  locojax/profiler.py) less `perf/phase/checkpoint` (the final save), from process 0's
  perf.jsonl (the points file's "measured" and "amended");
- predicted: the step of the run's mode, from the command's own builder
  (`predict_train.parse`, as `locojax predict train ARGS --hardware PROFILE --cluster N`
  prints it), with the profile's measured host rates (`calibrated.with_host_rates`).

The points files kept are the current sets: predict_validation_points_v5.json (the
`measure` method's, the default), _v9.json (`compiled`'s) and the chip's _v10_tpu.json
_v11_tpu.json and _v12_tpu.json (run: docs/results/predict_tpu_validation.md), and
_v13_tpu.json (run: one point of eight) and _v14_tpu.json (registered with its profile
and its predictions, `--write-predictions`: not yet run); the earlier sets are in git
history, their every point in docs/results/.

Usage:
    .venv/bin/python -m benchmarks.validate_heldout [--work-dir DIR] [--only ID ...]
    .venv/bin/python -m benchmarks.validate_heldout --profile FILE   # skip calibrating
    python -m benchmarks.validate_heldout --points \
        benchmarks/predict_validation_points_v10_tpu.json   # on the chip (docs/tpu.md)

Set 10's points name a published config (`"config"`): each runs GSM8K on random weights at
that config (`with_models`), from `--configs` and `--data` (the chip's carried
`.tpu-data/`); `--tiny` runs them cut to 2 layers at d 64, a dry run on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import types
from pathlib import Path


from benchmarks import harness
from benchmarks.heldout_points import train_args, with_models

POINTS = Path(__file__).with_name("predict_validation_points_v5.json")
REAL = "models/SmolLM2"


def command(pt: dict, run_dir: Path) -> list[str]:
    args = train_args(pt, run_dir)
    if pt["mode"] == "single":
        return [*harness.CLI, "train", *args, "--devices-per-host", str(pt["n"])]
    return [*harness.CLI, "launch", "--hosts", str(pt["n"]), "--devices-per-host", "1", "--",
            "train", *args]


def measure(pt: dict, work: Path, timeout: float) -> float:
    run_dir = work / pt["id"]
    argv = command(pt, run_dir)
    print(f"$ {shlex.join(argv)}", flush=True)
    code, tail = harness.run_logged(argv, work / f"{pt['id']}.log", timeout)
    if code != 0:
        raise RuntimeError(f"{pt['id']} failed ({code}):\n{tail}")
    steps = harness.read_steps(run_dir / "perf.jsonl")
    times = [steps[s]["perf/step_time"] - steps[s].get("perf/phase/checkpoint", 0.0)
             for s in range(3, pt["steps"] + 1)]
    return statistics.median(times)


def context(pt: dict, profile: Path, work: Path):
    """The prediction context of a point's run (`predict_train.parse`), with the profile's
    host rates."""
    from locojax.commands import predict_train
    from locojax.predict import calibrated

    run = predict_train.parse(train_args(pt, work / pt["id"]), str(pt["n"]), str(profile))
    run.ctx.rates = calibrated.with_host_rates(run.ctx.rates, run.ctx.cluster.hw)
    return run.ctx


def prediction(pt: dict, profile: Path, work: Path):
    """The `modes.Prediction` of a point's run (phases and step)."""
    from locojax.predict import modes

    return getattr(modes, pt["mode"])(context(pt, profile, work))


def predict(pt: dict, profile: Path, work: Path, method: str = "model"):
    """The point's `Prediction`; with method `measure`, its device phases are the run's own
    programs timed here (`predict_programs measure`); with `compiled`, priced
    from them compiled here (`predict_programs compiled`). Its phases are kept in
    WORK/ID.pred.json with the load and this machine's matmul rate when it was made."""
    from benchmarks import measure as measure_lib
    from benchmarks import priced
    from locojax.predict import modes

    rate, load = harness.matmul_peak(1024), harness.loads()
    ctx = context(pt, profile, work)
    pred = model = getattr(modes, pt["mode"])(ctx)
    if method == "measure":
        args = train_args(pt, work / pt["id"])
        limits = measure_lib.limits_of(ctx, pt["prompts"] * pt["group"])
        pred = measure_lib.apply(pred, measure_lib.measure(
            pt["mode"], args, pt["n"], pt["prompts"], pt["group"], limits))
    elif method == "compiled":
        _, pred = priced.predicted(ctx, pt["mode"], train_args(pt, work / pt["id"]),
                                   pt["prompts"])
    (work / f"{pt['id']}.pred.json").write_text(json.dumps(
        {"method": method, "phases": pred.phases, "step": pred.step, "load": load,
         "model_phases": model.phases, "model_step": model.step,
         "matmul_flops": rate, "load_after": harness.loads()}))
    return pred


def write_predictions(spec: dict, profile: Path, work: Path, out: Path) -> None:
    """Every point's cost-model prediction from `profile`, written to `out` before any point
    runs, so that a set can commit its predictions with its registration: the run then only
    measures (`--predicted`), and no later change to the cost model can reach them."""
    made = {pt["id"]: {"step": (p := prediction(pt, profile, work)).step,
                       "phases": dict(p.phases)} for pt in spec["points"]}
    out.write_text(json.dumps({"profile": str(profile), "points": made}, indent=1) + "\n")
    for pid, p in made.items():
        print(f"{pid}: predicted {p['step']:.3f} s/step")


def committed(pt: dict, predicted: dict, work: Path):
    """The point's prediction from a committed predictions file (`write_predictions`), kept in
    WORK/ID.pred.json as `predict` keeps its own."""
    made = predicted["points"][pt["id"]]
    (work / f"{pt['id']}.pred.json").write_text(json.dumps(
        {"method": "committed", "phases": made["phases"], "step": made["step"],
         "load": "committed", "model_phases": made["phases"], "model_step": made["step"],
         "matmul_flops": float("nan"), "load_after": "committed"}))
    return types.SimpleNamespace(phases=made["phases"], step=made["step"])


def largest_gap(pt: dict, profile: Path, work: Path) -> str:
    """The phase whose predicted time is furthest from the measured (median over the same
    steps as the step time): where a miss comes from. Read after the runs, never fed back."""
    steps = harness.read_steps(work / pt["id"] / "perf.jsonl")
    rows = [steps[s] for s in range(3, pt["steps"] + 1)]
    measured = {k.removeprefix("perf/phase/"): statistics.median(r.get(k, 0.0) for r in rows)
                for k in rows[0] if k.startswith("perf/phase/") and k != "perf/phase/checkpoint"}
    measured["other"] = statistics.median(r.get("perf/other", 0.0) for r in rows)
    predicted = dict(prediction(pt, profile, work).phases)
    names = set(measured) | set(predicted)
    gaps = {n: predicted.get(n, 0.0) - measured.get(n, 0.0) for n in names}
    worst = sorted(names, key=lambda n: -abs(gaps[n]))[:2]
    return "; ".join(f"{n} {1e3 * predicted.get(n, 0.0):.1f} ms predicted, "
                     f"{1e3 * measured.get(n, 0.0):.1f} measured" for n in worst)


GROUPS = {"prefill": ("prefill",), "decode": ("decode", "tp_comm", "extend"),
          "train": ("train", "allreduce", "collectives", "reshard"),
          "host": ("admission", "env", "detokenize_reward", "batch", "metrics", "dispatch",
                   "other", "lockstep")}
"""Phases grouped as the diagnosis reads them: a measured run's `train` phase holds its
gradient all-reduce (predicted apart); host is every phase of Python work, and the hosts'
meetings (`predict_programs compiled`'s `lockstep`: a run measures them inside its batch and metrics)."""


def breakdown(pt: dict, profile: Path, work: Path) -> list[object]:
    """One point's row of the diagnosis: measured and predicted seconds of each phase group
    (medians over the measured steps) and each group's share of the step's error. Read after
    the runs, never fed back."""
    steps = harness.read_steps(work / pt["id"] / "perf.jsonl")
    rows = [steps[s] for s in range(3, pt["steps"] + 1)]
    phase = {k.removeprefix("perf/phase/") for r in rows for k in r
             if k.startswith("perf/phase/") and k != "perf/phase/checkpoint"}
    meas = {n: statistics.median(r.get(f"perf/phase/{n}", 0.0) for r in rows) for n in phase}
    meas["other"] = statistics.median(r.get("perf/other", 0.0) for r in rows)
    total = statistics.median(r["perf/step_time"] - r.get("perf/phase/checkpoint", 0.0)
                              for r in rows)
    saved = work / f"{pt['id']}.pred.json"
    pred = (json.loads(saved.read_text())["phases"] if saved.exists()
            else dict(prediction(pt, profile, work).phases))
    cells: list[object] = [pt["id"], f"{total:.3f}", f"{sum(pred.values()):.3f}"]
    for names in GROUPS.values():
        m = sum(meas.get(n, 0.0) for n in names)
        p = sum(pred.get(n, 0.0) for n in names)
        cells += [f"{1e3 * m:.1f}", f"{1e3 * p:.1f}", f"{100 * (p - m) / total:+.0f}%"]
    return cells


def breakdown_table(spec: dict, profile: Path, work: Path) -> list[str]:
    head = ["point", "measured s", "predicted s"]
    for g in GROUPS:
        head += [f"{g} meas ms", f"{g} pred ms", f"{g} err"]
    return harness.table(head, [breakdown(pt, profile, work) for pt in spec["points"]
                                if (work / pt["id"] / "perf.jsonl").exists()])


def real_model_busy() -> bool:
    """Another process has the real model open (`ps aux`): its point is skipped."""
    ps = subprocess.run(["ps", "aux"], capture_output=True, text=True).stdout
    return any(REAL in line and str(os.getpid()) not in line for line in ps.splitlines()
               if "grep" not in line)


def verdict(errors: list[float], target: dict, what: str = "") -> str:
    """The target's line over `errors` (signed, predicted / measured - 1)."""
    within = sum(abs(e) < target["within"] for e in errors) / len(errors)
    bias = statistics.mean(errors)
    ok = within >= target["share_within"] and abs(bias) <= target["mean_signed_error_max"]
    return (f"{what}within {target['within']:.0%}: {within:.0%} of {len(errors)} points "
            f"(target >= {target['share_within']:.0%}); mean signed error {100 * bias:+.1f}% "
            f"(target within ±{100 * target['mean_signed_error_max']:.0f}%); under-predicted "
            f"{sum(e < 0 for e in errors)} of {len(errors)}: "
            f"{'TARGET MET' if ok else 'TARGET MISSED'}")


def model_lines(rows: list[tuple], work: Path, target: dict) -> list[str]:
    """With --method measure or compiled: the cost model's own prediction of every run
    point (kept in WORK/ID.pred.json when the point was predicted), each with its sign, and
    its verdict."""
    out, errors = [], []
    for pt, meas, *_ in rows:
        saved = work / f"{pt['id']}.pred.json"
        model = json.loads(saved.read_text()).get("model_step") if saved.exists() else None
        if meas is None or model is None:
            continue
        errors.append(model / meas - 1)
        out.append(f"  {pt['id']}: the cost model {model:.3f} s, measured {meas:.3f} s: "
                   f"{100 * errors[-1]:+.1f}%")
    return ["", "The cost model alone (the same profile, no program timed):", *out,
            verdict(errors, target, "the cost model: ")] if errors else []


def report(rows: list[tuple], target: dict) -> list[str]:
    lines = harness.table(["point", "model", "mode", "N", "B x G", "P", "N new",
                           "measured s", "predicted s", "error", "within",
                           "load at predict / run", "matmul run / predict"])
    errors = []
    for pt, meas, pred, why, *machine in rows:
        load = machine[0] if machine else ("", "")
        if meas is None:
            lines.append(harness.table_row([pt["id"], pt["model"], pt["mode"], pt["n"],
                                            f"{pt['prompts']} x {pt['group']}",
                                            pt["prompt_tokens"], pt["new_tokens"], "", pred,
                                            "", why, *load]))
            continue
        err = pred / meas - 1
        errors.append(err)
        lines.append(harness.table_row([
            pt["id"], pt["model"].split("/")[-1], pt["mode"], pt["n"],
            f"{pt['prompts']} x {pt['group']}", pt["prompt_tokens"], pt["new_tokens"],
            f"{meas:.3f}", f"{pred:.3f}", f"{100 * err:+.1f}%",
            "yes" if abs(err) < target["within"] else "NO", *load]))
    if errors:
        lines += ["", verdict(errors, target)]
    return lines


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", default="/tmp/locojax_validate_heldout")
    ap.add_argument("--profile", default="", help="a profile already calibrated (skip it)")
    ap.add_argument("--only", nargs="*", default=[], help="point ids (default: all)")
    ap.add_argument("--points", default=str(POINTS), help="the pre-registered points file")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--method", choices=("model", "measure", "compiled"), default="model",
                    help="model: the cost model on the profile; measure: the run's own "
                         "programs timed here (`predict_programs measure`); compiled: "
                         "its compiled programs priced (`predict_programs compiled`)")
    ap.add_argument("--phases", action="store_true",
                    help="with --profile: read the runs already in --work-dir and print the "
                         "two phases furthest from their prediction, per point; run nothing")
    ap.add_argument("--breakdown", action="store_true",
                    help="with --profile: read the runs already in --work-dir and print, per "
                         "point, each phase group measured and predicted; run nothing")
    ap.add_argument("--write-predictions", default="", metavar="FILE",
                    help="with --profile: predict every point (the cost model) into FILE, "
                         "to commit with the set's registration; run nothing")
    ap.add_argument("--predicted", default="", metavar="FILE",
                    help="the points' predictions committed in advance (--write-predictions): "
                         "read from FILE instead of predicted here")
    ap.add_argument("--configs", default=".tpu-data/configs",
                    help="points of a published config: the folder of its config.json")
    ap.add_argument("--data", default=".tpu-data/gsm8k/train.jsonl",
                    help="points of a published config: their GSM8K rows")
    ap.add_argument("--tiny", action="store_true",
                    help="points of a published config on 2 layers at d 64 (a dry run)")
    return ap


def main() -> int:
    args = parser().parse_args()
    import jax

    # This process only predicts, on the host: the chip stays free for the runs it measures
    # (one process holds a TPU at a time). Its children inherit the environment, not this.
    jax.config.update("jax_platforms", "cpu")
    spec = json.loads(Path(args.points).read_text())
    work = Path(args.work_dir)
    spec["points"] = with_models(spec["points"], Path(args.configs), args.data,
                                 work / "models", args.tiny)
    if args.breakdown:
        print("\n".join(breakdown_table(spec, Path(args.profile), work)))
        return 0
    if args.write_predictions:
        write_predictions(spec, Path(args.profile), work, Path(args.write_predictions))
        return 0
    if args.phases:
        for pt in spec["points"]:
            if (work / pt["id"] / "perf.jsonl").exists():
                print(f"{pt['id']}: {largest_gap(pt, Path(args.profile), work)}")
        return 0
    work.mkdir(parents=True, exist_ok=True)
    print(harness.header("validate_heldout"), flush=True)
    print(harness.command_line(), flush=True)
    profile = Path(args.profile) if args.profile else work / "here.json"
    if not args.profile:
        argv = ([sys.executable, "-m", "benchmarks.predict_programs", "calibrate"]
                if args.method == "compiled" else [*harness.CLI, "predict", "calibrate"])
        argv += ["--out", str(profile)]
        print(f"$ {shlex.join(argv)}", flush=True)
        subprocess.run(argv, check=True)
    predicted = json.loads(Path(args.predicted).read_text()) if args.predicted else None
    busy = real_model_busy()
    rows = []
    for pt in spec["points"]:
        if args.only and pt["id"] not in args.only:
            continue
        try:
            made = (committed(pt, predicted, work) if predicted
                    else predict(pt, profile, work, args.method))
        except RuntimeError as e:  # a program that could not be timed: reported, not dropped
            print(f"# {pt['id']}: prediction FAILED: {e}", flush=True)
            rows.append((pt, None, "", "prediction failed"))
            continue
        pred, at_predict = made.step, json.loads((work / f"{pt['id']}.pred.json").read_text())
        if pt.get("conditional") and busy:
            print(f"# {pt['id']}: skipped, another process has {REAL} open", flush=True)
            rows.append((pt, None, f"{pred:.3f}", "skipped"))
            continue
        rate, load = harness.matmul_peak(1024), harness.loads()
        try:
            meas = measure(pt, work, args.timeout)
        except RuntimeError as e:  # reported as failed, never dropped
            print(f"# {pt['id']}: FAILED: {e}", flush=True)
            rows.append((pt, None, f"{pred:.3f}", "failed"))
            continue
        print(f"# {pt['id']}: measured {meas:.3f} s/step, predicted {pred:.3f} "
              f"({100 * (pred / meas - 1):+.1f}%); load at predict {at_predict['load']}, "
              f"at run start {load}, end {harness.loads()}; 1024^3 matmul "
              f"{at_predict['matmul_flops'] / 1e9:.0f} GFLOP/s at predict, {rate / 1e9:.0f} "
              "at run start", flush=True)
        rows.append((pt, meas, pred, "", (f"{at_predict['load'].split()[0]} / "
                                          f"{load.split()[0]}",
                                          f"{rate / at_predict['matmul_flops']:.2f}")))
    print("\n".join(report(rows, spec["target"])))
    if args.method != "model":
        print("\n".join(model_lines(rows, work, spec["target"])))
    print(f"\n# load average at the end {harness.loads()}; the machine is shared: other "
          "processes' load enters every measured point and the calibration alike")
    return 0


if __name__ == "__main__":
    sys.exit(main())
