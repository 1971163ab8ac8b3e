"""The waves of one decode loop as locojax's engine runs it: finished rows compacted out.

A generate's decode (`engine.Decoding.advance`) runs its `while_loop` over a device's R rows
until at most R / 2 are live, then moves them into a batch half the size (`decode.compact`,
halving again while they fit), as long as the batch stays at least `engine.MIN_ROWS` rows;
the last batch runs to its longest row. So most iterations run at a fraction of the rows.

Here the loop is followed on the expected lengths: with quantile function Q, a batch of S
rows (of R) leaves its loop where the live rows R (1 - F(t)) are at most S / 2, t = Q(1 -
S / 2R); the last runs to the expected longest of the R. A fixed length (`--rollout.
ignore-eos`) is one wave. `phases.Ctx.decode` costs each wave's iterations at its rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from locojax.predict.workload import Lengths

MIN_ROWS = 8
"""`locojax.engine.engine.MIN_ROWS`, restated so that predict stays free of the engine's
imports (tests/test_predict_compaction.py checks that the two agree)."""


@dataclasses.dataclass(frozen=True)
class Wave:
    rows: int  # a device's rows in this wave
    iterations: float  # decode iterations run at that size


def _live(lengths: Lengths, t: float) -> float:
    """Share of rows still live after iteration t (their length exceeds t + 1 tokens: token
    0 comes from prefill)."""
    return float(np.mean(np.asarray(lengths.quantiles) > t + 1))


def _exit(lengths: Lengths, share: float, start: float, end: float) -> float:
    """The first iteration in [start, end] at which at most `share` of the rows are live."""
    q = np.sort(np.asarray(lengths.quantiles))
    # the row at quantile 1 - share: past its last token, at most `share` remain
    k = min(len(q) - 1, max(0, int(np.ceil((1.0 - share) * len(q))) - 1))
    return float(min(end, max(start, q[k] - 1)))


def waves(lengths: Lengths, rows: int, iterations: float,
          min_rows: int | None = MIN_ROWS) -> list[Wave]:
    """The waves of a decode loop of `rows` rows per device running `iterations` iterations
    in all (its longest row's, as the caller costs it). min_rows None: no compaction."""
    if iterations <= 0:
        return []
    out, size, t = [], rows, 0.0
    while min_rows is not None and size % 2 == 0 and size // 2 >= min_rows:
        leave = _exit(lengths, (size // 2) / rows, t, iterations)
        if leave >= iterations:
            break
        out.append(Wave(size, leave - t))
        live = _live(lengths, leave) * rows
        while size % 2 == 0 and size // 2 >= max(live, min_rows):
            size //= 2
        t = leave
    out.append(Wave(size, iterations - t))
    return [w for w in out if w.iterations > 0]
