"""Calibrate `locojax predict` for this machine: a short caller of `locojax predict calibrate`
(locojax/predict/calibrate.py), which measures the machine with micro-benchmarks and fits
nothing to a training run (docs/predict_validation.md).

The former script here fitted per-shape program times to `locojax train` runs at N = 1; its
last output is the shipped example profile locojax/predict/hardware/cpu-here.json, whose
sources still name the command that made it. That fit held only at the shapes it was fitted
on (issue 37), and is gone; `benchmarks/validate_heldout.py` validates the calibration on
pre-registered held-out runs.

Usage:
    .venv/bin/python -m benchmarks.calibrate_predict [--out FILE]
"""

from __future__ import annotations

import subprocess
import sys


from benchmarks.harness import CLI

if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    sys.exit(subprocess.run([*CLI, "predict", "calibrate", *sys.argv[1:]]).returncode)
