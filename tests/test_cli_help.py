"""What `--help` tells a user: printed at once, naming what loads and what each argument is.

Issue 60, item 4: `locojax demo --help` started two hosts (and removed runs/demo) to print
the help of `train demo`; `--model` said "an HF Qwen3 dir" when every family in
`model/families.py` loads; `locojax convert --help` showed its two arguments as `STR STR`.
The parsers are the ones tyro builds from the argument dataclasses, so nothing runs.
"""

from __future__ import annotations

import argparse
import warnings

import pytest
import tyro

from locojax.commands import convert, curate, demo, devices, eval, generate, launch, plot, sft
from locojax.model.config import PRESETS
from locojax.model.families import FAMILIES
from locojax.model.loader import EMBEDDED
from locojax.train.config import RunConfig

ARGS = {"train": RunConfig, "eval": eval.EvalArgs, "curate": curate.CurateArgs,
        "generate": generate.GenerateArgs, "sft": sft.SFTArgs, "convert": convert.ConvertArgs,
        "plot": plot.PlotArgs, "devices": devices.DevicesArgs, "launch": launch.LaunchArgs}
MODEL_ARGS = ("train", "eval", "curate", "generate")
"""The subcommands whose --model takes a model spec (`model/loader.py`)."""
TYPE_METAVARS = {"STR", "INT", "FLOAT", "BOOL", "PATH", "STR [STR ...]"}


def _parser(cls) -> argparse.ArgumentParser:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return tyro.extras.get_parser(cls)


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if not a.option_strings and not isinstance(a.choices, dict)]


def _help_of(parser: argparse.ArgumentParser, flag: str) -> str:
    return next(a.help for a in parser._actions if flag in a.option_strings)


def missing_from_model_help(text: str) -> list[str]:
    """The specs and families `text` does not name: a family by its model_type's stem
    (`gemma3_text` as Gemma 3), spaces and case aside."""
    flat = "".join(text.lower().split())
    return ([s for s in (*EMBEDDED, *PRESETS) if s not in text]
            + [t for t in FAMILIES if t.split("_")[0] not in flat])


@pytest.mark.parametrize("name", MODEL_ARGS)
def test_model_help_names_every_spec_and_family(name):
    text = _help_of(_parser(ARGS[name]), "--model")
    assert missing_from_model_help(text) == [], f"locojax {name} --model: {text}"


def test_the_model_help_check_fails_on_the_old_text():
    old = ("embedded / embedded-strict / embedded-calc (shipped tiny checkpoints), tiny / "
           "small (random), or an HF Qwen3 dir.")
    assert missing_from_model_help(old) == ["char_demo", "qwen2", "llama", "gemma3_text"]


@pytest.mark.parametrize("name", sorted(ARGS))
def test_positional_arguments_are_named(name):
    unnamed = [a.dest for a in _positionals(_parser(ARGS[name]))
               if a.metavar is None or a.metavar in TYPE_METAVARS]
    assert unnamed == [], f"locojax {name}: positional arguments shown by type: {unnamed}"


def test_the_positional_check_sees_an_unnamed_one():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Planted:
        source: tyro.conf.Positional[str]

    assert [a.metavar for a in _positionals(_parser(Planted))] == ["STR"]


@pytest.mark.parametrize("argv, preset", [(["--help"], "demo"),
                                          (["--real", "-h", "--steps", "3"], "real-demo")])
def test_demo_help_prints_without_starting_hosts(argv, preset, monkeypatch, tmp_path, capsys):
    def refuse(*a, **k):
        raise AssertionError("demo --help started hosts")

    monkeypatch.setattr(demo, "launch", refuse)
    monkeypatch.chdir(tmp_path)
    (tmp_path / demo.RUN_DIR).mkdir(parents=True)
    (tmp_path / demo.REAL_RUN_DIR).mkdir(parents=True)
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("`locojax demo`") and f"usage: locojax train {preset}" in out
    assert "--steps" in out and "[host 0]" not in out
    assert (tmp_path / demo.RUN_DIR).is_dir() and (tmp_path / demo.REAL_RUN_DIR).is_dir()
