"""`locojax demo` (what `make demo` runs): GRPO from the embedded tiny checkpoint.

Colocated mode over 2 local hosts by default (`--mode single` for one controller). Any
further arguments go to `locojax train demo`, e.g. `locojax demo --steps 20`. It shows the
progress bar, prints held-out accuracy before and after, and writes RUN_DIR/summary.png.
RUN_DIR (default runs/demo) is the demo's scratch directory: it is replaced on every run.
"""

from __future__ import annotations

import os
import shutil
import sys

from locojax.commands.launch import LaunchArgs, launch
from locojax.commands.plot import plot

RUN_DIR = "runs/demo"


def _pop_flag(argv: list[str], name: str, default: str) -> tuple[str, list[str]]:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if a.startswith(name + "="):
            return a.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return default, argv


def main(argv: list[str]) -> int:
    mode, rest = _pop_flag(argv, "--mode", "colocated")
    run_dir, rest = _pop_flag(rest, "--run-dir", RUN_DIR)
    train = ["train", "demo", "--mode", mode, "--run-dir", run_dir, *rest]
    print(f"locojax demo: GRPO on built-in arith from the embedded checkpoint, mode={mode}")
    if os.path.isdir(run_dir):  # the demo's own scratch directory: each demo starts afresh
        print(f"removing the previous demo run {run_dir}")
        shutil.rmtree(run_dir)
    if mode == "colocated":
        code = launch(LaunchArgs(hosts=2, devices_per_host=1),
                      [sys.executable, "-m", "locojax.cli", *train])
    elif mode == "single":
        from locojax.commands.train import main as train_main

        code = train_main(train[1:])
    else:
        print(f"locojax demo: --mode must be colocated or single, got {mode!r}", file=sys.stderr)
        return 2
    if code == 0:
        print(f"plot: {plot(run_dir)}")
    return code
