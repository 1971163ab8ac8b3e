"""The multi-turn reference run: calc-demo from the shipped tiny-calc checkpoint, 2 steps, as
2 colocated hosts x 1 device. Its trajectories call the calculator (about a quarter of the
answers) and its params move, so a run that reproduces it is not vacuously equal."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALC_DEMO_ARGS = ("--rollout.prompts-per-step", "8", "--algo.group-size", "4", "--steps", "2",
                  "--eval.every", "0", "--no-progress", "--no-tensorboard", "--dump-rollouts")


def run_colocated(run_dir):
    out = subprocess.run(
        [sys.executable, "-m", "locojax.cli", "launch", "--hosts", "2", "--devices-per-host", "1",
         "--heartbeat-s", "10", "--", "train", "calc-demo", "--mode", "colocated", "--run-dir",
         str(run_dir), *CALC_DEMO_ARGS],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return run_dir
