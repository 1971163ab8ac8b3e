"""Batched generation: one jitted prefill + `lax.while_loop` decode over a donated KV cache.

The engine sees token ids only (DESIGN.md: "the engine knows nothing about tokenization").
Every forward is `qwen3.forward`, the function the trainer differentiates, and the returned
logprobs are those of the temperature-scaled policy, so sampler and trainer logprobs agree
to f32 rounding (DESIGN.md, correctness contracts).

Shapes are static per call: B prompts of P (left-padded) tokens, G samples per prompt,
R = B·G rows, N = max_new_tokens, S = P + N - 1 cache slots (the last sampled token is
never fed back, so it needs no slot). A left-padded prompt's positions start at 0 at its
first real token; pad slots are marked invalid in the cache and never attended to.

With `num_samples=G` (GRPO groups) each prompt is prefilled once and its cache repeated G
times; rows are prompt-major (row r belongs to prompt r // G).

Randomness: row r draws step t from `fold_in(fold_in(key, first_row + r), t)`, all drawn
before the loop, so a row's tokens depend on neither its batch nor the device layout.

One decode loop (`decode`, over a `Turn`) serves a generate and every turn of a multi-turn
conversation (`extend.py`): a generate is one turn with a limit of N tokens per row and no
stop sequences.

References: jax-llm-examples `qwen3` (donated cache), gemma's sampler (state + while_loop),
nanochat `engine.py` (prefill once, then clone the cache per sample).
Departure: sampling uses one uniform per row (see `sampling.py`), not Gumbel-max.

Legend: b prompts, r rows (b·G), p prompt length, n new tokens, s cache slots, v vocab.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from locojax.engine.sampling import SamplingConfig, sample_with_logprobs, uniform_draws
from locojax.model import params as params_lib
from locojax.model import qwen3, sharding
from locojax.model.config import ModelConfig
from locojax.model.params import Weights

log = logging.getLogger(__name__)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Generation:
    """What one `generate` call returns (rows prompt-major: row r is prompt r // G)."""

    tokens: jax.Array  # [R, N] int32; pad_token_id after a row stopped
    mask: jax.Array  # [R, N] bool; True for generated tokens, the stop token included
    logprobs: jax.Array  # [R, N] f32; log π(token), π the τ-scaled untruncated policy; 0 on pad
    lengths: jax.Array  # [R] int32; number of True in mask
    steps: jax.Array  # [] int32; decode steps run after prefill (early exit makes it < N - 1)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Static description of how arrays are laid out on a mesh (hashable for jit)."""

    mesh: Mesh
    rules: tuple[tuple[str, object], ...]

    def sharding(self, axes, shape) -> NamedSharding:
        return NamedSharding(self.mesh, sharding.spec(axes, shape, self.mesh, dict(self.rules)))

    def constrain(self, x, axes):
        return jax.lax.with_sharding_constraint(x, self.sharding(axes, x.shape))


_K_AXES = ("layers", "batch", "kv_heads", "head_dim", None)  # qwen3.KVCache layouts
_V_AXES = ("layers", "batch", "kv_heads", None, "head_dim")


def constrain_cache(layout: _Layout | None, cache: qwen3.KVCache) -> qwen3.KVCache:
    """The cache laid out as the engine keeps it (batch over `data`); a no-op without a mesh."""
    if layout is None:
        return cache
    return qwen3.KVCache(
        layout.constrain(cache.k, _K_AXES), layout.constrain(cache.v, _V_AXES),
        layout.constrain(cache.valid, ("batch", None)), cache.index)


StopSequences = tuple[tuple[int, ...], ...]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Turn:
    """The decode loop's carry (one turn of R rows) and its invariants (draws, pos0, limit).

    A single-turn generate is one turn whose limit is N for every row, without stop
    sequences; a multi-turn conversation (`extend.py`) runs one per model turn."""

    cache: qwen3.KVCache
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
    (DESIGN.md, mode equivalence). All steps' draws at once, before the loop: one threefry
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


def prefill(weights: Weights, prompt_tokens, prompt_mask, key, first_row, cache: qwen3.KVCache,
            active=None, limit=None, *, model_cfg: ModelConfig, sampling: SamplingConfig,
            stops: StopSequences = (), num_samples: int, layout: _Layout | None) -> Turn:
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
    hidden, pre = qwen3.forward(weights, prompt_tokens, positions, model_cfg, mask=mask,
                                keep_kv=True)
    logits = qwen3.logits(weights, hidden[:, -1:], model_cfg)[:, 0]  # [B, V]

    def rows(x, axis=0):  # [B, ...] → [R, ...], prompt-major
        return jnp.repeat(x, g, axis=axis) if g > 1 else x

    # Copy each prompt's keys/values G times into the donated [L, R, K, ·, ·] buffer.
    # Slots ≥ P keep stale values from the last call; `valid` hides them until written.
    k = jax.lax.dynamic_update_slice_in_dim(cache.k, rows(pre.k, 1).astype(cache.k.dtype), 0, 4)
    v = jax.lax.dynamic_update_slice_in_dim(cache.v, rows(pre.v, 1).astype(cache.v.dtype), 0, 3)
    valid = jnp.zeros((r, s), bool).at[:, :p].set(rows(mask))
    cache = constrain_cache(layout, qwen3.KVCache(k, v, valid, jnp.asarray(p, jnp.int32)))
    draws = row_draws(key, first_row + jnp.arange(r), jnp.zeros(r, jnp.int32), sampling)
    return first_token(cache, rows(logits), draws, rows(prompt_len), active, limit, sampling,
                       stops)


def decode(weights: Weights, cache: qwen3.KVCache, turn: Turn, *, model_cfg: ModelConfig,
           sampling: SamplingConfig, stops: StopSequences = (), layout: _Layout | None) -> Turn:
    """Tokens 1..N-1 of a turn in a `lax.while_loop` that exits once every row has stopped.

    `turn.cache` is None: the cache travels apart, as the one donated argument. Donating
    all of the turn also gave its per-row flags, which no output can reuse, and JAX warned
    of it at every compile. Returns the turn, cache included."""
    n = sampling.max_new_tokens
    turn = dataclasses.replace(turn, cache=cache)
    pad = jnp.int32(sampling.pad_token_id)
    log.info("compiling decode for rows=%d, new=%d, slots=%d, stops=%s",
             turn.last.shape[0], n, cache.v.shape[3], stops)

    def cond(st: Turn):
        return (st.step < n) & ~jnp.all(st.done)

    def body(st: Turn):
        pos = (st.pos0 + st.step - 1)[:, None]  # [R, 1]: token step-1's position
        hidden, cache = qwen3.forward(weights, st.last[:, None], pos, model_cfg, cache=st.cache)
        logits = qwen3.logits(weights, hidden, model_cfg)[:, 0]  # [R, V]
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
prefill_jit = jax.jit(prefill, static_argnames=_STATIC + ("num_samples",),
                      donate_argnames=("cache",))
decode_jit = jax.jit(decode, static_argnames=_STATIC, donate_argnames=("cache",))
"""The two jit boundaries of a generate (and of each turn of a conversation), static
configs: the cache is donated into prefill, travels in the `Turn`, is donated into decode on
its own (`_without_cache`) and is handed back. Two programs rather than one cost one
dispatch and let a profiler time prefill and decode apart at a device-synchronised
boundary."""


@jax.jit
def _generation_jit(turn: Turn) -> Generation:
    """A finished single-turn `Turn` as the `Generation` it returns (one small program)."""
    mask = jnp.arange(turn.tokens.shape[1])[None, :] < turn.length[:, None]
    return Generation(turn.tokens, mask, turn.logprobs, turn.length, turn.step - 1)


def _without_cache(turn: Turn) -> tuple[qwen3.KVCache, Turn]:
    """The cache, and `turn` with its cache taken out: `decode_jit`'s two arguments."""
    return turn.cache, dataclasses.replace(turn, cache=None)


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0, length: int | None = None):
    """Left-pad id lists to [B, P] numpy (tokens int32, mask bool); P = longest or `length`."""
    if not prompts:
        raise ValueError("no prompts given")
    longest = max(len(x) for x in prompts)
    p = longest if length is None else length
    if p < longest:
        raise ValueError(f"prompt of {longest} tokens does not fit length={length}")
    tokens = np.full((len(prompts), p), pad_id, np.int32)
    mask = np.zeros((len(prompts), p), bool)
    for i, ids in enumerate(prompts):
        if len(ids):
            tokens[i, p - len(ids):] = np.asarray(ids, np.int32)
            mask[i, p - len(ids):] = True
    return tokens, mask


def check_prompts(tokens: np.ndarray, mask: np.ndarray, vocab_size: int) -> None:
    """Raise ValueError naming the first row that is empty, not left-padded, or out of vocab."""
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


class Engine:
    """Holds the KV-cache buffer across calls and the layout; `generate` is the entry point.

    mesh/rules: optional `jax.sharding.Mesh` and a rules table from `locojax.model.sharding`
    (default ROLLOUT_REPLICATED: batch over `data`, weights replicated) to run one SPMD
    generate over several local devices.
    """

    def __init__(self, model_cfg: ModelConfig, mesh: Mesh | None = None,
                 rules: sharding.Rules | None = None):
        self.model_cfg = model_cfg
        rules = sharding.ROLLOUT_REPLICATED if rules is None else rules
        self.layout = None if mesh is None else _Layout(mesh, tuple(sorted(rules.items())))
        self._weight_shardings = (None if mesh is None
                                  else sharding.weight_shardings(model_cfg, mesh, rules))
        self._cache: qwen3.KVCache | None = None

    def place_weights(self, weights: Weights) -> Weights:
        """Weights laid out for this engine's mesh (a no-op without one)."""
        if self._weight_shardings is None:
            return weights
        placed = zip(jax.tree.leaves(weights), jax.tree.leaves(self._weight_shardings))
        if all(isinstance(x, jax.Array) and x.sharding.is_equivalent_to(s, x.ndim)
               for x, s in placed):
            return weights  # already laid out so: device_put's own path costs ~1 ms a call
        return jax.device_put(weights, self._weight_shardings)

    def _cache_shardings(self, cache) -> qwen3.KVCache:
        """Where a cache buffer lives: committed from the start, as the buffer handed back by
        the jit is; otherwise the second call sees a differently-placed argument and XLA
        compiles generate again."""
        if self.layout is None:
            return jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), cache)
        return qwen3.KVCache(
            self.layout.sharding(_K_AXES, cache.k.shape),
            self.layout.sharding(_V_AXES, cache.v.shape),
            self.layout.sharding(("batch", None), cache.valid.shape),
            self.layout.sharding((), ()))

    def _buffer(self, rows: int, slots: int) -> qwen3.KVCache:
        c = self._cache
        self._cache = None  # donated below: never touch it again
        if c is None or (c.v.shape[1], c.v.shape[3]) != (rows, slots):
            c = None  # freed before the new one is made: never two caches at once
            c = qwen3.KVCache.empty(self.model_cfg, rows, slots)
            c = jax.device_put(c, self._cache_shardings(c))
        return c

    def compile(self, prompts: int, prompt_len: int, sampling: SamplingConfig,
                num_samples: int = 1):
        """Compile prefill and decode, without running them, for `prefill(...)` of `prompts`
        prompts of `prompt_len` tokens; returns the two `jax.stages.Compiled`.

        The arguments are abstract but placed exactly as `prefill` and `decode` place the
        real ones, so the compiled programs land in the jit caches that those calls hit
        (the memory plan's compiles are the run's compiles). Their `memory_analysis()` is
        what each program needs per device besides the weights and the cache.
        """
        cfg = self.model_cfg
        if self._weight_shardings is None:
            weight_shardings = jax.tree.map(lambda _: None, params_lib.abstract(cfg))
        else:
            weight_shardings = self._weight_shardings
        weights = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                               params_lib.abstract(cfg), weight_shardings)
        cache = jax.eval_shape(lambda: qwen3.KVCache.empty(
            cfg, prompts * num_samples, prompt_len + sampling.max_new_tokens - 1))
        cache = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                             cache, self._cache_shardings(cache))
        if self.layout is None:  # numpy prompts: uncommitted arguments
            tokens = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.int32)
            mask = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.bool_)
        else:
            placed = self.layout.sharding(("batch", None), (prompts, prompt_len))
            tokens = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.int32, sharding=placed)
            mask = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.bool_, sharding=placed)
        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
        first_row = jax.ShapeDtypeStruct((), jnp.int32)
        prefill = prefill_jit.lower(weights, tokens, mask, key, first_row, cache, model_cfg=cfg,
                                    sampling=sampling, num_samples=num_samples,
                                    layout=self.layout).compile()
        cache, turn = _without_cache(prefill.out_info)
        decode = decode_jit.lower(weights, cache, turn, model_cfg=cfg, sampling=sampling,
                                  layout=self.layout).compile()
        return prefill, decode

    def take_cache(self, rows: int, slots: int) -> qwen3.KVCache:
        """The engine's cache buffer for [rows, slots] (reused when the shape fits), handed
        out to be donated; give it back with `return_cache` (multi-turn, `extend.py`)."""
        return self._buffer(rows, slots)

    def return_cache(self, cache: qwen3.KVCache) -> None:
        self._cache = cache

    def generate(self, weights: Weights, prompts, key: jax.Array, sampling: SamplingConfig,
                 num_samples: int = 1, prompt_mask=None, first_row: int = 0) -> Generation:
        """Sample `num_samples` completions per prompt: `decode(prefill(...))`.

        prompts: a list of id lists (left-padded here), or [B, P] ids with `prompt_mask`
        [B, P] (True on real tokens, left-padded). key: one PRNG key; row r draws step t
        with `fold_in(fold_in(key, first_row + r), t)`, so a fixed key gives a fixed output
        and a row's tokens do not depend on the batch it is generated in. first_row: the
        global index of this batch's first row (when one batch is split across hosts).
        """
        pending = self.prefill(weights, prompts, key, sampling, num_samples, prompt_mask,
                               first_row)
        return self.decode(pending)

    def prefill(self, weights: Weights, prompts, key: jax.Array, sampling: SamplingConfig,
                num_samples: int = 1, prompt_mask=None, first_row: int = 0) -> "Pending":
        """Prefill the prompts and sample token 0 (arguments as `generate`); `decode` goes on.

        Dispatched asynchronously: block on `Pending.prefilled` (the `Turn` after token 0)
        to time prefill alone.
        """
        if num_samples < 1:
            raise ValueError(f"num_samples={num_samples} must be >= 1")
        sampling.validate_vocab(self.model_cfg.vocab_size)
        if prompt_mask is None:
            if isinstance(prompts, (np.ndarray, jax.Array)):
                tokens = np.asarray(prompts, np.int32)
                mask = np.ones(tokens.shape, bool)
            else:
                tokens, mask = pad_prompts(prompts, sampling.pad_token_id)
        else:
            tokens, mask = np.asarray(prompts, np.int32), np.asarray(prompt_mask, bool)
        check_prompts(tokens, mask, self.model_cfg.vocab_size)
        b, p = tokens.shape
        longest = int(mask.sum(axis=1).max()) + sampling.max_new_tokens
        if longest > self.model_cfg.max_position_embeddings:
            raise ValueError(
                f"prompt + max_new_tokens reaches {longest} positions, more than the model's "
                f"max_position_embeddings={self.model_cfg.max_position_embeddings}")
        cache = self._buffer(b * num_samples, p + sampling.max_new_tokens - 1)
        if self.layout is not None:
            weights = self.place_weights(weights)
            tokens, mask = (jax.device_put(x, self.layout.sharding(("batch", None), x.shape))
                            for x in (tokens, mask))
        prefilled = prefill_jit(
            weights, tokens, mask, key, jnp.asarray(first_row, jnp.int32), cache,
            model_cfg=self.model_cfg, sampling=sampling,
            num_samples=num_samples, layout=self.layout)
        return Pending(weights, prefilled, sampling)

    def decode(self, pending: "Pending") -> Generation:
        """Sample the remaining tokens of a `prefill`; the cache returns to this engine."""
        prefilled, pending.prefilled = pending.prefilled, None  # donated: usable once
        if prefilled is None:
            raise ValueError("this prefill was already decoded")
        turn = decode_jit(pending.weights, *_without_cache(prefilled),
                          model_cfg=self.model_cfg, sampling=pending.sampling,
                          layout=self.layout)
        self._cache = turn.cache
        return _generation_jit(dataclasses.replace(turn, cache=None))


    def conversation(self, sampling: SamplingConfig, slots: int, stops=(), max_block: int = 64,
                     compact: bool = True):
        """A multi-turn batch on this engine (`extend.Conversation`)."""
        from locojax.engine.extend import Conversation  # extend builds on this module

        return Conversation(self, sampling, slots, stops, max_block, compact)


@dataclasses.dataclass
class Pending:
    """A prefilled batch waiting for `Engine.decode` (host-side handle, decoded once)."""

    weights: Weights
    prefilled: Turn | None
    sampling: SamplingConfig
