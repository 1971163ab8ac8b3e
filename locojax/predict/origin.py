"""A number with its origin: every constant of the cost model says where it came from.

Kinds (issue 25: "every constant carries its origin"):
- `spec`: a public specification; `source` is the document (URL and table);
- `measured`: measured on this machine; `source` is the command, with date and load;
- `fitted`: fitted to figures; `source` names the figures fitted to and those kept out;
- `data`: read from a data file or a run's output; `source` is the path;
- `assumed`: a stated assumption where no source exists; `source` says why this value.
`locojax predict --constants` prints every constant the prediction used, with its origin.
"""

from __future__ import annotations

import dataclasses

KINDS = ("spec", "measured", "fitted", "data", "assumed")


@dataclasses.dataclass(frozen=True)
class Const:
    """One constant: value, unit, origin kind and source."""

    value: float
    unit: str
    origin: str
    source: str

    def __post_init__(self):
        if self.origin not in KINDS:
            raise ValueError(f"origin must be one of {KINDS}, got {self.origin!r}")
        if not self.source:
            raise ValueError("a constant needs a source")

    def __float__(self) -> float:
        return float(self.value)


def from_json(entry, where: str) -> Const:
    """A Const from a profile's `{"value", "unit", "origin", "source"}` entry."""
    missing = [k for k in ("value", "unit", "origin", "source") if k not in entry]
    if missing:
        raise ValueError(f"{where}: entry lacks {missing} (every number needs its source)")
    return Const(float(entry["value"]), entry["unit"], entry["origin"], entry["source"])


class Ledger:
    """The constants one prediction read, by name, in the order first read."""

    def __init__(self):
        self.used: dict[str, Const] = {}

    def get(self, name: str, c: Const) -> float:
        self.used.setdefault(name, c)
        return float(c)
