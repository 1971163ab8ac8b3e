"""A decode step's attention over the KV cache as one Pallas kernel (TPU), reading the cache in
place: `attention.DECODE_KERNEL = "pallas"`.

Why: on a v5e a Qwen3-0.6B decode token step at 64 rows took 23 ms where its bytes take
~4 ms (set 11, docs/results/predict_tpu_validation.md), and its time grew with the cache
read at ~70 GB/s of the chip's 819: the XLA path slices each block out of the stacked
cache of every layer and reduces it in f32. This kernel streams the written slots of one
layer straight from the stacked cache ([L, B, K, H, S] keys, [L, B, K, S, H] values,
addressed by the layer index in scalar prefetch: no slice is copied), 128 slots a grid step,
and folds them into an online softmax (Milakov & Gimelshein 2018) per row and KV head, on
the MXU: scores q·k (the keys widened to q's dtype, exactly) and mixes p·v (p in f32, the
values widened) as dots with f32 accumulation, the XLA path's products.

It returns the softmax's running max, normaliser and unnormalised output over the cache;
`attention.attention` folds them into the new token's own part (`attention._fold_stats`).
Exactly the XLA path's math: slots outside [first block, index) or not valid add exact
zeros.

Requirements (else `attention` keeps the XLA path): one query token, a full-attention
layer (no sliding window), blocks of `SLOTS` slots (`KVCache.blocks` makes them under this
knob), and a cache on one device (`shards` 1: a kernel is not partitioned over a mesh; the
first rows of it used). Off a TPU it runs in Pallas' interpreter, which is how the CPU
tests check it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

SLOTS = 128
"""Cache slots one grid step reads: a lane-width of keys (slots are the keys' minor axis)."""

_MASKED = -1e30  # attention._MASKED: that module imports this one, not the reverse


BLOCK_BYTES = 2 * 2 ** 20
"""Most bytes of keys (and as many of values) one grid step holds: double-buffered, both
take 4x this of VMEM, under the 16 MiB a TPU kernel may use by default."""


def row_tile(rows: int, row_bytes: int = 0, most: int = 8) -> int:
    """Rows a grid step handles: the largest divisor of the used rows up to `most` (its
    heads' dots are unrolled) whose keys (`row_bytes` a row) fit `BLOCK_BYTES`."""
    most = max(1, min(most, BLOCK_BYTES // max(row_bytes, 1)))
    return max(d for d in range(1, min(rows, most) + 1) if rows % d == 0)


def supported(t: int, blocks) -> bool:
    """Whether the kernel reads `blocks` (an `attention.CacheBlocks`) for t query tokens."""
    cache = blocks.cache
    return (t == 1 and blocks.window is None and cache.block == SLOTS and cache.shards == 1
            and cache.valid.shape[1] % SLOTS == 0)


def read_cache(q, cache, layer, rows: int, first, scale: float):
    """(m [b, K, G, 1], l [b, K, G, 1], acc [b, K, G, H]) f32: the online softmax of q [b, K,
    G, H] (one token's queries, grouped by KV head) over `layer`'s written slots from block
    `first` on (in units of `SLOTS`), for the b = `rows` rows the batch uses."""
    _, _, heads, h, slots = cache.k.shape
    g = q.shape[2]
    tile = row_tile(rows, heads * h * SLOTS * cache.k.dtype.itemsize)

    def slot_block(j, meta):  # blocks outside [first, last] repeat a neighbour: no new copy
        last = jnp.maximum(meta[1] - 1, 0) // SLOTS
        return jnp.clip(j, jnp.minimum(meta[2], last), last)

    meta = jnp.stack([jnp.asarray(layer, jnp.int32), jnp.asarray(cache.index, jnp.int32),
                      jnp.asarray(first, jnp.int32)])
    valid = cache.valid.astype(jnp.int32)[:, None]  # [B, 1, S]: a 2-D block's rows of 1
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    stat = pl.BlockSpec((tile, heads, g, 1), lambda i, j, meta: (i, 0, 0, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(rows // tile, slots // SLOTS),
        in_specs=[
            pl.BlockSpec((tile, heads, g, h), lambda i, j, meta: (i, 0, 0, 0)),
            pl.BlockSpec((1, tile, heads, h, SLOTS),
                         lambda i, j, meta: (meta[0], i, 0, 0, slot_block(j, meta))),
            pl.BlockSpec((1, tile, heads, SLOTS, h),
                         lambda i, j, meta: (meta[0], i, 0, slot_block(j, meta), 0)),
            pl.BlockSpec((tile, 1, SLOTS), lambda i, j, meta: (i, 0, slot_block(j, meta))),
        ],
        out_specs=[stat, stat,
                   pl.BlockSpec((tile, heads, g, h), lambda i, j, meta: (i, 0, 0, 0))],
        scratch_shapes=[pltpu.VMEM((tile, heads, g, 1), jnp.float32),
                        pltpu.VMEM((tile, heads, g, 1), jnp.float32),
                        pltpu.VMEM((tile, heads, g, h), jnp.float32)])
    f32 = jnp.float32
    out_shape = [jax.ShapeDtypeStruct((rows, heads, g, 1), f32),
                 jax.ShapeDtypeStruct((rows, heads, g, 1), f32),
                 jax.ShapeDtypeStruct((rows, heads, g, h), f32)]
    kernel = functools.partial(_kernel, tile=tile, heads=heads, scale=scale)
    return pl.pallas_call(
        kernel, out_shape=out_shape, grid_spec=grid_spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpreted())(meta, q, cache.k, cache.v, valid)


def interpreted() -> bool:
    """Whether the kernel runs in Pallas' interpreter: off a TPU (a CPU's tests)."""
    return jax.default_backend() == "cpu"


def _kernel(meta, q_ref, k_ref, v_ref, valid_ref, m_ref, l_ref, acc_ref, m_sc, l_sc, acc_sc,
            *, tile: int, heads: int, scale: float):
    from jax.experimental import pallas as pl

    j = pl.program_id(1)

    @pl.when(j == 0)
    def _start():
        m_sc[...] = jnp.full(m_sc.shape, _MASKED, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    @pl.when((j >= meta[2]) & (j * SLOTS < meta[1]))
    def _fold():
        slot = j * SLOTS + jax.lax.broadcasted_iota(jnp.int32, (1, SLOTS), 1)
        for r in range(tile):
            seen = (valid_ref[r] != 0) & (slot < meta[1])  # [1, SLOTS]
            for k in range(heads):
                q = q_ref[r, k]  # [G, H] in the compute dtype; keys widened to it (exact)
                s = jnp.dot(q, k_ref[0, r, k].astype(q.dtype),
                            preferred_element_type=jnp.float32) * scale  # [G, SLOTS]
                s = jnp.where(seen, s, _MASKED)
                m_old = m_sc[r, k]  # [G, 1]
                m_new = jnp.maximum(m_old, jnp.max(s, axis=-1, keepdims=True))
                p = jnp.where(seen, jnp.exp(s - m_new), 0.0)  # unseen: exact zeros
                decay = jnp.exp(m_old - m_new)
                m_sc[r, k] = m_new
                l_sc[r, k] = l_sc[r, k] * decay + jnp.sum(p, axis=-1, keepdims=True)
                acc_sc[r, k] = acc_sc[r, k] * decay + jnp.dot(  # p in f32, as XLA's path
                    p, v_ref[0, r, k].astype(jnp.float32), preferred_element_type=jnp.float32)

    @pl.when(j == pl.num_programs(1) - 1)
    def _end():
        m_ref[...] = m_sc[...]
        l_ref[...] = l_sc[...]
        acc_ref[...] = acc_sc[...]

