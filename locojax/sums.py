"""Records of sums that add field by field: what one host or worker counted, summed with `+`.

A field is a number, a dict of numbers (a key missing on one side counts 0), a tuple of
numbers (added elementwise, the shorter one padded with 0), a nested record, or None
(nothing counted: the other side's value stands). The rollout statistics that cross from
producer to learner (`train/record.py`) and the multi-turn env counters are such records.
They are also pytrees, so that hosts can sum them with one collective (`wiring.py`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any


def add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict):
        return {k: add(a.get(k, 0.0), b.get(k, 0.0)) for k in sorted({*a, *b})}
    if isinstance(a, tuple):
        return tuple(x + y for x, y in itertools.zip_longest(a, b, fillvalue=0.0))
    if dataclasses.is_dataclass(a):
        return type(a)(**{f.name: add(getattr(a, f.name), getattr(b, f.name))
                          for f in dataclasses.fields(a)})
    return a + b


class Sums:
    """Mixin of a frozen dataclass of sums: `a + b` adds field by field (`add`)."""

    def __add__(self, other):
        return add(self, other)
