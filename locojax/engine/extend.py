"""Multi-turn generation: each row goes on in its own KV cache after an environment turn.

A conversation on the engine is `begin` (prefill the prompts, sample token 0 of turn 1),
then `decode` (the turn's `while_loop`, until every row has stopped) and, for the rows that
go on, `extend`: write the tokens appended since (the turn's last kept token, never fed yet,
then the observation) into the row's cache and sample token 0 of the next turn from the
last one's logits; `decode` again; and so on. The history is never prefilled twice.

A row stops a turn at a stop token (EOS), at the end of a stop sequence (the token ids of
`</tool>`: the turn is cut at the token level, inside the loop), or at its own token budget
for the turn (`limit`, which is how a trajectory's total-token limit is enforced exactly).

Cache layout: slots are shared, rows are not. Every row writes slot `index` at once (one
in-place `dynamic_update_slice`, as in single-turn decode), but each row has its own RoPE
positions, contiguous over its real tokens, and its own `valid` mask. A row that stopped
before the turn's slowest row, or whose turn the host cut shorter, leaves invalid slots
(holes) that attention never reads; an extend block is right-aligned, holes on its left.
So rows continue at their own offsets with different observation lengths, and no row's
keys are ever moved. Slots needed in the worst case: `slots_needed`.

Rows whose trajectory ended (answer given, error, out of turns) are compacted out before
the next turn (`compact=True`: the live rows are gathered into a batch of the next size
in a short ladder of bucket sizes, so they cost no decode work), or kept and masked
(`compact=False`: one shape, no gather, but every row is computed). benchmarks/
bench_extend.py measures both, and extend against re-prefilling the history.

Randomness: a row's c-th model token (counted over all its turns) is drawn with
`fold_in(fold_in(key, row_id), c)`, row_id its global row index, so a row's tokens depend
on neither its batch, the compaction, the device layout nor the host. Turn 1 is exactly
`Engine.generate`'s draw (c = t), and runs the same prefill.

Legend: r rows, w extend-block width, n new tokens per turn, s cache slots, v vocab.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from locojax.engine.decode import (
    StopSequences,
    Turn,
    check_prompts,
    constrain_cache,
    decode_jit,
    first_token,
    prefill_jit,
    row_draws,
)
from locojax.engine.sampling import SamplingConfig
from locojax.model import decoder
from locojax.model.config import ModelConfig
from locojax.model.invariant_jit import model_jit

log = logging.getLogger(__name__)

def slots_needed(prompt_len: int, max_new_tokens: int, max_turns: int, max_block: int) -> int:
    """Cache slots a conversation may need: the prompt, n - 1 per turn (a turn's last token
    is only fed by the next extend), and one extend block per turn after the first."""
    return prompt_len + max_turns * (max_new_tokens - 1) + (max_turns - 1) * max_block


def _extend(weights, cache: decoder.KVCache, gather, keep_until, block, block_mask, block_pos,
            key, row_ids, count, active, limit, *, model_cfg: ModelConfig,
            sampling: SamplingConfig, stops: StopSequences, layout) -> Turn:
    """Continue rows after an environment turn: (gather the live rows,) drop the slots of
    tokens the host cut, write the [R, W] right-aligned block at slot `index`, and sample
    token 0 of the next turn from each row's last block token."""
    log.info("compiling extend for rows=%d, block=%d, slots=%d, gather=%s", block.shape[0],
             block.shape[1], cache.v.shape[3], gather is not None)
    if gather is not None:  # [R'] rows of the previous batch, in their new order
        cache = dataclasses.replace(cache, k=cache.k[:, gather], v=cache.v[:, gather],
                                    valid=cache.valid[gather])
    slot = jnp.arange(cache.v.shape[3])[None]  # [1, S]
    cut = (slot >= keep_until[:, None]) & (slot < cache.index)  # fed tokens the host dropped
    cache = constrain_cache(layout, dataclasses.replace(cache, valid=cache.valid & ~cut))
    hidden, cache = decoder.forward(weights, block, block_pos, model_cfg, mask=block_mask,
                                    cache=cache)
    logits = decoder.logits(weights, hidden[:, -1:], model_cfg)[:, 0]  # [R, V]
    draws = row_draws(key, row_ids, count, sampling)
    return first_token(constrain_cache(layout, cache), logits, draws, block_pos[:, -1] + 1,
                       active, limit, sampling, stops)


_STATIC = ("model_cfg", "sampling", "stops", "layout")
extend_jit = model_jit(_extend, static_argnames=_STATIC, donate_argnames=("cache",))
compact_extend_jit = model_jit(_extend, static_argnames=_STATIC)
"""The jit boundaries besides the engine's prefill (turn 1) and decode (every turn): extend
(one environment turn's tokens), donating the cache; extend with a gather (compaction)
makes a smaller cache, so it cannot reuse the old buffer and donates nothing (the old one is
dropped)."""


@dataclasses.dataclass
class TurnOutput:
    """One turn of the rows asked for, on the host, in the order asked."""

    tokens: np.ndarray  # [n_rows, N] int32 (pad after a row's length)
    logprobs: np.ndarray  # [n_rows, N] f32 behaviour logprobs (0 after length)
    lengths: np.ndarray  # [n_rows] int32 tokens of this turn
    steps: int  # decode steps the loop ran (the slowest row's length - 1)


def bucket(n: int, full: int, multiple: int) -> int:
    """The batch size live rows are compacted to: `full` halved while it still holds n (and
    stays a multiple of the devices), so a run compiles for a handful of sizes."""
    size = full
    while size % 2 == 0 and (size // 2) % multiple == 0 and size // 2 >= n:
        size //= 2
    return size


def _block_width(need: int, max_block: int) -> int:
    """Extend-block width: the next power of two (few compiles), at most max_block."""
    return min(max(1, 1 << (need - 1).bit_length()), max_block)


class Conversation:
    """One batch of rows on an engine, turn by turn (host-side handle; see the module doc).

    Rows are named by their local index 0..R-1 (prompt-major, as `Engine.generate`); row r
    samples with global row id `first_row + r`. `begin` returns turn 1 of every row;
    `extend(rows, keep, appended, limits)` continues the named rows: the last turn's first
    `keep` tokens are kept (the rest is cut), `appended` (environment tokens) follow, and
    the next turn of those rows is returned. `close` hands the cache back to the engine.

    `engine` is an `engine.Engine`, whose cache, layout and weight placement the rows use.
    This module imports nothing from engine.py, which imports it (`Engine.conversation`):
    one direction only (tests/test_import_layers.py).
    """

    def __init__(self, engine, sampling: SamplingConfig, slots: int,
                 stops: StopSequences = (), max_block: int = 64, compact: bool = True):
        if any(not seq for seq in stops):
            raise ValueError("stop sequences must be non-empty token id tuples")
        self.engine, self.sampling, self.slots = engine, sampling, slots
        self.stops = tuple(tuple(int(t) for t in s) for s in stops)
        self.max_block, self.compact = max_block, compact
        layout = engine.layout
        self._devices = 1 if layout is None else layout.mesh.devices.size
        self._turn: Turn | None = None
        self._asked: np.ndarray | None = None

    # --- placement --------------------------------------------------------------------------

    def _put(self, x: np.ndarray):
        layout = self.engine.layout
        if layout is None:
            return jnp.asarray(x)
        return jax.device_put(x, layout.sharding(("batch",) + (None,) * (x.ndim - 1), x.shape))

    # --- the turns --------------------------------------------------------------------------

    def begin(self, weights, prompt_tokens: np.ndarray, prompt_mask: np.ndarray,
              key: jax.Array, num_samples: int = 1, first_row: int = 0,
              limits: Sequence[int] | None = None,
              active: Sequence[bool] | None = None) -> None:
        """Prefill [B, P] left-padded prompts (G = num_samples rows each) and sample token 0
        of turn 1 (dispatched; `decode` runs the turn). limits: [R] most tokens of turn 1 per
        row (default N); active: [R] rows to run."""
        eng, s = self.engine, self.sampling
        s.validate_vocab(eng.model_cfg.vocab_size)
        tokens, mask = np.asarray(prompt_tokens, np.int32), np.asarray(prompt_mask, bool)
        check_prompts(tokens, mask, eng.model_cfg.vocab_size)
        b, p = tokens.shape
        r = b * num_samples
        if p + s.max_new_tokens - 1 > self.slots:
            raise ValueError(f"{p} prompt columns + {s.max_new_tokens} new tokens do not fit "
                             f"{self.slots} cache slots")
        if r % self._devices:
            raise ValueError(f"{r} rows do not split over {self._devices} devices")
        self.weights = eng.place_weights(weights)
        self.key, self.first_row = key, first_row
        self._rows = np.arange(r)  # local row of each batch position (-1: filler)
        self._n_real = np.repeat(mask.sum(1), num_samples).astype(np.int64)  # prompt tokens
        self._count = np.zeros(r, np.int64)  # model tokens kept so far
        self._index = p  # the shared next slot
        limits = np.full(r, s.max_new_tokens) if limits is None else np.asarray(limits)
        active = np.ones(r, bool) if active is None else np.asarray(active, bool)
        cache = eng.take_cache(r, self.slots)
        tokens_d, mask_d = self._put(tokens), self._put(mask)
        self._turn = prefill_jit(
            self.weights, tokens_d, mask_d, key, jnp.asarray(first_row, jnp.int32), cache,
            self._put(active), self._put(np.minimum(limits, s.max_new_tokens).astype(np.int32)),
            model_cfg=eng.model_cfg, sampling=s, stops=self.stops,
            num_samples=num_samples, layout=eng.layout)
        self._asked = np.arange(r)

    def extend(self, rows: Sequence[int], keep: Sequence[int], appended: Sequence[Sequence[int]],
               limits: Sequence[int]) -> None:
        """Continue `rows` (local indices, each live in the last turn) up to token 0 of their
        next turn (dispatched; `decode` runs the turn and returns it in the order of `rows`).
        keep[i]: tokens of the last turn kept (1 ≤ keep ≤ its length); appended[i]:
        environment tokens (fewer than max_block); limits[i]: most tokens of the next turn."""
        if self._turn is None:
            raise ValueError("extend before begin, or after close")
        s, eng = self.sampling, self.engine
        rows = [int(x) for x in rows]
        if not rows:
            raise ValueError("extend needs at least one row")
        pos_of = {int(x): i for i, x in enumerate(self._rows) if x >= 0}
        for x, k in zip(rows, keep):
            if x not in pos_of:
                raise ValueError(f"row {x} is not live in this conversation")
            if not 1 <= k <= self._last_len[pos_of[x]]:
                raise ValueError(f"row {x}: keep={k} outside 1..{self._last_len[pos_of[x]]}")
        need = max(1 + len(a) for a in appended)
        if need > self.max_block:
            raise ValueError(f"{need - 1} appended tokens exceed max_block - 1 = "
                             f"{self.max_block - 1}")
        w = _block_width(need, self.max_block)
        if self._index + w + s.max_new_tokens - 1 > self.slots:
            raise ValueError(f"the next turn needs slots up to "
                             f"{self._index + w + s.max_new_tokens - 1}, more than the "
                             f"{self.slots} allocated (see slots_needed)")
        # The batch after this extend: compacted (live rows only, in the order asked, then
        # filler), or the same rows with the ones not asked for masked.
        size = len(self._rows)
        new_size = bucket(len(rows), size, self._devices) if self.compact else size
        if new_size < size:
            order = rows + [-1] * (new_size - len(rows))
            gather = np.asarray([pos_of[x] for x in rows] + [pos_of[rows[0]]] * (
                new_size - len(rows)), np.int32)
        else:
            order, gather = [int(x) for x in self._rows], None
        where = {x: i for i, x in enumerate(order)}
        n = len(order)
        block = np.full((n, w), s.pad_token_id, np.int32)
        bmask = np.zeros((n, w), bool)
        bpos = np.zeros((n, w), np.int32)
        keep_until = np.zeros(n, np.int32)
        row_ids, count = np.zeros(n, np.int32), np.zeros(n, np.int32)
        active, lim = np.zeros(n, bool), np.ones(n, np.int32)
        for x, k, app, li in zip(rows, keep, appended, limits):
            i, old = where[x], pos_of[x]
            seq = [int(self._last_tokens[old, k - 1]), *map(int, app)]
            block[i, w - len(seq):], bmask[i, w - len(seq):] = seq, True
            start = self._n_real[x] + k - 1  # the last kept token's position
            bpos[i, w - len(seq):] = start + np.arange(len(seq))
            bpos[i, :w - len(seq)] = start  # holes: any position, never attended
            keep_until[i] = self._base + k - 1
            self._n_real[x] += k + len(app)
            self._count[x] += k
            count[i], active[i], lim[i] = self._count[x], True, min(int(li), s.max_new_tokens)
        for i, x in enumerate(order):
            row_ids[i] = self.first_row + max(x, 0)
        turn, self._turn = self._turn, None
        run = extend_jit if gather is None else compact_extend_jit
        self._turn = run(
            self.weights, turn.cache, None if gather is None else self._put(gather),
            self._put(keep_until), self._put(block), self._put(bmask), self._put(bpos),
            self.key, self._put(row_ids), self._put(count), self._put(active), self._put(lim),
            model_cfg=eng.model_cfg, sampling=s, stops=self.stops, layout=eng.layout)
        self._rows = np.asarray(order)
        self._index += w
        self._asked = np.asarray(rows)

    @property
    def pending(self):
        """The dispatched device state (block on it to time begin / extend alone)."""
        return self._turn

    def decode(self) -> TurnOutput:
        """Run the turn begun by `begin` or `extend`; its tokens, rows in the order asked."""
        if self._turn is None or self._asked is None:
            raise ValueError("decode needs a begin or extend first")
        eng, rows, self._asked = self.engine, self._asked, None
        base = self._index
        turn, self._turn = self._turn, None
        self._turn = decode_jit(self.weights, turn.cache, dataclasses.replace(turn, cache=None),
                                model_cfg=eng.model_cfg, sampling=self.sampling,
                                stops=self.stops, layout=eng.layout)
        t = self._turn
        tokens, logprobs, lengths, step = jax.device_get((t.tokens, t.logprobs, t.length, t.step))
        steps = int(step) - 1
        self._base, self._index = base, base + steps
        self._last_tokens, self._last_len = np.asarray(tokens), np.asarray(lengths)
        at = {int(x): i for i, x in enumerate(self._rows) if x >= 0}
        idx = np.asarray([at[int(x)] for x in rows])
        n = self.sampling.max_new_tokens
        valid = np.arange(n)[None] < self._last_len[idx][:, None]
        return TurnOutput(np.where(valid, self._last_tokens[idx], self.sampling.pad_token_id),
                          np.where(valid, np.asarray(logprobs)[idx], 0.0).astype(np.float32),
                          self._last_len[idx].astype(np.int32), steps)

    def close(self) -> None:
        """Hand the cache back to the engine (its next call reuses it if the shape fits)."""
        if self._turn is not None:
            self.engine.return_cache(self._turn.cache)
            self._turn = None


