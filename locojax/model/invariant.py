"""Batch-invariant kernels: a row's bits whatever its batch, its place in it and its padding.

`ModelConfig.batch_invariant` computes the forward with these (docs/design.md, "Batch-invariant
logprobs"): the learner's logprob of a token is then bitwise the same whatever the micro-batch
count, the row's position and the bucket's width, and equals the engine's, which decodes
with a KV cache one token at a time (the cache in the compute dtype; under which XLA flags
each holds: docs/design.md). Each piece replaces one reduction whose order XLA chose by
the array's shape.

Sums. XLA picks how to reduce an axis by the whole array's shape: on XLA:CPU a row sum of 64
values rounds otherwise in an array of 32 rows than in one of 128 (probed: RMSNorm's mean
over d differed in the last bit between a micro-batch of one row and one of eight), so a
row's logprob changed with its batch. `tree_sum` adds in one order of its own, written
out as elementwise adds, which XLA computes as written (IEEE, no reassociation): split
the axis into chunks of `CHUNK`, add each chunk's halves pairwise down to one value, then
the chunk sums the same way. The order depends on the axis' length only, and appending
zeros changes no bit (x + 0 = x), so an axis padded at its end (a wider bucket, more cache
slots) sums alike.

Attention (`attention`): each query's scores over every key it may see, in key order, as one
softmax, whether the keys come from a cache or from the sequence itself. The scores q·k are
elementwise products added over the head dim in order (XLA:CPU's batched dot for them rounded
otherwise at another batch size: probed at 8 rows x 52 columns against 1 row); the maximum is
exact in any order; the normaliser and the output are one pass over the keys in order, each
key's p·[v, 1] added to the running sum (`lax.fori_loop`), so a key cut from the front or
padded at the end adds an exact zero where it was (the dot `p @ v` rounded otherwise with one
more key of left padding). The keys are padded to whole vectors (`KEYS`). A cached step reads
every slot of the cache, its new keys written in at their slots, so its keys sit in the order
of the learner's columns.

Matmuls (`matmul`): in fixed row tiles, so each is one compiled dot of one shape.

Maxima (`tree_max`): elementwise, never a reduce, which XLA:CPU may give a library fusion
with its own exp.

Probe (`tests/test_batch_invariance.py`; numbers in docs/design.md, "Batch-invariant
logprobs"): on XLA:CPU what changed a row's bits with its batch's shape was the row sums
(RMSNorm's mean, the log-softmax normaliser), the 2-D and batched dots (their kernel and
blocking go by the operands' shapes), an elementwise exp in a row's tail, and, between the
decode step and the learner, a max-subtract-exp that XLA:CPU gave YNNPACK (`__ynn_fusion`)
in one program only. With these kernels the learner is bitwise invariant to rows,
micro-batches and buckets, and equals the engine's cached steps, under the suite's XLA
flags (another flag set contracts some product and sum into one FMA in one program only).
An `optimization_barrier` is no substitute: XLA:CPU removes barriers before fusion.

Reference: batch-invariant kernels, He et al., "Defeating Nondeterminism in LLM Inference"
(Thinking Machines, 2025), which fix the reduction strategy whatever the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_MASKED = -1e30  # as `attention._MASKED`: finite, so a query with no visible key gives no NaN

CHUNK = 128
"""Values summed pairwise within one chunk before the chunks are summed: a power of two, so
a chunk halves down to one value. Chunks keep the padding small: a 151,936-token
vocabulary is 1,187 whole chunks (their sums padded to 2,048), where one power of two would
pad the whole row by 73%."""


def _pairwise(x, op=jnp.add, fill=0.0):
    """Reduce the last axis by halving: op(x[:h], x[h:]) until one value is left (the axis is
    padded with `fill` to a power of two first)."""
    n = x.shape[-1]
    p = 1 << max(n - 1, 0).bit_length()
    if p != n:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, p - n)], constant_values=fill)
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        x = op(x[..., :h], x[..., h:])
    return x[..., 0]


TILE = 16
"""Rows of one tile of `matmul`: every batch-invariant matmul multiplies [TILE, D] tiles, so
an engine step of R <= 16 rows pads to one tile (its matmuls cost up to 16 rows' FLOPs)."""


KEYS = 64
"""`attention` pads its keys to a multiple of this (masked: they add exact zeros). XLA:CPU
computes an elementwise op (exp) over a row in whole vectors and the row's tail apart, and
a key in the tail rounded otherwise than in a vector (probed: 31 keys, 1 row against 8);
with whole vectors only, a key's exp is the same whatever the row's width."""


def matmul(x2, w, dot):
    """dot(x2, w) for x2 [M, D], TILE rows at a time (a `lax.map`: one compiled dot of one
    shape, whatever M): XLA:CPU's dot rounds a row otherwise with other M (probed: the k and v
    projections, 32 output columns, at 32 rows against 256), as its kernel and blocking go
    by the operands' shapes. The tail tile is padded with zero rows, dropped after."""
    m = x2.shape[0]
    tiles = jnp.pad(x2, ((0, -m % TILE), (0, 0))).reshape(-1, TILE, x2.shape[1])
    y = jax.lax.map(lambda t: dot(t, w), tiles)  # [M / TILE, TILE, N]
    return y.reshape(-1, y.shape[-1])[:m]


def tree_sum(x, axis: int = -1, keepdims: bool = False, op=jnp.add, fill=0.0):
    """Σ of x over `axis` in a fixed order (module docstring): the same bits for a row
    whatever the other axes' sizes, and whatever zeros follow it on `axis`. op, fill: another
    associative elementwise op and its identity (`tree_max`)."""
    x = jnp.moveaxis(x, axis, -1)
    n = x.shape[-1]
    if n > CHUNK:  # [..., n] -> [..., chunks, CHUNK], `fill` at the end
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, -n % CHUNK)], constant_values=fill)
        x = _pairwise(x.reshape(x.shape[:-1] + (-1, CHUNK)), op, fill)  # [..., chunks]
    out = _pairwise(x, op, fill)
    return jnp.expand_dims(out, axis) if keepdims else out


def tree_max(x, axis: int = -1, keepdims: bool = False):
    """max over `axis` as elementwise maximums, not a reduce (exact in any order). As a
    reduce, XLA:CPU handed reduce + subtract + exp to a library fusion (`__ynn_fusion`) in
    the learner's program and not in the decode step's, and the two exps rounded apart
    (exp(0) = 1 + u in one of them)."""
    return tree_sum(x, axis, keepdims, jnp.maximum, -jnp.inf)


def tree_mean(x, axis: int = -1, keepdims: bool = False):
    """`tree_sum` / the axis' length (a correctly rounded division: shape-independent too)."""
    return tree_sum(x, axis, keepdims) / x.shape[axis]


def log_softmax(x):
    """log softmax over the last axis, its normaliser a `tree_sum` (shifted by the stopped
    max, as `jax.nn.log_softmax`)."""
    top = jax.lax.stop_gradient(tree_max(x, axis=-1, keepdims=True))
    shifted = x - top
    return shifted - jnp.log(tree_sum(jnp.exp(shifted), axis=-1, keepdims=True))


def logprobs_and_entropy(logits, targets):
    """log p(targets) [B, T] and each position's entropy from logits [B, T, V] (already / τ),
    picked out of `log_softmax` as the engine's sampler picks its token's logprob."""
    logp = log_softmax(logits)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return picked, -tree_sum(jnp.exp(logp) * logp, axis=-1)


def attention(q, parts, blocks=None, scale: float | None = None):
    """`attention.attention` (same arguments) with every reduction in a fixed order: q
    [B, T, N, H], parts (k [B, K, H, S], v [B, K, S, H], visible [B, T, S]) concatenated in
    order; with `blocks` (a cached forward) the parts are the T new tokens, written in at the
    cache's `index` among all its slots."""
    b, t, n, h = q.shape
    scale = h ** -0.5 if scale is None else scale
    wide = jnp.promote_types(q.dtype, jnp.float32)
    k = jnp.concatenate([kk for kk, _, _ in parts], axis=-1)  # [B, K, H, S]
    v = jnp.concatenate([vv for _, vv, _ in parts], axis=2)  # [B, K, S, H]
    visible = jnp.concatenate([vis for _, _, vis in parts], axis=-1)  # [B, T, S]
    if blocks is not None:
        k, v, visible = _with_cache(blocks, k, v, visible, q.dtype)
    pad = -k.shape[-1] % KEYS  # masked keys: exact zeros, and whole vectors for exp
    k = jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, pad)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, pad), (0, 0)))
    visible = jnp.pad(visible, ((0, 0), (0, 0), (0, pad)))
    kv = k.shape[1]
    qt = q.reshape(b, t, kv, n // kv, h).transpose(0, 2, 3, 1, 4).astype(wide)  # [B, K, G, T, H]
    kw = k.astype(wide)[:, :, None, None]  # [B, K, 1, 1, H, S]
    s = qt[..., 0:1] * kw[..., 0, :]  # [B, K, G, T, S]: Σ_h in order, not a dot
    for i in range(1, h):
        s = s + qt[..., i:i + 1] * kw[..., i, :]
    s = jnp.where(visible[:, None, None], s * scale, _MASKED)
    p = jnp.exp(s - tree_max(s, axis=-1, keepdims=True))  # not a reduce: see `tree_max`
    ones = jnp.ones(v.shape[:-1] + (1,), wide)
    vv = jnp.moveaxis(jnp.concatenate([v.astype(wide), ones], -1), 2, 0)  # [S, B, K, H+1]
    ps = jnp.moveaxis(p, -1, 0)  # [S, B, K, G, T]

    def add_key(j, acc):  # acc [B, K, G, T, H+1] plus key j's term: keys in order, one by one
        return acc + ps[j][..., None] * vv[j][:, :, None, None]

    mixed = jax.lax.fori_loop(0, ps.shape[0], add_key,
                              jnp.zeros(p.shape[:-1] + vv.shape[-1:], wide))
    out = jnp.moveaxis(mixed[..., :h] / mixed[..., h:], 3, 1)  # [B, T, K, G, H]
    return out.reshape(b, t, n, h).astype(q.dtype)


def _with_cache(blocks, k, v, visible, dtype):
    """Every slot of the cache (`CacheBlocks.read` of all its blocks), the T new tokens'
    keys, values and visibility written in at slots [index, index + T)."""
    c = blocks.cache
    b, t = visible.shape[:2]
    kc, vc, vis = blocks.read(0, c.v.shape[3] // c.block, dtype)  # [b, K, H, S], ..., [b, ., S]
    at = c.index
    k = jax.lax.dynamic_update_slice_in_dim(kc, k.astype(kc.dtype), at, 3)
    v = jax.lax.dynamic_update_slice_in_dim(vc, v.astype(vc.dtype), at, 2)
    vis = jnp.broadcast_to(vis, (b, t, vis.shape[-1]))
    return k, v, jax.lax.dynamic_update_slice_in_dim(vis, visible, at, 2)
