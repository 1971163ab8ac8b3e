"""`locojax` command line: one subcommand per workflow.

Each subcommand lives in its own module exposing `main(argv)`; this file only dispatches,
so `locojax --help` stays fast (nothing imports JAX until a subcommand runs).
"""

from __future__ import annotations

import importlib
import sys

from locojax import gc_tuning

SUBCOMMANDS = {
    "generate": ("locojax.commands.generate", "sample from a model with the jitted engine"),
    "demo": ("locojax.commands.demo", "the embedded default run (`make demo`)"),
    "launch": ("locojax.commands.launch", "run a subcommand as N local hosts (jax.distributed)"),
    "devices": ("locojax.commands.devices", "show devices and test cross-host collectives"),
    "train": ("locojax.commands.train",
              "GRPO training (modes: single, colocated, controller, disaggregated, async)"),
    "sft": ("locojax.commands.sft", "train a char-level model on built-in task demonstrations"),
    "curate": ("locojax.commands.curate", "score a dataset's pass rates with a model and filter it"),
    "eval": ("locojax.commands.eval", "score a checkpoint on a task: accuracy, pass@k, lengths"),
    "plot": ("locojax.commands.plot", "write a PNG of a run's reward, accuracy and timings"),
    "predict": ("locojax.commands.predict", "step time, memory and placement before launch"),
    "convert": ("locojax.commands.convert", "a GGUF file to an HF checkpoint directory"),
}


def _usage() -> str:
    rows = "\n".join(f"  {name:<10} {desc}" for name, (_, desc) in SUBCOMMANDS.items())
    return f"usage: locojax SUBCOMMAND [--help] ...\n\nsubcommands:\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    gc_tuning.tune()  # this process is locojax's: trace with fewer collections
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), end="")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"locojax: unknown subcommand {name!r}\n\n{_usage()}", end="", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
