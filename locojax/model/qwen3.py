"""The Qwen3 decoder as one pure function over a weight pytree.

`forward(weights, tokens, positions, cfg, mask=..., cache=...) -> (hidden, cache)`
serves prefill, decode and training alike, so the sampler's logprobs and the trainer's
logprobs come from the same code (DESIGN.md, "sampler logprobs equal trainer logprobs").

Reference: HF transformers `modeling_qwen3.py`; layout after jax-llm-examples `qwen3`.
Departures: layers are scanned (stacked weights), and attention reads a fixed-size KV cache
whose slot validity is tracked explicitly, which is how left-padded prompts are handled. A
cached forward (decode, extend) reads only the cache's written slots, block by block, under
an online softmax (`attention`), so its cost grows with the tokens written.

Legend: b batch, t query time, s key slot, d model, n q heads, k kv heads, g q heads per kv,
h head dim, f ffn, v vocab, L layers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from locojax.model.config import ModelConfig
from locojax.model.params import Weights

_MASKED = -1e30  # finite, so a row with no visible key (a pad query) gives 0s, not NaNs
# `unroll_for_grad`: differentiated forwards of models with at most this many layers unroll
# the layer scan. The scanned backward stacks every layer's residuals into [L, ...] buffers,
# and zero-filling and slicing them cost ~20% of a small model's gradient on XLA:CPU;
# unrolled, the residuals stay separate buffers. Deeper models keep the scan's compile time.
UNROLL_MAX_LAYERS = 8


BLOCK = 256
"""Most cache slots one step of the blocked attention reads (`KVCache.empty` makes the blocks
as equal as it can); `benchmarks/bench_engine.py --sweep blocks` measured it
(docs/engine_benchmark.md)."""


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

    @staticmethod
    def blocks(slots: int, block: int = BLOCK) -> tuple[int, int]:
        """(n, b): the fewest blocks of at most `block` slots that hold `slots`, as equal as
        they can be (n·b - slots < n slots are spare)."""
        n = -(-slots // block)
        return n, -(-slots // n)

    @classmethod
    def empty(cls, cfg: ModelConfig, batch: int, slots: int, dtype=None, block: int = BLOCK,
              shards: int = 1) -> "KVCache":
        """At least `slots` slots, in `blocks(slots, block)`; dtype: the keys' and values'
        (default: the compute dtype; attention reads either in f32)."""
        n, block = cls.blocks(slots, block)
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, n * block, cfg.head_dim)
        k_shape = shape[:3] + (cfg.head_dim, n * block)
        dtype = cfg.dtype if dtype is None else dtype
        return cls(
            k=jnp.zeros(k_shape, dtype), v=jnp.zeros(shape, dtype),
            valid=jnp.zeros((batch, n * block), bool), index=jnp.zeros((), jnp.int32),
            block=block, shards=shards)

    def read(self, x, axis: int, b: int, start, size):
        """`dynamic_slice(x, start, size)` of the b rows a b-row batch uses (x: a cache array,
        its batch at `axis`; start and size without the batch axis)."""
        d = self.shards
        y = x.reshape(x.shape[:axis] + (d, x.shape[axis] // d) + x.shape[axis + 1:])
        zero = jnp.zeros((), jnp.int32)
        out = jax.lax.dynamic_slice(y, tuple(start[:axis]) + (zero, zero) + tuple(start[axis:]),
                                    tuple(size[:axis]) + (d, b // d) + tuple(size[axis:]))
        return out.reshape(tuple(size[:axis]) + (b,) + tuple(size[axis:]))

    def write(self, x, new, axis: int, slot_axis: int, slot=None):
        """x with `new` (a b-row batch's T slots, its batch at `axis`) written in place at
        `slot` (default `index`) of the rows that batch uses."""
        d = self.shards
        split = lambda a: a.reshape(  # noqa: E731
            a.shape[:axis] + (d, a.shape[axis] // d) + a.shape[axis + 1:])
        start = [jnp.zeros((), jnp.int32)] * (x.ndim + 1)
        start[slot_axis + 1] = self.index if slot is None else jnp.asarray(slot, jnp.int32)
        return jax.lax.dynamic_update_slice(split(x), split(new.astype(x.dtype)),
                                            start).reshape(x.shape)


def _wide(dtype):
    """Where softmax, norms, RoPE and accumulation run: f32, or f64 for f64 compute."""
    return jnp.promote_types(dtype, jnp.float32)


def rms_norm(x, scale, eps):
    """HF Qwen3RMSNorm: normalise in f32 (f64 for f64 x), cast back, then scale."""
    x32 = x.astype(_wide(x.dtype))
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale.astype(x.dtype) * x32.astype(x.dtype)


def rope(x, positions, theta):
    """Rotate-half RoPE (HF `apply_rotary_pos_emb`). x: [B, T, heads, H], positions: [B, T]."""
    h, wide = x.shape[-1], _wide(x.dtype)
    inv_freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=wide) / h))  # [H/2]
    angles = positions.astype(wide)[..., None] * inv_freq  # [B, T, H/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, H]
    x1, x2 = jnp.split(x.astype(wide), 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x.astype(wide) * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class CacheBlocks:
    """What one layer's attention reads of a cache: the written slots [0, index) of the
    first b rows (`KVCache.read`), in `blocks` blocks of `cache.block` slots."""

    cache: KVCache
    layer: jax.Array  # [] int32
    rows: int  # b

    @property
    def count(self):  # [] int32: the blocks that hold a written slot
        return (self.cache.index + self.cache.block - 1) // self.cache.block

    def read(self, j, dtype):
        """Block j: keys [b, K, H, blk], values [b, K, blk, H] in `dtype`, visible [b, blk]."""
        c, b, blk = self.cache, self.rows, self.cache.block
        _, _, kv, h, _ = c.k.shape
        zero, first = jnp.zeros((), jnp.int32), jnp.asarray(j * blk, jnp.int32)
        k = c.read(c.k, 1, b, (self.layer, zero, zero, first), (1, kv, h, blk))[0]
        v = c.read(c.v, 1, b, (self.layer, zero, first, zero), (1, kv, blk, h))[0]
        valid = c.read(c.valid, 0, b, (first,), (blk,))
        visible = valid & (first + jnp.arange(blk) < c.index)[None]
        return k.astype(dtype), v.astype(dtype), visible


def attention(q, parts, blocks: CacheBlocks | None = None):
    """GQA of q [B,T,N,H] under one softmax spanning several key/value blocks.

    parts: (k [B,K,H,S], v [B,K,S,H], visible [B,T,S] bool) per block, e.g. the new tokens
    (and, in the train step's shared prefix, the prompt's). Only the small scores are
    concatenated, never the keys. blocks: a cache's written slots, read block by block in
    a loop with an online softmax (Milakov & Gimelshein 2018, arXiv:1805.02867, as in
    FlashAttention): each block rescales the running max, normaliser and unnormalised
    output that `parts` start. Accumulation is in f32 (f64 for f64 q) throughout, whatever
    the cache's dtype.
    """
    b, t, n, h = q.shape
    kv_heads, wide = parts[0][0].shape[1], _wide(q.dtype)
    q = q.reshape(b, t, kv_heads, n // kv_heads, h)  # [B, T, K, G, H]
    # Decode (T = 1): broadcast multiply-reduces, which XLA:CPU runs several times faster
    # than B*K tiny batched matmuls; the barriers stop it fusing the reductions into the
    # softmax, which recomputed them. Same math, f32 accumulation, as the einsums.
    decode = t == 1
    barrier = jax.lax.optimization_barrier if decode else (lambda x: x)
    if decode:
        q1 = q[:, 0, :, :, :, None].astype(wide)  # [B, K, G, H, 1]

        def score(k):  # [B, K, G, 1, S]
            return jnp.sum(q1 * k[:, :, None].astype(wide), axis=3)[:, :, :, None]

        def mix(p, v):  # [B, 1, K, G, H]
            return jnp.sum(p[:, :, :, 0, :, None] * v[:, :, None].astype(wide),
                           axis=3)[:, None]
    else:
        def score(k):  # f32 scores; XLA:CPU has no bf16 x bf16 -> f32 dot, so upcast first
            return jnp.einsum("btkgh,bkhs->bkgts", q.astype(wide), k.astype(wide))

        def mix(p, v):
            return jnp.einsum("bkgts,bksh->btkgh", p.astype(v.dtype), v).astype(wide)

    def masked_score(k, visible):  # [B, K, G, T, S]; visible [B, T, S]
        return jnp.where(visible[:, None, None], score(k) * (h ** -0.5), _MASKED)

    scores = [masked_score(k, vis) for k, _, vis in parts]
    if blocks is None:
        probs = barrier(jax.nn.softmax(barrier(jnp.concatenate(scores, axis=-1)), axis=-1))
        bounds = np.cumsum([sc.shape[-1] for sc in scores])[:-1]
        out = sum(mix(p, v) for p, (_, v, _) in zip(jnp.split(probs, bounds, axis=-1), parts))
        return out.reshape(b, t, n, h).astype(q.dtype)  # [B, T, N, H]

    bt = lambda x: jnp.moveaxis(x, 3, 1)  # noqa: E731  [B, K, G, T, 1] -> [B, T, K, G, 1]

    def add(carry, s, v):  # fold in scores s [B, K, G, T, S] over values v
        m, total, acc = carry
        m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
        p = barrier(jnp.exp(s - m_new))
        scale = jnp.exp(m - m_new)
        return m_new, total * scale + jnp.sum(p, -1, keepdims=True), acc * bt(scale) + mix(p, v)

    s = jnp.concatenate(scores, axis=-1)
    m = jnp.max(s, axis=-1, keepdims=True)  # [B, K, G, T, 1]
    p = barrier(jnp.exp(s - m))
    carry = m, jnp.sum(p, -1, keepdims=True), mix(p, jnp.concatenate([v for _, v, _ in parts], 2))

    def block(j, carry):
        k, v, visible = blocks.read(j, q.dtype)
        return add(carry, masked_score(k, visible[:, None]), v)

    if blocks.cache.v.shape[3] == blocks.cache.block:
        # One block: read it without a loop. Unwritten slots add exact zeros (exp(-1e30 - m)).
        carry = block(0, carry)
    else:
        carry = jax.lax.fori_loop(0, blocks.count, block, carry)
    _, total, acc = carry
    return (acc / bt(total)).reshape(b, t, n, h).astype(q.dtype)  # [B, T, N, H]


def dense(x, w, contract: int = 1):
    """x [B, T, *in] @ w [*in, *out] -> [B, T, *out]; `contract`: how many trailing dims are in.

    Written as one 2-D matmul over B*T rows. The einsum form ("btd,dnh->btnh") gives the
    same forward, but its weight gradient contracts over two dims (b, t), which XLA:CPU
    runs off its fast matmul path: the layer backward measured ~1.5x slower.
    """
    lead, inner = x.shape[:-contract], x.shape[-contract:]
    out = w.shape[contract:]
    y = x.reshape(-1, int(np.prod(inner))) @ w.reshape(int(np.prod(inner)), -1)
    return y.reshape(*lead, *out)


def layer(cfg: ModelConfig, x, w, positions, visible, cache_kv=None):
    """One decoder layer; returns this layer's new keys [B, K, H, T] and values [B, K, T, H].

    visible: ([B, T, S] over the cached slots or None, [B, T, T] over these T tokens).
    With `cache_kv` (this layer's cached keys and values, in KVCache layout, read-only) attention
    reads the S slots, then these T; with `CacheBlocks` instead (the cached forward), it reads
    the written slots block by block. The caller writes the new keys into the cache once,
    after all layers: writing inside the layer loop made XLA copy the whole cache per layer.
    """
    dt = cfg.dtype
    y = rms_norm(x, w["attn_norm"], cfg.rms_norm_eps)
    q = dense(y, w["wq"].astype(dt))  # [B, T, N, H]
    k = dense(y, w["wk"].astype(dt))  # [B, T, K, H]
    v = dense(y, w["wv"].astype(dt))
    q = rope(rms_norm(q, w["q_norm"], cfg.rms_norm_eps), positions, cfg.rope_theta)
    k = rope(rms_norm(k, w["k_norm"], cfg.rms_norm_eps), positions, cfg.rope_theta)
    new_kv = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)  # [B, K, H, T], [B, K, T, H]
    parts = [(*new_kv, visible[1])]
    blocks = cache_kv if isinstance(cache_kv, CacheBlocks) else None
    if cache_kv is not None and blocks is None:
        parts.insert(0, (cache_kv[0].astype(dt), cache_kv[1].astype(dt), visible[0]))
    attn = attention(q, parts, blocks)  # [B, T, N, H]
    x = x + dense(attn, w["wo"].astype(dt), contract=2)

    y = rms_norm(x, w["mlp_norm"], cfg.rms_norm_eps)
    gate = dense(y, w["w_gate"].astype(dt))
    up = dense(y, w["w_up"].astype(dt))
    x = x + dense(jax.nn.silu(gate) * up, w["w_down"].astype(dt))
    return x, new_kv


def forward(
    weights: Weights,
    tokens: jax.Array,
    positions: jax.Array,
    cfg: ModelConfig,
    mask: jax.Array | None = None,
    cache: KVCache | None = None,
    keep_kv: bool = False,
    unroll: bool = False,
    remat: bool = False,
) -> tuple[jax.Array, KVCache | None]:
    """Final hidden states [B, T, D] (after the last norm) and the updated cache.

    tokens, positions: [B, T] int. mask: [B, T] bool, False for padding (default all True).
    Without a cache, attention is causal over these T tokens; with one, the T tokens are
    written at `cache.index` and attend to every valid slot before it (read in blocks, only
    those holding a written slot) and to each other; B may be less than the cache's rows
    (`KVCache.read`).
    keep_kv (without a cache): also return these T tokens' keys/values as a T-slot cache,
    which is how a sampler prefills (no empty cache to attend over).
    unroll (without a cache): unroll the layer loop, for a forward that is differentiated
    (see `unroll_for_grad`); a forward alone measured ~25% slower unrolled on XLA:CPU.
    remat (without a cache): rematerialise each layer in the backward (`jax.checkpoint`):
    a differentiated forward then keeps only each layer's input [B, T, D] instead of all
    its activations (attention scores, SwiGLU), for about one more forward of compute.
    """
    b, t = tokens.shape
    mask = jnp.ones((b, t), bool) if mask is None else mask
    x = jnp.take(weights["embed"], tokens, axis=0).astype(cfg.dtype)  # [B, T, D]
    causal = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :]  # [B, T, T]

    if cache is None:
        # Training / scoring path: no cache in the scan carry, so autodiff through the scan
        # stores O(L) activations, not L copies of an [L, ...] cache.
        def body(x, w):
            x, new_kv = layer(cfg, x, w, positions, (None, causal))
            return x, (new_kv if keep_kv else None)

        if remat:  # prevent_cse is needed only where the scan is unrolled into straight code
            body = jax.checkpoint(body, prevent_cse=unroll)

        x, kv = jax.lax.scan(body, x, weights["layers"], unroll=unroll)
        x = rms_norm(x, weights["final_norm"], cfg.rms_norm_eps)
        return x, (KVCache(*kv, mask, jnp.asarray(t, jnp.int32), block=t) if keep_kv else None)

    def cached_body(x, xs):
        w, i = xs
        return layer(cfg, x, w, positions, (None, causal), CacheBlocks(cache, i, b))

    x, (k_new, v_new) = jax.lax.scan(
        cached_body, x, (weights["layers"], jnp.arange(cfg.num_hidden_layers, dtype=jnp.int32)))
    # Write the T new slots at `index`, in place, once after all layers.
    cache = dataclasses.replace(
        cache, k=cache.write(cache.k, k_new, 1, 4), v=cache.write(cache.v, v_new, 1, 3),
        valid=cache.write(cache.valid, mask, 0, 1), index=cache.index + t)
    return rms_norm(x, weights["final_norm"], cfg.rms_norm_eps), cache


def unroll_for_grad(cfg: ModelConfig) -> bool:
    """Whether a differentiated forward of this model should unroll its layers."""
    return cfg.num_hidden_layers <= UNROLL_MAX_LAYERS


def logits(weights: Weights, hidden: jax.Array, cfg: ModelConfig) -> jax.Array:
    """[B, T, D] hidden → [B, T, V] f32 logits (f64 for f64 hidden; tied: the embedding;
    else lm_head).

    One 2-D matmul over B*T rows, like `dense`: with the batched einsum, XLA:CPU materialised
    a transposed copy of the [B, T, V] logit gradient for the embedding's gradient.
    """
    b, t, d = hidden.shape
    # Tied: contract the embedding's own D axis ([V, D]) rather than multiply by its
    # transpose, for which XLA made a [D, V] copy as big as the embedding (622 MB at 0.6B).
    tied = cfg.tie_word_embeddings
    head = weights["embed"] if tied else weights["lm_head"]  # [V, D] or [D, V]
    dims = (((1,), (1 if tied else 0,)), ((), ()))
    out = jax.lax.dot_general(hidden.reshape(b * t, d), head.astype(hidden.dtype), dims,
                              preferred_element_type=_wide(hidden.dtype))
    return out.reshape(b, t, -1)


AUTO_CHUNK = -1
"""`token_logprobs(chunk=AUTO_CHUNK)`: chunk only when the whole logits buffer is too big."""
LOGITS_WHOLE_BYTES = 256 * 2**20
"""Automatic chunking starts when the whole [B, T, V] f32 logits would exceed this (SMALL's
199 MB stay whole: chunking costs one more logits matmul in the backward)."""
LOGITS_CHUNK_BYTES = 64 * 2**20
"""...and then keeps each chunk's [B, C, V] logits under this. A chunk also has its softmax
and, in the backward, a logit gradient of the same size: a step holds a few times this."""


def logprob_chunk_size(rows: int, positions: int, vocab: int, chunk: int = AUTO_CHUNK,
                       itemsize: int = 4) -> int:
    """Positions per chunk that `token_logprobs` uses for [rows, positions] targets; 0 = one piece.

    chunk: positions per chunk as asked (0 = never chunk), or AUTO_CHUNK: one piece up to
    LOGITS_WHOLE_BYTES of [rows, positions, vocab] logits, else the fewest equal chunks whose
    [rows, C, vocab] logits stay under LOGITS_CHUNK_BYTES (at least 1 position). The sizes are
    of the traced (global) batch, so the choice does not depend on the layout.
    """
    if chunk != AUTO_CHUNK:
        if chunk < 0:
            raise ValueError(f"logprob chunk must be >= 0 or {AUTO_CHUNK} (auto), got {chunk}")
        return 0 if chunk >= positions else chunk
    per_position = rows * vocab * itemsize
    if positions * per_position <= LOGITS_WHOLE_BYTES:
        return 0
    n = -(-positions // max(1, LOGITS_CHUNK_BYTES // per_position))  # chunks needed
    return -(-positions // n)  # equal chunks: the least padding


def token_logprobs(weights: Weights, hidden: jax.Array, targets: jax.Array, cfg: ModelConfig,
                   temperature: float = 1.0, chunk: int = AUTO_CHUNK):
    """log p(targets) [B, T] from hidden [B, T, D], and the entropy of each position's
    distribution; over position chunks when the [B, T, V] logits would be too big.

    Chunked, neither the forward nor the backward ever holds more than one chunk's
    [B, C, V] logits: each chunk is rematerialised (`jax.checkpoint`), so the backward
    recomputes its logits from the chunk's hidden states. Without remat a scan keeps every
    chunk's softmax for the backward, stacked into one [N, B, C, V] buffer: the whole
    [B, T, V] again (what `chunk` did before: docs/real_size.md has the measurement).
    Chunks split positions, never rows, so rows stay sharded over the batch axis.
    """
    b, t = targets.shape
    chunk = logprob_chunk_size(b, t, cfg.vocab_size, chunk)

    def one(h, tg):
        wide = h.dtype == _wide(h.dtype)
        picked = target_logits(weights, h, tg, cfg) / temperature if wide else None
        return _logprobs_and_entropy(logits(weights, h, cfg) / temperature, tg, picked)

    if not chunk:
        return one(hidden, targets)
    pad = -t % chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    n = hidden.shape[1] // chunk
    hs = hidden.reshape(b, n, chunk, -1).swapaxes(0, 1)  # [N, B, C, D]
    ts = targets.reshape(b, n, chunk).swapaxes(0, 1)  # [N, B, C]
    remat = jax.checkpoint(one, prevent_cse=False)  # inside a scan CSE cannot undo remat
    _, (lp, ent) = jax.lax.scan(lambda _, xs: (None, remat(*xs)), None, (hs, ts))
    unchunk = lambda a: a.swapaxes(0, 1).reshape(b, -1)[:, :t]  # noqa: E731  [B, T]
    return unchunk(lp), unchunk(ent)


def target_logits(weights: Weights, hidden: jax.Array, targets: jax.Array,
                  cfg: ModelConfig) -> jax.Array:
    """[B, T] logits of `targets` alone: each position's hidden state · its target's head row,
    the dot products of those entries of `logits`. Only for wide (f32, f64) hidden states:
    with bf16 ones, inside a jitted program the logprobs it gave moved by ~7e-4 (the scale of
    a bf16 rounding) from those picked out of the matmul; which op rounds was not traced.
    """
    tied = cfg.tie_word_embeddings
    if tied:
        rows = jnp.take(weights["embed"], targets, axis=0)  # [B, T, D]
    else:
        rows = jnp.moveaxis(jnp.take(weights["lm_head"], targets, axis=1), 0, -1)
    return jnp.sum(hidden * rows.astype(hidden.dtype), axis=-1)


def _logprobs_and_entropy(logits_btv, targets, target_btv=None):
    """log p(target) and the entropy of each position, from the [B, T, V] logits.

    Given the targets' own logits (`target_logits`), as `jax.nn.log_softmax` computes it
    (shifted by the stopped max), the target's logprob is its logit minus the normaliser:
    its gradient reaches the [B, T, V] logits through the softmax alone. Picking it out of
    the log-softmax instead (`take_along_axis`, narrow dtypes) makes the backward build a
    one-hot [B, T, V] gradient: a zero fill and a scatter as big as the logits, ~10% of a
    SMALL train step (docs/peers_benchmark.md)."""
    if target_btv is None:
        logp = jax.nn.log_softmax(logits_btv, axis=-1)
        picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    else:
        top = jax.lax.stop_gradient(jnp.max(logits_btv, axis=-1, keepdims=True))
        shifted = logits_btv - top
        norm = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))  # [B, T, 1]
        logp = shifted - norm
        picked = target_btv - top[..., 0] - norm[..., 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return picked, entropy
