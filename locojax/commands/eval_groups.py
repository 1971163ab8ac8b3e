"""`locojax eval`'s rows grouped by prompt length, so a batch is padded to its own prompts.

The engine pads a batch's prompts to one width, a compiled shape. Padding every row to the
longest prompt's width makes every batch cost what the widest costs: MATH-500 with SmolLM2's
chat template has one prompt of 961 tokens and most under 256, so one width (1024) made
prefill, attention and the KV cache ~4x what the rows need. Here the rows are ordered by
encoded length (stable, so ties keep file order), cut into runs of one `width` each (a power
of two, capped at the run's max_prompt_tokens: at most log2(P) + 1 distinct widths, so few
compiles), and each run is scored in batches of `rows_at(width)` rows.

A sample is keyed by its row's place in the length order (`evaluate.score`'s first_index),
which every host computes alike from the same rows, so neither the number of hosts nor the
batch size changes what a row draws. The caller puts the records back in the rows' order
(`unsort`): the output file is in file order whatever the grouping.

Rows per call shrink as the width grows past `FULL_WIDTH` (the same prompt tokens per call):
with --batch-size 32 at width 1024 the prefill's attention scores and the KV cache of 32
rows OOM-killed a 135M model's eval at 7.6 GB resident; 8 rows at 1024 fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

MIN_WIDTH = 16
"""The narrowest width a group is padded to (fewer tiny compiles for short prompts)."""

FULL_WIDTH = 256
"""Widths up to this take --batch-size rows per call; wider ones proportionally fewer."""


def width_of(n: int, cap: int) -> int:
    """The width a prompt of n tokens is padded to: the next power of two, at most `cap`
    (every prompt fits `cap`: longer ones were refused or skipped at start-up)."""
    return min(cap, max(MIN_WIDTH, 1 << max(n - 1, 0).bit_length()))


def rows_at(width: int, batch_size: int) -> int:
    """Rows per generate call at `width`: batch_size up to FULL_WIDTH, then the same prompt
    tokens per call (at least 1 row)."""
    return max(1, batch_size * FULL_WIDTH // max(width, FULL_WIDTH))


@dataclasses.dataclass(frozen=True)
class Group:
    """Rows [start, stop) of the length order, all padded to `width`, `rows` per call."""

    start: int
    stop: int
    width: int
    rows: int


def order(lengths: Sequence[int]) -> np.ndarray:
    """The rows' indices by encoded length (stable: equal lengths keep their order)."""
    return np.argsort(np.asarray(lengths, np.int64), kind="stable")


def groups(sorted_lengths: Sequence[int], cap: int, batch_size: int, lo: int = 0,
           hi: int | None = None) -> list[Group]:
    """Runs of one width among rows [lo, hi) of lengths already in ascending order."""
    hi = len(sorted_lengths) if hi is None else hi
    out: list[Group] = []
    for i in range(lo, hi):
        w = width_of(int(sorted_lengths[i]), cap)
        if out and out[-1].width == w:
            out[-1] = dataclasses.replace(out[-1], stop=i + 1)
        else:
            out.append(Group(i, i + 1, w, rows_at(w, batch_size)))
    return out


def one_width(cap: int, rows: int, lo: int, hi: int) -> list[Group]:
    """Rows [lo, hi) as one group at the run's width, `rows` per call (--one-width, and
    multi-turn tasks, whose first prompt comes from the env, not the row)."""
    return [Group(lo, hi, cap, rows)] if hi > lo else []


def describe(sorted_lengths: Sequence[int], cap: int, batch_size: int) -> str:
    """One start-up line: rows per width and rows per call, over all rows."""
    parts = [f"{g.stop - g.start} at {g.width} ({g.rows}/call)"
             for g in groups(sorted_lengths, cap, batch_size)]
    return "grouped by length: " + ", ".join(parts) if parts else "no rows"


def unsort(records: list, perm: np.ndarray) -> list:
    """Records in the length order (record j is row perm[j]) back in the rows' order."""
    out: list = [None] * len(records)
    for j, i in enumerate(perm.tolist()):
        out[i] = records[j]
    return out
