"""`locojax predict fields`: which `locojax train` config fields `locojax predict train`
consumes. Every field of `RunConfig` is in exactly one of three tables, so that no flag is
silently ignored.

- HONOURED: the prediction reads it (the text says how);
- REFUSED: it changes the step's cost in a way the model does not cost; a value other than
  the field's default is refused, naming the flag and why;
- IRRELEVANT: it does not change a steady step's time or memory (the text says why).

The tables are data, `predict_fields.json` (field path -> the text), read once here.
tests/test_predict_train_fields.py walks every field of `RunConfig` and fails when one is
in none of the tables (a new train flag must be placed there) or in a table but no longer a
field. `locojax predict fields` prints the tables (docs/pod_scale.md holds a run of it).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

with open(Path(__file__).parent / "predict_fields.json") as _f:
    _TABLES = json.load(_f)
HONOURED: dict[str, str] = _TABLES["honoured"]
REFUSED: dict[str, str] = _TABLES["refused"]
IRRELEVANT: dict[str, str] = _TABLES["irrelevant"]

NO_PREFIX = ("placement",)  # tyro.conf.OmitArgPrefixes: --hosts, not --placement.hosts


def flag(path: str) -> str:
    """The command-line flag of a field path: `algo.num_minibatches` -> --algo.num-minibatches."""
    head, _, rest = path.partition(".")
    name = rest if head in NO_PREFIX and rest else path
    return "--" + name.replace("_", "-")


def fields(cls=None, prefix: str = "") -> dict[str, object]:
    """Every leaf field of the run config, by dotted path, with its default."""
    if cls is None:
        from locojax.train.config import RunConfig

        cls = RunConfig
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            out.update(fields(type(default), f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = default
    return out


def value(cfg, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check(cfg) -> None:
    """Refuse, by flag, every REFUSED field of `cfg` set away from its default."""
    defaults = fields()
    bad = [f"{flag(p)} {value(cfg, p)!r} ({why})" for p, why in REFUSED.items()
           if value(cfg, p) != defaults[p]]
    if bad:
        raise ValueError("predict does not cost " + "; ".join(bad)
                         + ". Leave it at its default to predict the rest of the run")


def table() -> str:
    """The three tables as one markdown table (`locojax predict fields`)."""
    lines = ["| flag | predict | how / why |", "|---|---|---|"]
    for kind, t in (("honoured", HONOURED), ("refused", REFUSED),
                    ("irrelevant", IRRELEVANT)):
        lines += [f"| `{flag(p)}` | {kind} | {why} |" for p, why in t.items()]
    return "\n".join(lines)
