"""`predict`'s memory against the compiled plan of the run it predicts (issue 58, item 4).

Each `locojax train` run prints its memory plan before its first step: the micro-batch count
the plan chose, and the peak it found by compiling the train step and the rollout programs
on the device (`train/memory_plan.py`). For every point of a points file whose run log is in
WORK (`validate_heldout` writes WORK/ID.log), this predicts the same `train` arguments with
`locojax predict train ... --grad-accum M`, M the plan's micro-batches (so both sides hold the
same batch; left free, `predict` picks its micro-batches from its own account), and prints
the analytic peak beside the compiled one, the signed error and how many are within 10%.

    python -m benchmarks.memory_vs_plan --points benchmarks/predict_validation_points_v12_tpu.json \\
        --work-dir DIR --profile DIR/here.json [--configs .tpu-data/configs] [--data ...]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks import harness, heldout_points

WITHIN = 0.10  # issue 58 item 4: the analytic peak within 10% of the chip's compiled plan
_MICRO = re.compile(r"memory plan per device .*?(\d+) micro-batch")
_PEAK = re.compile(r"^\s+peak\s+([\d.]+) ([GM])B in", re.M)
_PREDICTED = re.compile(r"^\s+peak ([\d.]+) GB in", re.M)


def compiled_plan(log: str) -> tuple[int, float] | None:
    """(micro-batches, peak bytes) of the memory plan a `train` log printed, or None."""
    micro, peak = _MICRO.search(log), _PEAK.search(log)
    if not (micro and peak):
        return None
    return int(micro.group(1)), float(peak.group(1)) * (1e9 if peak.group(2) == "G" else 1e6)


def predicted_peak(pt: dict, micro: int, profile: Path, work: Path) -> float:
    """`predict train`'s analytic peak (bytes) of the point's run at `micro` micro-batches."""
    argv = [*harness.CLI, "predict", "train", *heldout_points.train_args(pt, work / pt["id"]),
            "--grad-accum", str(micro), "--hardware", str(profile)]
    # exit 3 is predict's "does not fit", which still prints the peak
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    found = _PREDICTED.search(out)
    if not found:
        raise RuntimeError(f"{pt['id']}: no peak in predict's output:\n{out[-1500:]}")
    return float(found.group(1)) * 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", required=True)
    ap.add_argument("--work-dir", required=True, help="where the runs' ID.log files are")
    ap.add_argument("--profile", required=True, help="the profile the points were predicted by")
    ap.add_argument("--configs", default=".tpu-data/configs")
    ap.add_argument("--data", default=".tpu-data/gsm8k/train.jsonl")
    ap.add_argument("--tiny", action="store_true", help="the points' models cut (a dry run)")
    args = ap.parse_args()
    work = Path(args.work_dir)
    spec = json.loads(Path(args.points).read_text())
    points = heldout_points.with_models(spec["points"], Path(args.configs), args.data,
                                          work / "models", args.tiny)
    print("| point | plan's micro-batches | compiled plan GB | predict GB | error |")
    print("|---|---|---|---|---|")
    errors = []
    for pt in points:
        log = work / f"{pt['id']}.log"
        plan = compiled_plan(log.read_text()) if log.exists() else None
        if plan is None:
            print(f"| {pt['id']} | no plan in {log} | | | |")
            continue
        micro, chip = plan
        pred = predicted_peak(pt, micro, Path(args.profile), work)
        errors.append(pred / chip - 1)
        print(f"| {pt['id']} | {micro} | {chip / 1e9:.2f} | {pred / 1e9:.2f} | "
              f"{100 * errors[-1]:+.1f}% |", flush=True)
    inside = sum(abs(e) <= WITHIN for e in errors)
    print(f"\nwithin {WITHIN:.0%}: {inside} of {len(errors)} points with a plan "
          f"({len(points) - len(errors)} without)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
