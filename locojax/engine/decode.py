"""The programs of a generate: prefill, the one decode loop, and compaction of finished rows.

`prefill` runs the prompts once and samples token 0 of every row; `decode` is the
`lax.while_loop` over a `Turn` that samples the rest; `compact` moves a turn's live rows
into a smaller batch. `engine.Engine` runs them for a single-turn generate (one turn, a
limit of N tokens per row, no stop sequences); `extend.Conversation` runs prefill and decode
for every turn of a multi-turn conversation. Each is a module-level jit with the cache
donated; every forward is `decoder.forward`, the function the trainer differentiates.

A row stops a turn at a stop token (EOS, counted from min_new_tokens), at the end of a stop
sequence, or at its own token budget (`limit`): `stopped`. Randomness: a row's c-th model
token is drawn with `fold_in(fold_in(key, row_id), c)` (`row_draws`), all of a turn's draws
before its loop, so a row's tokens depend on neither its batch, the compaction, the device
layout nor the host.

References: gemma's sampler (state + while_loop), jax-llm-examples `qwen3` (donated cache),
nanochat `engine.py` (prefill once, then clone the cache per sample).

Legend: b prompts, r rows, p prompt length, n new tokens, s cache slots, v vocab.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from locojax.engine.sampling import SamplingConfig, sample_with_logprobs, uniform_draws
from locojax.model import decoder, sharding
from locojax.model.config import ModelConfig
from locojax.model.invariant_jit import model_jit
from locojax.model.params import Weights

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static description of how arrays are laid out on a mesh (hashable for jit)."""

    mesh: Mesh
    rules: tuple[tuple[str, object], ...]

    def sharding(self, axes, shape) -> NamedSharding:
        return NamedSharding(self.mesh, sharding.spec(axes, shape, self.mesh, dict(self.rules)))

    def constrain(self, x, axes):
        return jax.lax.with_sharding_constraint(x, self.sharding(axes, x.shape))


K_AXES = ("layers", "batch", "kv_heads", "head_dim", None)  # decoder.KVCache layouts
V_AXES = ("layers", "batch", "kv_heads", None, "head_dim")


def constrain_cache(layout: Layout | None, cache: decoder.KVCache) -> decoder.KVCache:
    """The cache laid out as the engine keeps it (batch over `data`); a no-op without a mesh."""
    if layout is None:
        return cache
    return dataclasses.replace(
        cache, k=layout.constrain(cache.k, K_AXES), v=layout.constrain(cache.v, V_AXES),
        valid=layout.constrain(cache.valid, ("batch", None)))

StopSequences = tuple[tuple[int, ...], ...]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Turn:
    """The decode loop's carry (one turn of R rows) and its invariants (draws, pos0, limit).

    A single-turn generate is one turn whose limit is N for every row, without stop
    sequences; a multi-turn conversation (`extend.py`) runs one per model turn."""

    cache: decoder.KVCache
    last: jax.Array  # [R] int32, the token sampled last (fed at the next step)
    tokens: jax.Array  # [R, N] int32, this turn's tokens; pad after a row stopped
    logprobs: jax.Array  # [R, N] f32; 0 after a row stopped
    done: jax.Array  # [R] bool
    length: jax.Array  # [R] int32, this turn's tokens so far
    step: jax.Array  # [] int32, tokens sampled this turn by the live rows
    draws: jax.Array | None  # [N, R] f32 uniforms of this turn (None: greedy)
    pos0: jax.Array  # [R] int32, position of this turn's token 0
    limit: jax.Array  # [R] int32, most tokens this turn


def stopped(tokens, tok, count, limit, sampling: SamplingConfig, stops: StopSequences):
    """[R] bool: a live row is done after `count` tokens (tok the last, already written at
    column count - 1 of tokens): its budget, a counting stop token (count ≥ min_new_tokens),
    or the end of a stop sequence."""
    out = count >= limit
    if sampling.stop_token_ids and not sampling.ignore_eos:
        is_stop = jnp.any(tok[:, None] == jnp.asarray(sampling.stop_token_ids, jnp.int32), -1)
        out |= is_stop & (count >= sampling.min_new_tokens)
    for seq in stops:  # live rows are in lockstep: their last k tokens are one shared window
        k = len(seq)
        if k > tokens.shape[1]:  # longer than a turn: can never complete in one
            continue
        window = jax.lax.dynamic_slice_in_dim(tokens, jnp.maximum(count - k, 0), k, axis=1)
        out |= (count >= k) & jnp.all(window == jnp.asarray(seq, jnp.int32)[None], axis=1)
    return out


def row_draws(key, row_ids, count, sampling: SamplingConfig):
    """[N, R] uniforms: row r's draw for its model token count[r] + t at [t, r], from
    `fold_in(fold_in(key, row_ids[r]), count[r] + t)`; None when greedy.

    A row's tokens so depend on neither its batch, the device layout nor the host
    (docs/design.md, mode equivalence). All steps' draws at once, before the loop: one threefry
    call instead of one per step (threefry is most of the compile time of a decode loop and
    ~1 ms per step on CPU)."""
    if sampling.greedy:
        return None
    row_keys = jax.vmap(jax.random.fold_in, (None, 0))(key, row_ids)
    r = row_ids.shape[0]
    return jax.vmap(lambda t: uniform_draws(
        jax.vmap(jax.random.fold_in)(row_keys, count + t), r))(
        jnp.arange(sampling.max_new_tokens))


def first_token(cache, logits, draws, pos0, active, limit, sampling: SamplingConfig,
                stops: StopSequences) -> Turn:
    """The turn after its token 0, sampled from logits [R, V]. active: [R] bool rows that
    take part (None: all); limit: [R] most tokens per row (None: N)."""
    r, n = logits.shape[0], sampling.max_new_tokens
    first, lp = sample_with_logprobs(logits, None, sampling, None if draws is None else draws[0])
    tokens = jnp.full((r, n), jnp.int32(sampling.pad_token_id)).at[:, 0].set(first)
    limit = jnp.full((r,), n, jnp.int32) if limit is None else limit
    done = stopped(tokens, first, jnp.int32(1), limit, sampling, stops)
    return Turn(cache=cache, last=first, tokens=tokens,
                logprobs=jnp.zeros((r, n), jnp.float32).at[:, 0].set(lp),
                done=done if active is None else done | ~active,
                length=jnp.ones((r,), jnp.int32), step=jnp.asarray(1, jnp.int32), draws=draws,
                pos0=pos0, limit=limit)


def check_prompts(tokens: np.ndarray, mask: np.ndarray, vocab_size: int) -> None:
    """What `prefill` takes, checked on the host: [B, P] ids, left-padded, every row with a
    real token, every real id in the vocabulary. Raise ValueError naming the first row that
    is not."""
    if tokens.ndim != 2 or tokens.shape != mask.shape:
        raise ValueError(
            f"prompt_tokens {tokens.shape} and prompt_mask {mask.shape} must both be [B, P]")
    for i in range(tokens.shape[0]):
        m = mask[i]
        if not m.any():
            raise ValueError(f"prompt row {i} has no real token")
        if not m[np.argmax(m):].all():
            raise ValueError(f"prompt row {i} is not left-padded (mask {m.astype(int).tolist()})")
        bad = (tokens[i] < 0) | (tokens[i] >= vocab_size)
        if (bad & m).any():
            raise ValueError(f"prompt row {i} has token id {int(tokens[i][bad & m][0])} outside "
                             f"[0, {vocab_size})")


def prefill(weights: Weights, prompt_tokens, prompt_mask, key, first_row, cache: decoder.KVCache,
            active=None, limit=None, *, model_cfg: ModelConfig, sampling: SamplingConfig,
            stops: StopSequences = (), num_samples: int, layout: Layout | None) -> Turn:
    """Prefill B prompts once into the donated [R]-row cache (each repeated G times) and
    sample token 0 of every row: the turn that `decode` goes on with."""
    b, p = prompt_tokens.shape
    g, n = num_samples, sampling.max_new_tokens
    r, s = b * g, cache.v.shape[3]
    log.info("compiling generate for shape prompts=%d x %d, samples=%d, new=%d, slots=%d, "
             "stops=%s, %s", b, p, g, n, s, stops, sampling)

    # Prefill the B distinct prompts once into a P-slot cache.
    mask = prompt_mask.astype(bool)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)  # [B, P]: 0 at first real token
    prompt_len = jnp.sum(mask, axis=1, dtype=jnp.int32)  # [B]
    hidden, pre = decoder.forward(weights, prompt_tokens, positions, model_cfg, mask=mask,
                                  keep_kv=True)
    logits = decoder.logits(weights, hidden[:, -1:], model_cfg)[:, 0]  # [B, V]

    def rows(x, axis=0):  # [B, ...] → [R, ...], prompt-major
        return jnp.repeat(x, g, axis=axis) if g > 1 else x

    # Copy each prompt's keys/values G times into the donated [L, R, K, ·, ·] buffer.
    # Slots ≥ P keep stale values from the last call; `valid` hides them until written.
    k = jax.lax.dynamic_update_slice_in_dim(cache.k, rows(pre.k, 1).astype(cache.k.dtype), 0, 4)
    v = jax.lax.dynamic_update_slice_in_dim(cache.v, rows(pre.v, 1).astype(cache.v.dtype), 0, 3)
    valid = jnp.zeros((r, s), bool).at[:, :p].set(rows(mask))
    cache = constrain_cache(layout, dataclasses.replace(
        cache, k=k, v=v, valid=valid, index=jnp.asarray(p, jnp.int32)))
    draws = row_draws(key, first_row + jnp.arange(r), jnp.zeros(r, jnp.int32), sampling)
    return first_token(cache, rows(logits), draws, rows(prompt_len), active, limit, sampling,
                       stops)


def decode(weights: Weights, cache: decoder.KVCache, turn: Turn, until=None, stop_at=None, *,
           model_cfg: ModelConfig, sampling: SamplingConfig, stops: StopSequences = (),
           layout: Layout | None) -> Turn:
    """Tokens 1..N-1 of a turn in a `lax.while_loop` that exits once every row has stopped,
    or (until: [] int32) once no device holds more than `until` live rows: the engine then
    compacts them (`compact`) and goes on in a smaller batch, or (stop_at: [] int32) once
    the turn's step reaches `stop_at`: the engine goes on from the returned turn with the
    next bound, in the same program (`engine.Decoding`, a controller's K iterations per
    round trip).

    `turn.cache` is None: the cache travels apart, as the one donated argument. Donating
    all of the turn also gave its per-row flags, which no output can reuse, and JAX warned
    of it at every compile. Returns the turn, cache included."""
    n = sampling.max_new_tokens
    turn = dataclasses.replace(turn, cache=cache)
    pad = jnp.int32(sampling.pad_token_id)
    log.info("compiling decode for rows=%d, new=%d, slots=%d, %s cache, stops=%s",
             turn.last.shape[0], n, cache.v.shape[3], cache.v.dtype, stops)

    def cond(st: Turn):
        go = (st.step < n) & ~jnp.all(st.done)
        if until is not None:
            go &= jnp.max(jnp.sum(~st.done.reshape(cache.shards, -1), axis=1)) > until
        if stop_at is not None:
            go &= st.step < stop_at
        return go

    def body(st: Turn):
        pos = (st.pos0 + st.step - 1)[:, None]  # [R, 1]: token step-1's position
        hidden, cache = decoder.forward(weights, st.last[:, None], pos, model_cfg, cache=st.cache)
        logits = decoder.logits(weights, hidden, model_cfg)[:, 0]  # [R, V]
        tok, lp = sample_with_logprobs(logits, None, sampling,
                                       None if st.draws is None else st.draws[st.step])
        live = ~st.done
        tokens = jax.lax.dynamic_update_slice_in_dim(
            st.tokens, jnp.where(live, tok, pad)[:, None], st.step, 1)
        logprobs = jax.lax.dynamic_update_slice_in_dim(
            st.logprobs, jnp.where(live, lp, 0.0)[:, None], st.step, 1)
        done = st.done | (live & stopped(tokens, tok, st.step + 1, st.limit, sampling, stops))
        return dataclasses.replace(
            st, cache=constrain_cache(layout, cache), last=tok, tokens=tokens,
            logprobs=logprobs, done=done, length=st.length + live.astype(jnp.int32),
            step=st.step + 1)

    return jax.lax.while_loop(cond, body, turn)


_STATIC = ("model_cfg", "sampling", "stops", "layout")
prefill_jit = model_jit(prefill, static_argnames=_STATIC + ("num_samples",),
                        donate_argnames=("cache",))
decode_jit = model_jit(decode, static_argnames=_STATIC, donate_argnames=("cache",))
"""The two jit boundaries of a generate (and of each turn of a conversation), static
configs: the cache is donated into prefill, travels in the `Turn`, is donated into decode on
its own (`Engine.decode`) and is handed back. Two programs rather than one cost one
dispatch and let a profiler time prefill and decode apart at a device-synchronised
boundary."""

def compact(cache: decoder.KVCache, turn: Turn, order, out, *, size: int, layout):
    """Move a turn's live rows into the first `size` rows of the cache, in place.

    On each of the cache's shards (devices) the live rows come first, in order, then as many
    finished ones as fill size / shards rows (finished rows change nothing: their tokens are
    final and they write only pad). Only the written blocks of the cache move. order: [R]
    the original row of each row now; out: the original rows' (tokens, logprobs, lengths)
    so far, None before the first compaction. Returns them after this one, and the turn."""
    d, r = cache.shards, turn.last.shape[0]
    log.info("compiling compact for rows=%d -> %d, slots=%d", r, size, cache.v.shape[3])
    if out is None:
        order, out = jnp.arange(r), (turn.tokens, turn.logprobs, turn.length)
    else:
        out = tuple(o.at[order].set(x) for o, x in
                    zip(out, (turn.tokens, turn.logprobs, turn.length)))
    local = jnp.argsort(turn.done.reshape(d, r // d), axis=1, stable=True)[:, :size // d]
    rows = (local + (r // d) * jnp.arange(d)[:, None]).reshape(size)  # [size] of the R rows
    take = lambda x, axis=0: jnp.take(x, rows, axis=axis)  # noqa: E731
    turn = dataclasses.replace(
        turn, last=take(turn.last), tokens=take(turn.tokens), logprobs=take(turn.logprobs),
        done=take(turn.done), length=take(turn.length), pos0=take(turn.pos0),
        limit=take(turn.limit), draws=None if turn.draws is None else take(turn.draws, 1))

    def gather(x, axis):  # x: the R rows' [.., R, ..] → the kept rows' [.., size, ..]
        y = x.reshape(x.shape[:axis] + (d, r // d) + x.shape[axis + 1:])
        idx = local.reshape((1,) * axis + local.shape + (1,) * (x.ndim - axis - 1))
        y = jnp.take_along_axis(y, idx, axis=axis + 1)
        return y.reshape(x.shape[:axis] + (size,) + x.shape[axis + 1:])

    blk = cache.block
    L, _, kv, h, _ = cache.k.shape
    zero = jnp.zeros((), jnp.int32)

    def move(j, c):  # block j of every layer
        first = jnp.asarray(j * blk, jnp.int32)
        k = c.read(c.k, 1, r, (zero, zero, zero, first), (L, kv, h, blk))
        v = c.read(c.v, 1, r, (zero, zero, first, zero), (L, kv, blk, h))
        return dataclasses.replace(c, k=c.write(c.k, gather(k, 1), 1, 4, first),
                                   v=c.write(c.v, gather(v, 1), 1, 3, first))

    blocks = (cache.index + blk - 1) // blk
    cache = jax.lax.fori_loop(0, blocks, move, cache)
    valid = cache.read(cache.valid, 0, r, (zero,), cache.valid.shape[1:])
    cache = dataclasses.replace(cache, valid=cache.write(cache.valid, gather(valid, 0), 0, 1, 0))
    return constrain_cache(layout, cache), dataclasses.replace(turn, cache=None), order[rows], out


compact_jit = jax.jit(compact, static_argnames=("size", "layout"), donate_argnames=("cache",))
