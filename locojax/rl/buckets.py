"""The train batch cut to the step's real length: no forward or backward over pure padding.

A rollout's rows are the prompt left-padded to `max_prompt_tokens` (P) then the response
right-padded to `max_new_tokens` (N), so a batch is [B, P + N] however short the step's
longest prompt and response are (8 GSM8K prompts: 115 of P = 256 tokens). `fit` drops the
columns that are padding in every row, the leading ones of the prompt and the trailing ones
of the response, keeping a few fixed widths (`bucket`) so the train step compiles a bounded
number of programs. The dropped columns hold no real token and no target: no real token
attends to them (`attn_mask`), no count or loss reads them (`loss_mask`) and positions
count real tokens only, so the objective and its gradient are those of the uncut batch;
only the float summation order over the (exact-zero) padded terms changes, as between any
two paddings (tests/test_layout_invariance.py's padding layout, tests/test_buckets.py).

Multi-host: every host must cut to the same width (`from_process_local` joins equal
shapes), so each host's needs are gathered (`agree`, the wiring's `gather_over_hosts`: one
small collective per step) and the widths come from their maximum. The widest bucket is
the uncut width, which is what the memory plan compiles and sizes (`train/memory_plan.py`,
`loop.plan_memory`: P + N columns), so the plan covers every bucket.

The compile key is (prompt bucket, response bucket) with a shared prefix (its P is static
in the program), the total bucket without: at most ⌈log₂ P⌉ x ⌈log₂ N⌉ programs, in practice
one or two (a step's longest response usually reaches N). Each new one logs "compiling
train_step" (`train_step.py`). Legend: B rows, T columns, P prompt columns, N response ones.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from locojax.rl.batch import PER_TOKEN, SharedPrefix, TrainBatch

MIN_BUCKET = 16
"""The narrowest width: below it a column more costs less than a program more."""


def bucket(need: int, cap: int) -> int:
    """The width that holds `need` columns: the next power of two (at least MIN_BUCKET), or
    `cap` (the uncut width) when that is narrower."""
    if need < 0 or cap < 1:
        raise ValueError(f"bucket needs need ≥ 0 and cap ≥ 1, got need={need}, cap={cap}")
    width = MIN_BUCKET
    while width < need:
        width *= 2
    return min(width, cap)


def span(batch: TrainBatch) -> tuple[int, int]:
    """[first, stop) of the columns where some row has a real token (`attn_mask`) or a
    target, widened by one to the left when the first is a target (its logit is read from
    the column before it, which a cut must keep); (0, 0) for an empty batch."""
    attn, loss = np.asarray(batch.attn_mask), np.asarray(batch.loss_mask)
    real = np.flatnonzero(attn.any(axis=0) | loss.any(axis=0))
    if not len(real):
        return 0, 0
    first = int(real[0])
    if first and loss[:, first].any():
        first -= 1
    return first, int(real[-1]) + 1


def needs(batch: TrainBatch) -> np.ndarray:
    """[1, 3] int64: the columns a cut must keep of the prompt part and after it, and the
    real tokens of the rows (`attn_mask`, which a cut never changes). Without a shared
    prefix the whole row is the part after it (the first entry is 0)."""
    first, stop = span(batch)
    real = int(np.asarray(batch.attn_mask).sum())
    if batch.shared_prefix is None:
        return np.asarray([[0, stop - first, real]], np.int64)
    p = batch.shared_prefix.columns
    return np.asarray([[p - min(first, p), max(stop - p, 0), real]], np.int64)


def widths(batch: TrainBatch, need: np.ndarray) -> tuple[int, int]:
    """(prompt columns, other columns) to keep, given every host's `needs` stacked [H, 3]."""
    need = np.asarray(need).reshape(-1, 3).max(axis=0)
    t = batch.tokens.shape[1]
    if batch.shared_prefix is None:
        return 0, bucket(int(need[1]), t)
    p = batch.shared_prefix.columns
    # A prefix needs ≥ 1 column, and its row needs ≥ 1 column after it (batch.validate).
    return bucket(max(int(need[0]), 1), p), bucket(max(int(need[1]), 1), t - p)


def cut(batch: TrainBatch, prompt: int, rest: int) -> TrainBatch:
    """`batch` (host-side numpy) with `prompt` columns of the prefix (its last ones) and
    `rest` after it: without a prefix, `rest` columns from the first real one (or ending at T).
    Raises if a dropped column holds a real token or a target."""
    attn, loss = np.asarray(batch.attn_mask), np.asarray(batch.loss_mask)
    t = attn.shape[1]
    sp = batch.shared_prefix
    if sp is not None:
        keep = np.arange(sp.columns - prompt, sp.columns + rest)
    else:
        start = min(span(batch)[0], t - rest)
        keep = np.arange(start, start + rest)
    dropped = np.ones(t, bool)
    dropped[keep] = False
    if (attn[:, dropped] | loss[:, dropped]).any():
        raise ValueError(f"cutting the batch to {len(keep)} of {t} columns would drop real "
                         "tokens: pass widths from `needs` of every host's rows")
    if len(keep) == t:
        return batch
    fields = {name: None if getattr(batch, name) is None
              else np.asarray(getattr(batch, name))[:, keep] for name in PER_TOKEN}
    advantages = np.asarray(batch.advantages)
    if advantages.ndim == 2:  # per-token advantages are aligned with tokens too
        fields["advantages"] = advantages[:, keep]
    if sp is not None:
        fields["shared_prefix"] = SharedPrefix(prompt, sp.group)
    return dataclasses.replace(batch, **fields)


def fit(batch: TrainBatch, agree: Callable[[np.ndarray], np.ndarray] = lambda x: x
        ) -> tuple[TrainBatch, dict[str, float]]:
    """This host's rows cut to the widths every host agrees on, and the global step's
    `perf/train_tokens` (rows x columns the step computes, every host's rows) and
    `perf/train_real_tokens` (the real tokens among them), and `perf/train_columns`.

    `agree`: this host's [1, 3] `needs` → every host's [H, 3] (identity on one host); every
    host has as many rows (`batch.from_process_local`)."""
    every = np.asarray(agree(needs(batch))).reshape(-1, 3)
    out = cut(batch, *widths(batch, every))
    rows, columns = out.tokens.shape
    return out, {"perf/train_columns": float(columns),
                 "perf/train_tokens": float(rows * columns * len(every)),
                 "perf/train_real_tokens": float(every[:, 2].sum())}


TRAIN_PHASES = ("train", "train_compute", "train_wait", "train_collective")
"""The phases a step's update runs in (`loop.update`: fused, or `split_step`'s)."""


def rates(perf: dict[str, float]) -> dict[str, float]:
    """`perf/train_tokens_per_s` (every column the update computes) and
    `perf/train_real_tokens_per_s` (real tokens only), over the update's phases, from a
    step's perf metrics (`fit`'s counts and the timer's `perf/phase/*`)."""
    seconds = sum(perf.get(f"perf/phase/{k}", 0.0) for k in TRAIN_PHASES)
    if "perf/train_tokens" not in perf or seconds <= 0:
        return {}
    return {"perf/train_tokens_per_s": perf["perf/train_tokens"] / seconds,
            "perf/train_real_tokens_per_s": perf["perf/train_real_tokens"] / seconds}
