"""Batched generation on local devices: `Engine.generate` = prefill + decode (`decode.py`).

The engine sees token ids only (docs/design.md: "the engine knows nothing about tokenization"),
holds the KV-cache buffer across calls (donated into each program and handed back) and the
device layout. The returned logprobs are those of the temperature-scaled policy, computed
by the trainer's own forward, so sampler and trainer logprobs agree to f32 rounding
(docs/design.md, correctness contracts).

Shapes are static per call: B prompts of P (left-padded) tokens, G samples per prompt,
R = B·G rows, N = max_new_tokens, S ≥ P + N - 1 cache slots (the last sampled token is
never fed back, so it needs no slot; S is rounded up to whole blocks of attention,
`decoder.KVCache.blocks`). A left-padded prompt's positions start at 0 at its first real
token; pad slots are marked invalid in the cache and never attended to. A decode step reads
only the blocks written so far, so its cost grows with the tokens written, not with N.
With `num_samples=G` (GRPO groups) each prompt is prefilled once and its cache repeated G
times; rows are prompt-major (row r belongs to prompt r // G).

A generate compacts its finished rows out as it goes (`Engine.decode`, `decode.compact`):
once half a device's rows have stopped, the live ones move, in place, into a batch half the
size, so rows that stopped early cost nothing after. The cache may be bf16
(`Engine(cache_dtype="bf16")`): half the memory and the reads, accumulated in f32.

References: nanochat `engine.py` (the engine knows no tokenizer; prefill once, then clone
the cache per sample). Departure: sampling uses one uniform per row (see `sampling.py`),
not Gumbel-max.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding

from locojax.engine import refill as refill_lib
from locojax.engine import waves as waves_lib
from locojax.engine.decode import (
    K_AXES,
    V_AXES,
    Layout,
    check_prompts,
    compact_jit,
    decode_jit,
    prefill_jit,
)
from locojax.engine.generation import Generation, Pending, generation_jit, without_cache
from locojax.engine.extend import Conversation
from locojax.engine.sampling import SamplingConfig
from locojax.model import decoder, sharding
from locojax.model import params as params_lib
from locojax.model.config import ModelConfig
from locojax.model.params import Weights


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


CACHE_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
"""The KV cache's storage dtypes by name (`Engine(cache_dtype=...)`); attention reads either in
f32, so bf16 halves the cache and its reads and rounds each key and value once."""
MIN_ROWS = 8
"""Finished rows are compacted out while a device's batch can halve and stay at least this.
Compacting at half is no setting (a batch halves). `benchmarks/bench_engine.py --sweep rows
--runs 2` (SMALL, 256 tokens a row, 2 cores, load 3.4, 2026-12-03 at 92c0304) measured ms per
decode step at 128/64/32/16/8/4/2 rows: 97/44/25/11.8/8.8/5.6/4.1, and a 128 -> 64 compaction
at 287 slots 93 ms (paid back in 2 steps). Halving still pays below 8 rows (~3 ms a step, 16 ->
8 and 8 -> 4). 8 is kept for now: down to 8 rows compacted logprobs were bitwise the
uncompacted batch's (tests/test_long_decode.py), below it one in 384 differed in the last bit;
whether that is worth ~3 ms a step on the longest rows' tail is open (docs/engine_benchmark.md)."""


WEIGHT_DTYPES = {"bf16": jnp.bfloat16}
"""Rollout copies of the weights by name (`Engine(weights_dtype=...)`,
`--rollout.weights-dtype`)."""


def generate_slots(prompt_len: int, sampling: SamplingConfig) -> int:
    """A generate's cache slots: S = P + N - 1 (the last sampled token is never written)."""
    return prompt_len + sampling.max_new_tokens - 1


def _is_matrix(x) -> bool:
    """A weight a rollout copy narrows: the matmuls' matrices and the embedding; norm scales
    and biases (1-D per layer) stay as they are, being few bytes and added or multiplied in
    the compute dtype."""
    return x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating)


@functools.partial(jax.jit, static_argnames="dtype")
def rollout_copy(weights: Weights, dtype) -> Weights:
    """The weights a decode reads in `dtype` (bf16: half the bytes a step reads); the
    decoder's matmuls then round their activations to `dtype` and accumulate in the compute
    dtype (`decoder.narrow`), so the sampler's policy is the f32 learner's to bf16 rounding
    (its logprobs' gap: `rollout/logprob_mismatch`, docs/engine_benchmark.md)."""
    return jax.tree.map(lambda x: x.astype(dtype) if _is_matrix(x) else x, weights)


class Engine:
    """Holds the KV-cache buffer across calls and the layout; `generate` is the entry point.

    mesh/rules: optional `jax.sharding.Mesh` and a rules table from `locojax.model.sharding`
    (default ROLLOUT_REPLICATED: batch over `data`, weights replicated) to run one SPMD
    generate over several local devices. cache_dtype: a `CACHE_DTYPES` name or a dtype
    (default: the model's compute dtype). block: most cache slots attention reads per step
    of its loop (`decoder.BLOCK`). min_rows: a generate compacts its finished rows out while a
    device's batch can halve to at least this many rows (None: never). weights_dtype: a
    `WEIGHT_DTYPES` name or a dtype to decode with a copy of the weights' matrices in
    (`rollout_copy`; None: the weights as given). refill: a generate of more rows than
    `refill.slots` decodes that many at a time, refilling finished rows (`refill.py`).
    waves: a generate of B prompts, B a multiple of `waves`, runs as that many plain
    generates of B / waves prompts one after another (`waves.py`): each wave's KV cache is
    freed before the next is made, so the rollout's memory is about 1 / waves, for about
    `waves` times the decode steps. The memory plan sets it when a rollout does not fit.
    """

    def __init__(self, model_cfg: ModelConfig, mesh: Mesh | None = None,
                 rules: sharding.Rules | None = None, cache_dtype=None,
                 block: int = decoder.BLOCK, min_rows: int | None = MIN_ROWS,
                 weights_dtype=None, refill: refill_lib.Refill | None = None,
                 waves: int = 1):
        self.model_cfg = model_cfg
        self.waves = waves
        rules = sharding.ROLLOUT_REPLICATED if rules is None else rules
        self.layout = None if mesh is None else Layout(mesh, tuple(sorted(rules.items())))
        self._weight_shardings = (None if mesh is None
                                  else sharding.weight_shardings(model_cfg, mesh, rules))
        self.cache_dtype = jnp.dtype(CACHE_DTYPES.get(cache_dtype, cache_dtype)
                                     if cache_dtype is not None else model_cfg.dtype)
        self.block, self.min_rows, self.refill = block, min_rows, refill
        self.weights_dtype = (None if weights_dtype is None else
                              jnp.dtype(WEIGHT_DTYPES.get(weights_dtype, weights_dtype)))
        if self.weights_dtype is not None and not decoder.narrow(self.weights_dtype,
                                                                 model_cfg.dtype):
            raise ValueError(f"weights_dtype={weights_dtype!r}: a rollout copy must be a 16-bit "
                             f"float narrower than the compute dtype {model_cfg.dtype} "
                             f"(one of {sorted(WEIGHT_DTYPES)})")
        self._cache: decoder.KVCache | None = None
        self._allocations: dict[tuple[int, int], object] = {}

    def _shards(self, rows: int) -> int:
        """How many devices a batch of `rows` is split over."""
        if self.layout is None:
            return 1
        return rows // self.layout.sharding(("batch",), (rows,)).shard_shape((rows,))[0]

    @property
    def weight_shardings(self):
        """Where this engine wants each weight (None without a mesh): the layout a trainer's
        reshard writes (`wiring.rollout_weights`), so that `place_weights` finds it done."""
        return self._weight_shardings

    def place_weights(self, weights: Weights) -> Weights:
        """Weights laid out for this engine's mesh (a no-op without one), in its
        `weights_dtype` (a `rollout_copy`, made here unless the matrices already are)."""
        if self._weight_shardings is not None:
            placed = zip(jax.tree.leaves(weights), jax.tree.leaves(self._weight_shardings))
            if not all(isinstance(x, jax.Array) and x.sharding.is_equivalent_to(s, x.ndim)
                       for x, s in placed):  # laid out already: device_put costs ~1 ms a call
                weights = jax.device_put(weights, self._weight_shardings)
        if self.weights_dtype is not None and any(
                _is_matrix(x) and x.dtype != self.weights_dtype for x in jax.tree.leaves(weights)):
            weights = rollout_copy(weights, self.weights_dtype)
        return weights

    def _cache_shardings(self, cache) -> decoder.KVCache:
        """Where a cache buffer lives: committed from the start, as the buffer handed back by
        the jit is; otherwise the second call sees a differently-placed argument and XLA
        compiles generate again."""
        if self.layout is None:
            return jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), cache)
        return dataclasses.replace(
            cache, k=self.layout.sharding(K_AXES, cache.k.shape),
            v=self.layout.sharding(V_AXES, cache.v.shape),
            valid=self.layout.sharding(("batch", None), cache.valid.shape),
            index=self.layout.sharding((), ()))

    def _empty(self, rows: int, slots: int) -> decoder.KVCache:
        return decoder.KVCache.empty(self.model_cfg, rows, slots, self.cache_dtype, self.block,
                                     self._shards(rows))

    def _buffer(self, rows: int, slots: int) -> decoder.KVCache:
        c = self._cache
        self._cache = None  # donated below: never touch it again
        n, block = decoder.KVCache.blocks(slots, self.block)
        if c is None or (c.v.shape[1], c.v.shape[3], c.block, c.v.dtype) != (
                rows, n * block, block, self.cache_dtype):
            c = None  # freed before the new one is made: never two caches at once
            c = self.allocation(rows, slots)()
        return c

    def allocation(self, rows: int, slots: int):
        """The jitted program (per shape) making an empty [rows, slots] cache buffer where
        `_cache_shardings` puts it: 1/9 the time of `jnp.zeros` per array and a `device_put`."""
        if (rows, slots) not in self._allocations:
            make = functools.partial(self._empty, rows, slots)
            self._allocations[rows, slots] = jax.jit(
                make, out_shardings=self._cache_shardings(jax.eval_shape(make)))
        return self._allocations[rows, slots]

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
        abstract = params_lib.abstract(cfg)
        if self.weights_dtype is not None:
            abstract = jax.eval_shape(lambda w: rollout_copy(w, self.weights_dtype), abstract)
        weights = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                               abstract, weight_shardings)
        cache = jax.eval_shape(lambda: self._empty(prompts * num_samples,
                                                   generate_slots(prompt_len, sampling)))
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
        cache, turn = without_cache(prefill.out_info)
        bound = jax.ShapeDtypeStruct((), jnp.int32)  # until and stop_at, as `Decoding` calls
        decode = decode_jit.lower(weights, cache, turn, bound, bound, model_cfg=cfg,
                                  sampling=sampling, layout=self.layout).compile()
        return prefill, decode

    def take_cache(self, rows: int, slots: int) -> decoder.KVCache:
        """The engine's cache buffer for [rows, slots] (reused when the shape fits), handed
        out to be donated; give it back with `return_cache` (multi-turn, `extend.py`)."""
        return self._buffer(rows, slots)

    def return_cache(self, cache: decoder.KVCache) -> None:
        self._cache = cache

    def release_cache(self) -> None:
        """Drop the cache buffer kept between calls (the next generate allocates a new one):
        a trainer's rollout and train step alternate, and the train step needs no cache."""
        self._cache = None

    def generate(self, weights: Weights, prompts, key: jax.Array, sampling: SamplingConfig,
                 num_samples: int = 1, prompt_mask=None, first_row: int = 0,
                 limits=None) -> Generation:
        """Sample `num_samples` completions per prompt: `decode(prefill(...))`.

        prompts: a list of id lists (left-padded here), or [B, P] ids with `prompt_mask`
        [B, P] (True on real tokens, left-padded). key: one PRNG key; row r draws step t
        with `fold_in(fold_in(key, first_row + r), t)`, so a fixed key gives a fixed output
        and a row's tokens do not depend on the batch it is generated in. first_row: the
        global index of this batch's first row (when one batch is split across hosts).
        limits: [R] most tokens of each row (default N); a row ends at its limit as at a stop
        token (benchmarks force the same lengths on every engine with it).
        """
        pending = self.prefill(weights, prompts, key, sampling, num_samples, prompt_mask,
                               first_row, limits)
        return self.decode(pending)

    def prefill(self, weights: Weights, prompts, key: jax.Array, sampling: SamplingConfig,
                num_samples: int = 1, prompt_mask=None, first_row: int = 0,
                limits=None) -> "Pending":
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
        weights = self.place_weights(weights)
        if limits is not None:
            limits = np.minimum(np.asarray(limits, np.int32), sampling.max_new_tokens)
            if limits.shape != (b * num_samples,) or limits.min() < 1:
                raise ValueError(f"limits must be {b * num_samples} ints >= 1")
        if self.refill is not None and b * num_samples > self.refill.slots:
            return refill_lib.start(self, weights, tokens, mask, key, sampling, num_samples,
                                    first_row, limits)
        if waves_lib.split(self, b):
            return waves_lib.start(self, weights, tokens, mask, key, sampling, num_samples,
                                   first_row, limits)
        return self.prefill_whole(weights, tokens, mask, key, sampling, num_samples,
                                  first_row, limits)

    def prefill_whole(self, weights: Weights, tokens: np.ndarray, mask: np.ndarray,
                      key: jax.Array, sampling: SamplingConfig, num_samples: int,
                      first_row: int, limits) -> "Pending":
        """`prefill` of checked, padded prompts as one batch, the weights placed already (a
        wave of `waves.py` too)."""
        b, p = tokens.shape
        cache = self._buffer(b * num_samples, generate_slots(p, sampling))
        if self.layout is not None:
            tokens, mask = (jax.device_put(x, self.layout.sharding(("batch", None), x.shape))
                            for x in (tokens, mask))
            if limits is not None:
                limits = jax.device_put(limits, self.layout.sharding(("batch",), limits.shape))
        prefilled = prefill_jit(
            weights, tokens, mask, key, jnp.asarray(first_row, jnp.int32), cache,
            *(() if limits is None else (None, limits)),  # as `compile` lowers it without
            model_cfg=self.model_cfg, sampling=sampling,
            num_samples=num_samples, layout=self.layout)
        return Pending(weights, prefilled, sampling)

    def decode(self, pending: "Pending") -> Generation:
        """Sample the remaining tokens of a `prefill`; the cache returns to this engine.

        While a device's batch can halve to `min_rows` or more, the loop stops once half its
        rows have finished and the live ones are compacted into a batch half the size
        (`compact`; one host sync each time). A row's draws do not depend on its batch; a
        smaller batch is another XLA program, whose kernels may round a logit differently
        (tests/test_long_decode.py). A refilling generate (`refill.Queued`) runs `refill.run`."""
        if isinstance(pending, refill_lib.Queued):
            return Generation(*refill_lib.run(self, pending))
        if isinstance(pending, waves_lib.Waves):
            return Generation(*waves_lib.run(self, pending))
        decoding = Decoding(self, pending)
        decoding.advance()
        return decoding.result()

    def conversation(self, sampling: SamplingConfig, slots: int, stops=(), max_block: int = 64,
                     compact: bool = True) -> Conversation:
        """A multi-turn batch on this engine (`extend.Conversation`)."""
        return Conversation(self, sampling, slots, stops, max_block, compact)


class Decoding:
    """The decode of a `prefill`, run `advance(k)` loop iterations at a time: what a single
    controller's serving loop does, K decode iterations per round trip, the rows and their
    cache staying on the engine in between (`--controller.decode-chunk`).

    Every call runs the one compiled decode program (the bound `stop_at` is an argument),
    and a batch is compacted at the step where it would be without bounds, so the tokens
    and logprobs are `Engine.decode`'s bitwise (tests/test_decode_chunks.py)."""

    def __init__(self, engine: Engine, pending: Pending):
        if isinstance(pending, (refill_lib.Queued, waves_lib.Waves)):
            raise ValueError("a refilling generate, or one in waves, decodes whole, in "
                             "Engine.decode")
        prefilled, pending.prefilled = pending.prefilled, None  # donated: usable once
        if prefilled is None:
            raise ValueError("this prefill was already decoded")
        self.engine, self.weights, self.sampling = engine, pending.weights, pending.sampling
        self.cache, self.turn = without_cache(prefilled)
        self.order = self.out = None  # as `compact` gives them
        self.step = 1  # tokens sampled per live row so far (token 0 by prefill)
        self.finished = False

    def advance(self, iterations: int | None = None) -> bool:
        """Run up to `iterations` more decode iterations (None: to the end); True once every
        row has stopped or the turn is full (then `result`). A bounded call syncs with the
        host once at its end, to know the step."""
        if iterations is not None and iterations < 1:
            raise ValueError(f"decode iterations per call must be >= 1, got {iterations}")
        e, n = self.engine, self.sampling.max_new_tokens
        stop = n if iterations is None else min(n, self.step + iterations)
        static = dict(model_cfg=e.model_cfg, sampling=self.sampling, layout=e.layout)
        d = self.cache.shards
        while not self.finished:
            local = self.turn.last.shape[0] // d  # rows per device
            half = local // 2 if (e.min_rows is not None and local % 2 == 0
                                  and local // 2 >= e.min_rows) else 0
            self.cache, self.turn = without_cache(decode_jit(
                self.weights, self.cache, self.turn, jnp.int32(half), jnp.int32(stop),
                **static))
            if not half and iterations is None:  # it ran to the end: no host sync
                self.finished = True
                break
            done, step = jax.device_get((self.turn.done, self.turn.step))
            self.step = int(step)
            live = int((~done.reshape(d, -1)).sum(1).max())
            if not live or self.step >= n:
                self.finished = True
                break
            size = local
            while half and size // 2 >= max(live, e.min_rows) and size % 2 == 0:
                size //= 2
            if size < local:  # the loop stopped at `until`: half the rows or more are done
                self.cache, self.turn, self.order, self.out = compact_jit(
                    self.cache, self.turn, self.order, self.out, size=size * d,
                    layout=e.layout)
            if self.step >= stop:
                return False
        e._cache = self.cache
        return True

    def result(self) -> Generation:
        if not self.finished:
            raise ValueError("this decode has not finished: advance it first")
        return generation_jit(self.turn, self.order, self.out)
