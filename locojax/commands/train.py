"""`locojax train`: a GRPO run (see `locojax.train.config.RunConfig` for every field).

    locojax train demo                         # the embedded default, overridable:
    locojax train demo --steps 80 --mode single
    locojax launch --hosts 2 -- train demo     # colocated over 2 local hosts
    locojax train gsm8k --model DIR --task.data train.jsonl
    locojax launch --hosts 2 -- train calc-demo   # multi-turn tool use (docs/calc_demo.md)
    locojax train swe --model DIR               # multi-turn bug fixing in the sandbox
"""

from __future__ import annotations

import logging
import sys

import tyro

from locojax.train.config import PRESETS


def main(argv: list[str]) -> int:
    cfg = tyro.extras.overridable_config_cli(PRESETS, args=argv, prog="locojax train")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from locojax.train.loop import Trainer

    try:
        trainer = Trainer(cfg)
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"locojax train: {e}", file=sys.stderr)
        return 2
    final = trainer.run()
    if trainer.is_main and "eval/accuracy" in final:
        before = final.get("before/eval/accuracy")
        prefix = f"{before:.3f} -> " if before is not None else ""
        print(f"held-out accuracy: {prefix}{final['eval/accuracy']:.3f}")
        if "eval/tool_call_rate" in final:  # multi-turn tasks: where the accuracy came from
            fmt = lambda k: "n/a" if k not in final else f"{final[k]:.3f}"  # noqa: E731
            for key, what in (("eval/tool_call_rate", "tool-call rate"),
                              ("eval/accuracy_no_tool", "accuracy without a tool call")):
                was = "" if "before/eval/accuracy" not in final else f"{fmt('before/' + key)} -> "
                print(f"held-out {what}: {was}{fmt(key)}")
    return 0
