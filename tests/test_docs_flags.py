"""The README and docs/*.md cite only flags that `locojax` accepts.

Every command line in a doc that runs `locojax SUBCOMMAND` (in a code block or inline,
continued over `\\` line ends, `locojax launch ... -- SUBCOMMAND ...` read as both) has each
of its `--flags` checked against the flags that subcommand's parser accepts, taken from the
parser tyro builds from its argument dataclass (so a renamed or removed field fails here).
A flag after a `#` is a comment's and not checked; a value such as `--x=1` is checked as
`--x`.
"""

from __future__ import annotations

import argparse
import functools
import re
import warnings
from pathlib import Path

import tyro

from tests.test_docs_refs import DOCS, ROOT
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w.-]*[a-z0-9])")
COMMAND = re.compile(r"\blocojax(?:\.cli)? (\w[\w-]*)((?:[^`#\n|]|#(?=\w))*)")
"""`locojax SUB args` (or `python -m locojax.cli SUB args`), up to a comment (`# ...`), the
end of a code span or a table cell."""


def _options(parser: argparse.ArgumentParser) -> set[str]:
    out = set()
    for action in parser._actions:
        out.update(action.option_strings)
        if isinstance(action.choices, dict):  # subcommands (train's presets)
            for sub in action.choices.values():
                out |= _options(sub)
    return out


def _tyro(cls) -> set[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return _options(tyro.extras.get_parser(cls))


@functools.cache
def accepted() -> dict[str, set[str]]:
    """Flags per subcommand."""
    from locojax.commands import (convert, curate, devices, eval, generate, launch, plot,
                                  predict, sft)
    from locojax.train.config import RunConfig

    train = _tyro(RunConfig) | {"--help"}
    return {
        "train": train,
        "demo": train | {"--real"},  # demo passes the rest to `train demo`
        # predict train/workload take train's flags and predict's own; `predict calibrate`
        # reads one, --out, by hand (commands/predict_calibrate.py).
        "predict": train | set(predict.FLAGS) | set(predict.SWITCHES) | {"--out"},
        "eval": _tyro(eval.EvalArgs), "curate": _tyro(curate.CurateArgs),
        "generate": _tyro(generate.GenerateArgs), "sft": _tyro(sft.SFTArgs),
        "convert": _tyro(convert.ConvertArgs), "plot": _tyro(plot.PlotArgs),
        "devices": _tyro(devices.DevicesArgs), "launch": _tyro(launch.LaunchArgs),
    }


def command_flags(text: str):
    """(subcommand, flag, line number) of every flag on a `locojax SUB` command line."""
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        first, line = number + 1, lines[number]
        while line.endswith("\\") and number + 1 < len(lines):  # a continued command
            number += 1
            line = line[:-1] + " " + lines[number].strip()
        number += 1
        for m in COMMAND.finditer(line):
            sub, rest = m.group(1), m.group(2)
            if sub == "launch" and " -- " in rest:  # `launch ARGS -- SUB ARGS`
                rest, child = rest.split(" -- ", 1)
                sub_child, _, child_rest = child.strip().partition(" ")
                yield from ((sub_child, f, first) for f in FLAG.findall(child_rest))
            yield from ((sub, f, first) for f in FLAG.findall(rest))


def unknown(doc: Path, text: str | None = None) -> list[str]:
    text = doc.read_text() if text is None else text
    known = accepted()
    return [f"{doc.relative_to(ROOT)}:{n}: locojax {sub} {flag}"
            for sub, flag, n in command_flags(text)
            if sub in known and flag.split("=")[0] not in known[sub]]


def test_docs_cite_only_flags_that_exist():
    missing = [u for doc in DOCS for u in unknown(doc)]
    assert not missing, "flags no command accepts:\n" + "\n".join(missing)


def test_the_reader_catches_a_stale_flag_and_not_prose():
    doc = ROOT / "docs" / "example.md"
    stale = ("```\nlocojax train demo --steps 3 --multiturn.max-turns 4 \\\n    --no-remat\n"
             "locojax launch --hosts 2 --nope -- eval --model X --kk 3   # --ignored\n```\n"
             "Run `locojax predict train demo --cluster v5e-8 --decode-chunk 4`.")
    assert [u.split(": ", 1)[1] for u in unknown(doc, stale)] == [
        "locojax train --multiturn.max-turns", "locojax train --no-remat",
        "locojax eval --kk", "locojax launch --nope", "locojax predict --decode-chunk"]
    assert [u.split(": ", 1)[1] for u in unknown(doc, "python -m locojax.cli sft --nope 1")
            ] == ["locojax sft --nope"]
    fine = ("`locojax train demo --rollout.tp 2` | `--no-such` in a table cell\n"
            "ray start --head --num-cpus 8; locojax eval --model DIR --k 8 "
            "--template chat\nlocojax demo --real")
    assert unknown(doc, fine) == []
