"""Finished rows refilled: a generate decoding R row slots, fewer than its rows, whose freed
slots take the next prompts' rows, so the decode batch stays full until the queue is empty
(issue 40 item 3; `Engine(refill=Refill(slots=R))`, `--rollout.refill-slots`).

Without it a generate prefills all B·G rows and decodes them together; as rows stop, the
batch is compacted (`decode.compact`), and the long tail decodes a few rows for hundreds of
steps. Here the first R / G prompts are prefilled into R slots; the decode loop
(`decode_rows`) exits once `at` slots are free (one host sync); `refill` writes the
finished rows' tokens out, prefills the next at / G prompts and writes their keys, values
and token 0 into the freed slots; the loop goes on. Once the queue is empty the rest decode
as a plain generate's do, finished rows compacted out (`_tail`); until then a free slot
not yet refilled reads next to nothing (`refill` leaves it one valid slot).

Slots: every row writes its next key at the cache's one `index`, as in a plain generate; a
refilled row's prompt goes into the P slots just before it, its earlier slots invalid, so
attention (which reads from the earliest valid block of any row) reads from the oldest live
row's prompt on. The cache holds P + 2N slots (+ a block): when a refilled row could
outgrow it, `shift` first moves every row's slots left by the blocks before the oldest live
row's prompt (a whole-cache copy, about once per N steps).

Exactness: a row keeps its global row id, so its c-th token is drawn with the uniform of
`fold_in(fold_in(key, row_id), c)` (`decode.row_draws`) wherever it runs: greedy tokens and
sampled tokens are the plain generate's wherever the logits round the same, and the
logprobs are equal to f32 rounding. They are not bitwise: an R-row batch is another XLA
program, and a refilled row's keys sit at other slots, so the blocked attention's online
softmax folds them in other groups (as compaction's smaller batches already may,
docs/design.md). One device only (the batch is not split over a mesh); single-turn only
(`extend.Conversation` does not refill); not the controller mode, whose hosts decode in
chunks through `engine.Decoding`, which refuses a refilling prefill. Memory: R rows of
P + 2N slots against the plain generate's B·G rows of P + N. On a 2-core CPU refill adds
decode steps (a row refilled late ends late) where a step's cost is mostly per-op, so it is
off by default (docs/results/engine_generation.md, "Finished rows refilled").

Legend: b prompts, r rows (R slots), p prompt length, n new tokens, s cache slots.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

from locojax.engine.decode import (
    Turn,
    compact_jit,
    first_token,
    prefill_jit,
    row_draws,
    stopped,
)
from locojax.engine.sampling import SamplingConfig, sample_with_logprobs
from locojax.model import decoder
from locojax.model.attention import as_bits, from_bits
from locojax.model.config import ModelConfig
from locojax.model.invariant_jit import model_jit
from locojax.model.params import Weights

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Refill:
    """How a generate refills its finished rows (`Engine(refill=...)`).

    slots: R, the rows decoded at once; a generate of more rows refills, one of at most R
    runs as it would without. at: free slots at which the loop stops to refill, a multiple
    of G (0: G, one prompt a time); each stop prefills at / G prompts (one host sync)."""

    slots: int
    at: int = 0

    def __post_init__(self):
        if self.slots < 1 or self.at < 0:
            raise ValueError(f"refill slots={self.slots} must be >= 1 and at={self.at} >= 0")

    def rows_per_stop(self, group: int) -> int:
        """Slots refilled per stop for G = `group`; ValueError naming what does not fit."""
        at = self.at or group
        if self.slots < group or self.slots % group:
            raise ValueError(f"refill slots={self.slots} must be a multiple of the group size "
                             f"G={group} (a prompt's G rows are prefilled together)")
        if at % group or at > self.slots:
            raise ValueError(f"refill at={at} must be a multiple of G={group} and at most "
                             f"slots={self.slots}")
        return at


def cache_slots(prompt_len: int, new_tokens: int, block: int) -> int:
    """Slots a refilling cache needs: a live row's keys span at most P + N - 1 slots before
    the index, and a refilled row needs N - 1 after it; a shift moves whole blocks."""
    return prompt_len + 2 * new_tokens + block


@dataclasses.dataclass
class Queued:
    """A refilling generate after its first prefill, waiting for `Engine.decode` (`run`)."""

    weights: Weights
    prefilled: Turn | None
    sampling: SamplingConfig
    tokens: np.ndarray  # [B, P] int32, every prompt (the first R / G are prefilled)
    mask: np.ndarray  # [B, P] bool
    limits: np.ndarray  # [B·G] int32
    key: jax.Array
    first_row: int
    group: int
    at: int


def decode_rows(weights: Weights, cache: decoder.KVCache, turn: Turn, want, *,
                model_cfg: ModelConfig, sampling: SamplingConfig) -> Turn:
    """`decode.decode`'s loop with a count per row: row r feeds its token length[r] - 1 at
    position pos0[r] + length[r] - 1, draws `draws[length[r], r]` and writes column
    length[r], so rows refilled at different steps share one batch (for rows that started
    together these are the plain loop's step, draw and column). Exits once every row has
    stopped or `want` ([] int32) rows have."""
    n = sampling.max_new_tokens
    r = turn.last.shape[0]
    log.info("compiling refill decode for rows=%d, new=%d, slots=%d", r, n, cache.v.shape[3])

    def cond(st: Turn):
        done = jnp.sum(st.done, dtype=jnp.int32)
        return (done < r) & (done < want)

    def body(st: Turn):
        c = st.length  # [R]: a live row's tokens so far
        pos = (st.pos0 + c - 1)[:, None]  # [R, 1]
        hidden, cache = decoder.forward(weights, st.last[:, None], pos, model_cfg, cache=st.cache)
        logits = decoder.logits(weights, hidden, model_cfg)[:, 0]  # [R, V]
        u = None if st.draws is None else jnp.take_along_axis(
            st.draws, jnp.minimum(c, n - 1)[None], axis=0)[0]
        tok, lp = sample_with_logprobs(logits, None, sampling, u)
        live = ~st.done
        col = jnp.where(live, c, n)  # finished rows write nothing (dropped)
        at = (jnp.arange(r), col)
        tokens = st.tokens.at[at].set(tok, mode="drop")
        done = st.done | (live & stopped(tokens, tok, c + 1, st.limit, sampling, ()))
        return dataclasses.replace(
            st, cache=cache, last=tok, tokens=tokens,
            logprobs=st.logprobs.at[at].set(lp, mode="drop"), done=done,
            length=c + live.astype(jnp.int32), step=st.step + 1)

    return jax.lax.while_loop(cond, body, dataclasses.replace(turn, cache=cache))


def _harvest(out, turn: Turn, slots, rows):
    """out's (tokens, logprobs, lengths) with the rows now in `slots` written at `rows`
    (an index past the end: a placeholder, dropped)."""
    return tuple(o.at[rows].set(x[slots], mode="drop")
                 for o, x in zip(out, (turn.tokens, turn.logprobs, turn.length)))


def refill(weights: Weights, cache: decoder.KVCache, turn: Turn, out, slots, old_rows,
           prompt_tokens, prompt_mask, new_rows, active, limit, key, first_row, *,
           model_cfg: ModelConfig, sampling: SamplingConfig, group: int):
    """Write out the rows in `slots` [k·G], prefill k prompts [k, P] and put their G rows
    each (local row ids `new_rows`, `active` False for placeholders) into those slots: keys
    and values at the P slots before `cache.index`, token 0 sampled (`decode.first_token`).
    Free slots not refilled keep one valid slot, the last written, so that attention reads
    from the oldest live row on. Returns (cache, turn, out)."""
    b, p = prompt_tokens.shape
    s, i = cache.v.shape[3], cache.index
    log.info("compiling refill for prompts=%d x %d, samples=%d, slots=%d", b, p, group, s)
    out = _harvest(out, turn, slots, old_rows)
    mask = prompt_mask.astype(bool)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)  # [B, P]: 0 at first real token
    hidden, pre = decoder.forward(weights, prompt_tokens, positions, model_cfg, mask=mask,
                                  keep_kv=True)
    logits = decoder.logits(weights, hidden[:, -1:], model_cfg)[:, 0]  # [B, V]
    rep = lambda x, axis=0: jnp.repeat(x, group, axis=axis)  # noqa: E731  [B, ...] → [kG, ...]

    def put(x, new, slot_axis):  # x [L, R, ...]: the kG rows' P slots before the index
        bits = as_bits(x)
        rows = jax.lax.dynamic_update_slice_in_dim(
            bits[:, slots], as_bits(rep(new, 1).astype(x.dtype)), i - p, slot_axis)
        return from_bits(bits.at[:, slots].set(rows), x.dtype)

    fresh = jnp.zeros((slots.shape[0], s), bool)
    fresh = jax.lax.dynamic_update_slice_in_dim(fresh, rep(mask), i - p, 1)  # [kG, S]
    idle = turn.done.at[slots].set(False)  # free slots left free
    valid = jnp.where(idle[:, None], jnp.arange(s)[None] == i - 1, cache.valid)
    cache = dataclasses.replace(cache, k=put(cache.k, pre.k, 4), v=put(cache.v, pre.v, 3),
                                valid=valid.at[slots].set(fresh))
    draws = row_draws(key, first_row + new_rows, jnp.zeros_like(new_rows), sampling)
    new = first_token(None, rep(logits), draws, rep(jnp.sum(mask, 1, dtype=jnp.int32)),
                      active, limit, sampling, ())
    turn = dataclasses.replace(
        turn, **{f: getattr(turn, f).at[slots].set(getattr(new, f)) for f in
                 ("last", "tokens", "logprobs", "done", "length", "pos0", "limit")},
        draws=None if draws is None else turn.draws.at[:, slots].set(draws))
    return cache, turn, out


def shift(cache: decoder.KVCache, by):
    """Every row's slots moved `by` ([] int32, whole blocks) to the left, the index with
    them: the slots before the oldest live row's prompt hold nothing any live row reads."""
    s = cache.v.shape[3]
    roll = lambda x, axis: from_bits(jnp.roll(as_bits(x), -by, axis), x.dtype)  # noqa: E731
    valid = roll(cache.valid, 1) & (jnp.arange(s) < s - by)[None]
    return dataclasses.replace(cache, k=roll(cache.k, 4), v=roll(cache.v, 3), valid=valid,
                               index=cache.index - by)


@jax.jit
def _finish(out, turn: Turn, rows, order, kept):
    """(tokens, mask, logprobs, lengths, steps) after the last rows are written out: the R
    slots' rows `rows`, the turn's rows in slots `order` of `kept` if the tail was compacted
    (`decode.compact`'s order and out)."""
    if kept is not None:
        turn = dataclasses.replace(turn, **{f: o.at[order].set(getattr(turn, f)) for f, o in
                                            zip(("tokens", "logprobs", "length"), kept)})
    tokens, logprobs, length = _harvest(out, turn, jnp.arange(rows.shape[0]), rows)
    mask = jnp.arange(tokens.shape[1])[None, :] < length[:, None]
    return tokens, mask, logprobs, length, turn.step - 1


def start(engine, weights: Weights, tokens: np.ndarray, mask: np.ndarray, key: jax.Array,
          sampling: SamplingConfig, group: int, first_row: int, limits) -> Queued:
    """Prefill the first R / G prompts into the engine's R-slot cache (`decode.prefill`, so
    their rows are a plain generate's at prefill); `run` decodes and refills the rest."""
    at = engine.refill.rows_per_stop(group)
    if engine.layout is not None and len(engine.layout.mesh.devices.flat) > 1:
        raise ValueError("refill decodes one device's batch; this engine's mesh has "
                         f"{len(engine.layout.mesh.devices.flat)} devices")
    r, n = engine.refill.slots, sampling.max_new_tokens
    b, p = tokens.shape
    limits = (np.full(b * group, n, np.int32) if limits is None
              else np.asarray(limits, np.int32))
    cache = engine.take_cache(r, cache_slots(p, n, engine.block))
    prefilled = prefill_jit(weights, tokens[:r // group], mask[:r // group], key,
                            jnp.asarray(first_row, jnp.int32), cache, None, limits[:r],
                            model_cfg=engine.model_cfg, sampling=sampling, num_samples=group,
                            layout=None)
    return Queued(weights, prefilled, sampling, tokens, mask, limits, key, first_row, group, at)


def _split(turn: Turn):
    return turn.cache, dataclasses.replace(turn, cache=None)


def run(engine, q: Queued):
    """Decode a `start`ed generate to its end, refilling freed slots while prompts remain;
    the cache returns to the engine. (tokens, mask, logprobs, lengths, steps), rows in the
    original order (row r: prompt r // G)."""
    prefilled, q.prefilled = q.prefilled, None  # donated: usable once
    if prefilled is None:
        raise ValueError("this prefill was already decoded")
    cache, turn = _split(prefilled)
    (b, p), g, n = q.tokens.shape, q.group, q.sampling.max_new_tokens
    r, s, blk, total = turn.last.shape[0], cache.v.shape[3], cache.block, b * g
    static = dict(model_cfg=engine.model_cfg, sampling=q.sampling)
    slot_rows = np.arange(r)  # each slot's row (`total`: a placeholder, never written out)
    start_slot = np.zeros(r, np.int64)  # each slot's prompt's first cache slot
    out = (jnp.full((total, n), q.sampling.pad_token_id, jnp.int32),
           jnp.zeros((total, n), jnp.float32), jnp.zeros((total,), jnp.int32))
    queued, per_stop = r // g, q.at // g  # the next prompt; prompts per refill
    while queued < b:
        cache, turn = _split(decode_rows_jit(q.weights, cache, turn, jnp.int32(q.at), **static))
        done, index = jax.device_get((turn.done, cache.index))  # the one host sync a stop
        index = int(index)
        if index + n - 1 > s:  # a refilled row could outgrow the cache: drop the old blocks
            live = start_slot[~done]
            by = (int(live.min()) if live.size else index - p) // blk * blk
            cache = shift_jit(cache, jnp.int32(by))
            start_slot, index = start_slot - by, index - by
            if index + n - 1 > s:  # `cache_slots` is sized so that this cannot happen
                raise RuntimeError(f"refill: no room for {n} tokens at slot {index} of {s}")
        free = np.flatnonzero(done)[:q.at]
        prompts = np.arange(queued, queued + per_stop)
        active = np.repeat(prompts < b, g)  # past the queue: placeholders, finished at once
        rows = (np.minimum(prompts, b - 1)[:, None] * g + np.arange(g)).reshape(-1)
        cache, turn, out = refill_jit(
            q.weights, cache, turn, out, free, slot_rows[free],
            q.tokens[np.minimum(prompts, b - 1)], q.mask[np.minimum(prompts, b - 1)], rows,
            active, q.limits[rows], q.key, jnp.int32(q.first_row), group=g, **static)
        slot_rows[free] = np.where(active, rows, total)
        start_slot[free] = index - p
        queued += per_stop
    cache, turn, order, kept = _tail(engine, q, cache, turn)
    engine.return_cache(cache)
    return _finish(out, turn, jnp.asarray(slot_rows), order, kept)


def _tail(engine, q: Queued, cache, turn: Turn):
    """The rows left once the queue is empty, decoded to their end, compacted as a plain
    generate's are (`Engine.decode`: once half a batch has stopped, the live rows move into
    a batch half the size, down to `engine.min_rows`). Returns (cache, turn, order, kept):
    `decode.compact`'s order and out (None if nothing was compacted)."""
    static = dict(model_cfg=engine.model_cfg, sampling=q.sampling)
    order = kept = None
    while True:
        size = turn.last.shape[0]
        half = size // 2 if (engine.min_rows is not None and size % 2 == 0
                             and size // 2 >= engine.min_rows) else 0
        want = size - half if half else size + 1  # stop once at most `half` rows are live
        cache, turn = _split(decode_rows_jit(q.weights, cache, turn, jnp.int32(want), **static))
        live = int(np.sum(~jax.device_get(turn.done))) if half else 0
        if not live:
            return cache, turn, order, kept
        while size // 2 >= max(live, engine.min_rows) and size % 2 == 0:
            size //= 2
        cache, turn, order, kept = compact_jit(cache, turn, order, kept, size=size, layout=None)


_STATIC = ("model_cfg", "sampling")
decode_rows_jit = model_jit(decode_rows, static_argnames=_STATIC, donate_argnames=("cache",))
refill_jit = model_jit(refill, static_argnames=_STATIC + ("group",),
                       donate_argnames=("cache", "out"))
shift_jit = jax.jit(shift, donate_argnames=("cache",))
