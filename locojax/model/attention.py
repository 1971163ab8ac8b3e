"""The KV cache and attention over it: fixed slots, read block by block under an online softmax.

`KVCache` holds every layer's keys and values in fixed slots with their validity (how
left-padded prompts and multi-turn holes are handled); `attention` is GQA under one softmax
over several key/value parts, and over a cache's written slots, read `BLOCK` slots at a time
(`CacheBlocks`), so a cached step's cost grows with the tokens written, not the slots
allocated. A sliding-window layer (`CacheBlocks.window`) sees only the keys less than W
positions back, a slot's position being its count of valid slots before it: positions are
contiguous over a row's real tokens, from 0 (`engine`, `extend`); its blocked read starts
at the first block inside some row's window. (Its cache still holds every slot: a ring
buffer of W slots per local layer would also cut its memory.)

Legend: b batch, t query time, s key slot, n q heads, k kv heads, g q heads per kv, h head
dim, L layers.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from locojax.model import decode_kernel
from locojax.model.config import ModelConfig

_MASKED = -1e30  # finite, so a row with no visible key (a pad query) gives 0s, not NaNs


BLOCK = 32
"""Most cache slots one step of the blocked attention reads (`KVCache.empty` makes the blocks
as equal as it can). XLA:CPU copies each block out of the cache before the fusion that reads
it, so a smaller block keeps that copy in cache: a decode-step A/B at SMALL's 128 rows
measured 48 ms a step at 32 against 80 at 256, and a whole small-512 generate 1.25x faster
(docs/results/engine_generation.md, "Per-op trace")."""


WHOLE_BLOCKS = 5
"""A cache of at most this many blocks is read whole, in one step without a loop (its
unwritten slots masked: they add exact zeros), instead of block by block. Whole SMALL
generates at 128 rows, A/B against the loop (docs/results/engine_generation.md, "Short caches read
whole"): 4% faster at 3 blocks, 8% at 5, 14% slower at 9 (it reads every allocated slot)."""


FOLD_SLOTS = 0
"""Row-slots a decode step's attention loop reads per iteration, at least (0: one block):
an iteration folds in `CacheBlocks.fold` consecutive blocks, FOLD_SLOTS / (rows x block)
of them, so few rows still read big arrays per op (XLA:CPU's cost per op, not the bytes,
is most of a step at 8 rows and 1,000 slots: docs/engine_benchmark.md). Off by default:
on XLA:CPU a folded step is not bitwise the unfolded one (the same updates on other
shapes round differently in the last bit), so a fold that changes with the batch would end
compaction's bitwise guarantee; `bench_engine.py --sweep folds` measures it."""


DECODE_AS_DOTS = None
"""Decode's scores and mixes (one query token) as dots with f32 accumulation, as prefill's,
instead of broadcast multiply-reduces. None (the default): off on XLA:CPU, which runs the
multiply-reduce several times faster than B*K tiny batched matmuls (`_ops`); on elsewhere,
where the dot is what a TPU's MXU runs. With `HALF_AS_BITS` off as well, Qwen3-0.6B's decode
token step at 64 rows took 7.77 ms on one v5e against 23.24 ms with XLA:CPU's settings
(benchmarks/tpu/decode_profile.py, docs/results/tpu_decode.md)."""


DECODE_KERNEL = "xla"
"""How a decode step reads the cache: "xla", the block loop below, or "pallas", one Pallas
kernel over the stacked cache in place (`decode_kernel.py`; its caches are made of whole
128-slot blocks). XLA by default: the kernel is for a TPU, where decode_profile.py measures
it against the XLA path before it becomes one's default; elsewhere Pallas interprets it."""


HALF_AS_BITS = None
"""Whether 16-bit float caches and embeddings are sliced and updated as their uint16 bits
(`as_bits`), the cache under an optimization barrier: XLA:CPU's workaround, exact either way.
None (the default): on XLA:CPU only; on a v5e the bitcasts of the whole cache and the
barrier were 40% of a Qwen3-0.6B token step (docs/results/tpu_decode.md)."""


def decode_as_dots() -> bool:
    """`DECODE_AS_DOTS` where set, else whether the backend is not XLA:CPU (read at trace)."""
    return jax.default_backend() != "cpu" if DECODE_AS_DOTS is None else DECODE_AS_DOTS


def half_as_bits() -> bool:
    """`HALF_AS_BITS` where set, else whether the backend is XLA:CPU (read at trace)."""
    return jax.default_backend() == "cpu" if HALF_AS_BITS is None else HALF_AS_BITS


DECODE_ENV = "LOCOJAX_DECODE"
"""Decode knobs for a whole run and the processes it starts (they inherit it), comma-separated
names of `DECODE_SETTINGS`: `LOCOJAX_DECODE=pallas,bits-off locojax train ...`, for an A/B of
whole runs on the chip."""
DECODE_SETTINGS = {"dots": ("DECODE_AS_DOTS", True), "no-dots": ("DECODE_AS_DOTS", False),
                   "bits": ("HALF_AS_BITS", True), "bits-off": ("HALF_AS_BITS", False),
                   "pallas": ("DECODE_KERNEL", "pallas")}


def decode_settings(spec: str) -> dict[str, object]:
    """{knob: value} of a `DECODE_ENV` value; an unknown name is refused, naming the known."""
    out = {}
    for name in filter(None, (w.strip() for w in spec.split(","))):
        if name not in DECODE_SETTINGS:
            raise ValueError(f"{DECODE_ENV}={spec!r}: no decode knob {name!r}; known: "
                             f"{', '.join(DECODE_SETTINGS)}")
        knob, value = DECODE_SETTINGS[name]
        out[knob] = value
    return out


for _knob, _value in decode_settings(os.environ.get(DECODE_ENV, "")).items():
    globals()[_knob] = _value  # the module's knobs above, read at trace time


def as_bits(x):
    """A 16-bit float cache array as its bits (uint16); any other array as it is.

    XLA:CPU computes no bf16/f16 op, slices and updates included: it converts their operands
    to f32, and it hoists that conversion of the whole cache out of the layer and decode
    loops, so a decode step held the cache of every layer in f32 (two such copies, and a
    bf16 copy: at Qwen3-4B 11 GB a device). Sliced and updated as integers, the cache is
    read and written in place; the bits are the values', so this is exact. A read hoists the
    whole-cache bitcast in turn (a uint16 copy), unless an optimization barrier ties the
    cache to the loop's slice index (`KVCache.read`); then it fuses into the slice.
    """
    bits = half_as_bits() and _half(x.dtype)
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if bits else x


def _half(dtype) -> bool:
    """Whether `dtype` is a 16-bit float, which `as_bits` reads and writes as its bits."""
    return jnp.dtype(dtype).itemsize == 2 and jnp.issubdtype(dtype, jnp.floating)


def from_bits(x, dtype):
    """`as_bits` undone: x back as `dtype`."""
    return jax.lax.bitcast_convert_type(x, dtype) if x.dtype != dtype else x


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Keys and values of every layer in fixed slots; `index` is the next slot to write.

    Attention reads the written slots [0, index) only, `block` slots at a time (`CacheBlocks`):
    a step's cost grows with the tokens written, not with the S slots allocated. A batch of
    b rows may run on a cache of more: it uses the first b / `shards` rows of each of the
    cache's `shards` equal row ranges (one per device the batch axis is split over), which
    is how finished rows are compacted out without a new buffer (`engine.compact`)."""

    # Keys are stored transposed (slots minor) so the decode q·k reduces over head_dim with
    # whole slot vectors, values slots-major so p·v reduces over slots with whole head
    # vectors; on XLA:CPU this makes decode attention ~2x faster than [L, B, S, K, H].
    k: jax.Array  # [L, B, K, H, S]
    v: jax.Array  # [L, B, K, S, H]
    valid: jax.Array  # [B, S] bool: slot holds a real (non-pad) token
    index: jax.Array  # [] int32
    block: int = dataclasses.field(default=BLOCK, metadata=dict(static=True))  # S % block == 0
    shards: int = dataclasses.field(default=1, metadata=dict(static=True))
    fold_slots: int = dataclasses.field(default=FOLD_SLOTS, metadata={"static": True})

    @staticmethod
    def blocks(slots: int, block: int = BLOCK) -> tuple[int, int]:
        """(n, b): the fewest blocks of at most `block` slots that hold `slots`, as equal as
        they can be (n·b - slots < n slots are spare). Under the Pallas decode kernel, blocks of
        its `SLOTS` (it reads whole lane-widths of keys)."""
        if DECODE_KERNEL == "pallas":
            return -(-slots // decode_kernel.SLOTS), decode_kernel.SLOTS
        n = -(-slots // block)
        return n, -(-slots // n)

    @classmethod
    def empty(cls, cfg: ModelConfig, batch: int, slots: int, dtype=None, block: int = BLOCK,
              shards: int = 1, fold_slots: int = FOLD_SLOTS) -> "KVCache":
        """At least `slots` slots, in `blocks(slots, block)`; dtype: the keys' and values'
        (default: the compute dtype; attention reads either in f32)."""
        n, block = cls.blocks(slots, block)
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, n * block, cfg.head_dim)
        k_shape = shape[:3] + (cfg.head_dim, n * block)
        dtype = cfg.dtype if dtype is None else dtype
        return cls(
            k=jnp.zeros(k_shape, dtype), v=jnp.zeros(shape, dtype),
            valid=jnp.zeros((batch, n * block), bool), index=jnp.zeros((), jnp.int32),
            block=block, shards=shards, fold_slots=fold_slots)

    def read(self, x, axis: int, b: int, start, size):
        """`dynamic_slice(x, start, size)` of the b rows a b-row batch uses (x: a cache array,
        its batch at `axis`; start and size without the batch axis)."""
        d = self.shards
        if half_as_bits() and _half(x.dtype):  # see `as_bits`; the barrier keeps XLA from
            x, start = jax.lax.optimization_barrier(  # converting the whole cache out of the loop
                (x, tuple(jnp.asarray(i, jnp.int32) for i in start)))
        y = as_bits(x).reshape(x.shape[:axis] + (d, x.shape[axis] // d) + x.shape[axis + 1:])
        zero = jnp.zeros((), jnp.int32)
        out = jax.lax.dynamic_slice(y, tuple(start[:axis]) + (zero, zero) + tuple(start[axis:]),
                                    tuple(size[:axis]) + (d, b // d) + tuple(size[axis:]))
        return from_bits(out.reshape(tuple(size[:axis]) + (b,) + tuple(size[axis:])), x.dtype)

    def write(self, x, new, axis: int, slot_axis: int, slot=None):
        """x with `new` (a b-row batch's T slots, its batch at `axis`) written in place at
        `slot` (default `index`) of the rows that batch uses."""
        d = self.shards
        split = lambda a: a.reshape(  # noqa: E731
            a.shape[:axis] + (d, a.shape[axis] // d) + a.shape[axis + 1:])
        start = [jnp.zeros((), jnp.int32)] * (x.ndim + 1)
        start[slot_axis + 1] = self.index if slot is None else jnp.asarray(slot, jnp.int32)
        out = jax.lax.dynamic_update_slice(split(as_bits(x)), split(as_bits(new.astype(x.dtype))),
                                           start)
        return from_bits(out.reshape(x.shape), x.dtype)


def wide_dtype(dtype):
    """Where softmax, norms, RoPE and accumulation run: f32, or f64 for f64 compute."""
    return jnp.promote_types(dtype, jnp.float32)


@dataclasses.dataclass(frozen=True)
class CacheBlocks:
    """What one layer's attention reads of a cache: the written slots [0, index) of the
    first b rows (`KVCache.read`), in `blocks` blocks of `cache.block` slots; in a
    sliding-window layer, only the slots less than `window` positions behind each query."""

    cache: KVCache
    layer: jax.Array  # [] int32
    rows: int  # b
    window: jax.Array | None = None  # [] int32: W, or larger than any position (full layer)
    positions: jax.Array | None = None  # [b, T] int32 query positions (with `window`)
    slot_positions: jax.Array | None = None  # [B, S] int32 (with `window`): `slot_positions`

    @property
    def count(self):  # [] int32: the blocks that hold a written slot
        return (self.cache.index + self.cache.block - 1) // self.cache.block

    @property
    def first(self):
        """[] int32: the first block holding a slot some query may see: the block of the
        b rows' earliest valid slot, or in a sliding-window layer the block of the earliest
        slot inside any row's window (slot positions never decrease along a row, so the
        slots before it are all too old).

        So the left padding that every row has is not read: prompts padded to P = 256 with
        at most 115 real tokens (the real-model GRPO run's) start 4 of a 383-slot cache's
        12 blocks in. Exact: a block with no visible slot adds exp(-1e30 - m) = 0 to the
        online softmax and scales it by exp(0) = 1, m being finite for every query that sees
        a key (a decode query sees itself; a pad query's output is never used)."""
        c = self.cache
        if self.window is None:
            valid = c.read(c.valid, 0, self.rows, (jnp.zeros((), jnp.int32),),
                           (c.valid.shape[1],))  # [b, S]
            return jnp.min(jnp.argmax(valid, axis=1)).astype(jnp.int32) // c.block
        oldest = jnp.min(self.positions, axis=1) - self.window + 1  # [b] oldest visible
        pos = c.read(self.slot_positions, 0, self.rows, (jnp.zeros((), jnp.int32),),
                     (c.valid.shape[1],))  # [b, S]
        too_old = jnp.sum(pos < oldest[:, None], axis=1, dtype=jnp.int32)  # [b]
        return jnp.min(too_old) // c.block

    def fold(self, t: int) -> int:
        """Blocks one loop iteration folds in (static): for a decode step (t = 1) enough
        that rows x fold x block reaches the cache's `fold_slots`, at most every block; 1
        for several queries (prefill, `extend`)."""
        c = self.cache
        if t > 1:
            return 1
        return max(1, min(c.v.shape[3] // c.block, c.fold_slots // (self.rows * c.block)))

    def read(self, j, m: int, dtype):
        """Blocks j .. j + m - 1 (all before `count`), in one slice: keys [b, K, H, m·blk],
        values [b, K, m·blk, H] in `dtype`, visible [b, T, m·blk] (T is 1 without a window:
        every query sees the same slots)."""
        c, b, blk = self.cache, self.rows, self.cache.block
        _, _, kv, h, _ = c.k.shape
        zero, first = jnp.zeros((), jnp.int32), jnp.asarray(j * blk, jnp.int32)
        k = c.read(c.k, 1, b, (self.layer, zero, zero, first), (1, kv, h, m * blk))[0]
        v = c.read(c.v, 1, b, (self.layer, zero, first, zero), (1, kv, m * blk, h))[0]
        valid = c.read(c.valid, 0, b, (first,), (m * blk,))
        visible = (valid & (first + jnp.arange(m * blk) < c.index)[None])[:, None]  # [b, 1, ·]
        if self.window is not None:
            key_pos = c.read(self.slot_positions, 0, b, (first,), (m * blk,))
            visible = visible & within(self.positions, key_pos, self.window)
        return k.astype(dtype), v.astype(dtype), visible


def slot_positions(valid):
    """[B, S] int32: each slot's RoPE position, its count of valid slots before it (what a
    sliding window measures distance in: holes and left padding are not positions)."""
    return jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1


def within(q_pos, k_pos, window):
    """[B, T, S] bool: key at k_pos [B, S] is less than `window` positions behind the query
    at q_pos [B, T] (HF's sliding window: q - k < W; later keys are the causal mask's)."""
    return q_pos[:, :, None] - k_pos[:, None, :] < window


def _ops(q, wide):
    """(score, mix): q [B, T, K, G, H]'s scores over keys k [B, K, H, S] -> [B, K, G, T, S],
    and probabilities p [B, K, G, T, S] over values v [B, K, S, H] -> [B, T, K, G, H] in f32.

    Decode (T = 1): broadcast multiply-reduces, which XLA:CPU runs several times faster than
    B*K tiny batched matmuls. Same math, f32 accumulation, as the einsums. With
    `DECODE_AS_DOTS`, decode's are dots of the operands as they are, accumulated in f32."""
    if q.shape[1] == 1 and decode_as_dots():
        # A product of two bf16s is exact in f32, so the dot may take them as they are; XLA:CPU
        # has no bf16 x bf16 -> f32 dot, so there they are upcast first, as prefill's are.
        up = (lambda x: x.astype(wide)) if jax.default_backend() == "cpu" else (lambda x: x)

        def dot_score(k):  # [B, K, G, 1, S]
            return jnp.einsum("btkgh,bkhs->bkgts", up(q), up(k), preferred_element_type=wide)

        def dot_mix(p, v):  # [B, 1, K, G, H]
            return jnp.einsum("bkgts,bksh->btkgh", up(p.astype(v.dtype)), up(v),
                              preferred_element_type=wide)
        return dot_score, dot_mix
    if q.shape[1] == 1:
        q1 = q[:, 0, :, :, :, None].astype(wide)  # [B, K, G, H, 1]

        def score(k):  # [B, K, G, 1, S]
            return jnp.sum(q1 * k[:, :, None].astype(wide), axis=3)[:, :, :, None]

        def mix(p, v):  # [B, 1, K, G, H]
            return jnp.sum(p[:, :, :, 0, :, None] * v[:, :, None].astype(wide),
                           axis=3)[:, None]
        return score, mix

    def score(k):  # f32 scores; XLA:CPU has no bf16 x bf16 -> f32 dot, so upcast first
        return jnp.einsum("btkgh,bkhs->bkgts", q.astype(wide), k.astype(wide))

    def mix(p, v):
        return jnp.einsum("bkgts,bksh->btkgh", p.astype(v.dtype), v).astype(wide)
    return score, mix


def _bt(x):
    """[B, K, G, T, 1] -> [B, T, K, G, 1]: a softmax statistic beside the output it scales."""
    return jnp.moveaxis(x, 3, 1)


def attention(q, parts, blocks: CacheBlocks | None = None, scale: float | None = None):
    """GQA of q [B,T,N,H] under one softmax spanning several key/value blocks; scores are
    q·k · scale (default 1/sqrt(H)).

    parts: (k [B,K,H,S], v [B,K,S,H], visible [B,T,S] bool) per block, e.g. the new tokens
    (and, in the train step's shared prefix, the prompt's). Only the small scores are
    concatenated, never the keys. blocks: a cache's written slots, read block by block in
    a loop with an online softmax (Milakov & Gimelshein 2018, arXiv:1805.02867, as in
    FlashAttention): each block rescales the running max, normaliser and unnormalised
    output that `parts` start. Accumulation is in f32 (f64 for f64 q) throughout, whatever
    the cache's dtype.
    """
    b, t, n, h = q.shape
    scale = h ** -0.5 if scale is None else scale
    kv_heads, wide = parts[0][0].shape[1], wide_dtype(q.dtype)
    q = q.reshape(b, t, kv_heads, n // kv_heads, h)  # [B, T, K, G, H]
    score, mix = _ops(q, wide)
    # Decode: the barriers stop XLA:CPU fusing the reductions into the softmax, which
    # recomputed them.
    barrier = jax.lax.optimization_barrier if t == 1 else (lambda x: x)

    def masked_score(k, visible):  # [B, K, G, T, S]; visible [B, T, S]
        return jnp.where(visible[:, None, None], score(k) * scale, _MASKED)

    scores = [masked_score(k, vis) for k, _, vis in parts]
    if blocks is None:
        probs = barrier(jax.nn.softmax(barrier(jnp.concatenate(scores, axis=-1)), axis=-1))
        bounds = np.cumsum([sc.shape[-1] for sc in scores])[:-1]
        out = sum(mix(p, v) for p, (_, v, _) in zip(jnp.split(probs, bounds, axis=-1), parts))
        return out.reshape(b, t, n, h).astype(q.dtype)  # [B, T, N, H]

    def add(carry, s, v):  # fold in scores s [B, K, G, T, S] over values v
        m, total, acc = carry
        m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
        p = barrier(jnp.exp(s - m_new))
        decay = jnp.exp(m - m_new)
        return m_new, total * decay + jnp.sum(p, -1, keepdims=True), acc * _bt(decay) + mix(p, v)

    s = jnp.concatenate(scores, axis=-1)
    m = jnp.max(s, axis=-1, keepdims=True)  # [B, K, G, T, 1]
    p = barrier(jnp.exp(s - m))
    carry = m, jnp.sum(p, -1, keepdims=True), mix(p, jnp.concatenate([v for _, v, _ in parts], 2))
    if DECODE_KERNEL == "pallas" and decode_kernel.supported(t, blocks):
        cached = decode_kernel.read_cache(q[:, 0], blocks.cache, blocks.layer, blocks.rows,
                                          blocks.first, scale)
        _, total, acc = _fold_stats(carry, cached)
    else:
        _, total, acc = _read_cache(blocks, carry, add, masked_score, barrier, q.dtype, wide, t)
    return (acc / _bt(total)).reshape(b, t, n, h).astype(q.dtype)  # [B, T, N, H]


def _fold_stats(carry, cached):
    """`attention`'s online-softmax carry (m, total [B, K, G, 1, 1], acc [B, 1, K, G, H]) with
    the softmax statistics of other keys folded in (`decode_kernel.read_cache`'s m, l [B, K,
    G, 1] and acc [B, K, G, H]), as `add` folds a block's scores."""
    m, total, acc = carry
    cm, cl, cacc = cached
    cm, cl = cm[..., None], cl[..., None]  # [B, K, G, 1, 1]
    m_new = jnp.maximum(m, cm)
    a, c = jnp.exp(m - m_new), jnp.exp(cm - m_new)
    return (m_new, total * a + cl * c,
            acc * _bt(a) + (cacc * c[..., 0])[:, None].astype(acc.dtype))


def _read_cache(blocks: CacheBlocks, carry, add, masked_score, barrier, dtype, wide, t: int):
    """`attention`'s online softmax `carry` after every written block of the cache: read
    whole if short, else block by block from `blocks.first` (m blocks an iteration)."""
    m_blocks, blk = blocks.fold(t), blocks.cache.block

    def block(j, carry):  # block j
        k, v, visible = blocks.read(j, 1, dtype)
        return add(carry, masked_score(k, visible), v)

    def blocks_from(j, carry):  # blocks j .. j + m_blocks - 1, one after another, in one read
        k, v, visible = blocks.read(j, m_blocks, dtype)
        m, total, acc = carry
        s = masked_score(k, visible)
        s = s.reshape(s.shape[:-1] + (m_blocks, blk))  # [B, K, G, 1, m, blk]
        ms = jax.lax.cummax(jnp.concatenate([m, jnp.max(s, axis=-1)], -1), axis=4)
        m_new = ms[..., 1:]  # [B, K, G, 1, m]: the running max after each block
        p = barrier(jnp.exp(s - m_new[..., None]))
        decay, sums = jnp.exp(ms[..., :-1] - m_new), jnp.sum(p, -1)
        v = v.reshape(v.shape[:2] + (m_blocks, blk) + v.shape[3:])  # [B, K, m, blk, H]
        mixes = jnp.sum(p[:, :, :, 0, :, :, None] * v[:, :, None].astype(wide), axis=4)
        for i in range(m_blocks):  # `add`'s updates, block by block
            d = decay[..., i:i + 1]
            total = total * d + sums[..., i:i + 1]
            acc = acc * _bt(d) + mixes[:, None, :, :, i]  # [B, 1, K, G, H]
        return m_new[..., -1:], total, acc

    n_blocks = blocks.cache.v.shape[3] // blk
    if n_blocks <= max(1, WHOLE_BLOCKS):
        # A short cache whole, without a loop. Unwritten slots add exact zeros (exp(-1e30 - m)
        # times the finite values `KVCache.empty` and writes leave there).
        k, v, visible = blocks.read(0, n_blocks, dtype)
        return add(carry, masked_score(k, visible), v)
    # The blocks [first, count) in order: the first (count - first) % m_blocks one by
    # one, then m_blocks per iteration (fewer, bigger ops: XLA:CPU's cost per op is
    # what a few rows' step pays), each block folded as `add` folds it.
    first, count = blocks.first, blocks.count
    rest = first + (count - first) % m_blocks
    carry = jax.lax.fori_loop(first, rest if m_blocks > 1 else count, block, carry)
    if m_blocks > 1:
        carry = jax.lax.fori_loop(0, (count - rest) // m_blocks,
                                  lambda i, c: blocks_from(rest + i * m_blocks, c), carry)
    return carry
