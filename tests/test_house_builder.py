"""The commands that only sample (`eval`, `curate`, `generate`) build their model, tokenizer,
sampling and engine with the builder training uses (`locojax/train/build.py`), so a model
is read and sampled one way everywhere. Checked from the source: none of them makes those
parts itself."""

import ast
from pathlib import Path

COMMANDS = Path(__file__).parent.parent / "locojax" / "commands"
SAMPLING_COMMANDS = ("eval.py", "curate.py", "generate.py")
# What the builder makes; a command that names one of these builds a part on its own.
BUILDER_ONLY = {"Engine", "SamplingConfig", "with_chat_template", "load", "load_config",
                "load_tokenizer_of"}


def made_outside_the_builder(source: str) -> list[str]:
    """Names of builder-only constructors that `source` imports or calls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [a.name for a in node.names if a.name in BUILDER_ONLY | {"loader"}]
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
            if name in BUILDER_ONLY and owner in ("", "loader"):
                found.append(name)
    return found


def test_sampling_commands_build_through_the_builder():
    offenders = {name: made_outside_the_builder((COMMANDS / name).read_text())
                 for name in SAMPLING_COMMANDS}
    assert not {k: v for k, v in offenders.items() if v}, offenders


def test_the_check_sees_a_command_that_builds_its_own_engine():
    """The check can fail: the construction these commands had before, planted."""
    planted = ("from locojax.engine.engine import Engine\nfrom locojax.model import loader\n"
               "model = loader.load(spec)\nengine = Engine(model.cfg)\n")
    assert sorted(made_outside_the_builder(planted)) == ["Engine", "Engine", "load", "loader"]
