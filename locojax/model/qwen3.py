"""The Qwen3 decoder as one pure function over a weight pytree.

`forward(weights, tokens, positions, cfg, mask=..., cache=...) -> (hidden, cache)`
serves prefill, decode and training alike, so the sampler's logprobs and the trainer's
logprobs come from the same code (DESIGN.md, "sampler logprobs equal trainer logprobs").

Reference: HF transformers `modeling_qwen3.py`; layout after jax-llm-examples `qwen3`.
Departures: layers are scanned (stacked weights), and attention reads a fixed-size KV cache
whose slot validity is tracked explicitly, which is how left-padded prompts are handled.

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


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Keys and values of every layer in fixed slots; `index` is the next slot to write."""

    # Keys are stored transposed (slots minor) so the decode q·k reduces over head_dim with
    # whole slot vectors, values slots-major so p·v reduces over slots with whole head
    # vectors; on XLA:CPU this makes decode attention ~2x faster than [L, B, S, K, H].
    k: jax.Array  # [L, B, K, H, S]
    v: jax.Array  # [L, B, K, S, H]
    valid: jax.Array  # [B, S] bool: slot holds a real (non-pad) token
    index: jax.Array  # [] int32

    @classmethod
    def empty(cls, cfg: ModelConfig, batch: int, slots: int) -> "KVCache":
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, slots, cfg.head_dim)
        k_shape = shape[:3] + (cfg.head_dim, slots)
        return cls(
            k=jnp.zeros(k_shape, cfg.dtype), v=jnp.zeros(shape, cfg.dtype),
            valid=jnp.zeros((batch, slots), bool), index=jnp.zeros((), jnp.int32),
        )


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


def attention(q, parts):
    """GQA of q [B,T,N,H] under one softmax spanning several key/value blocks.

    parts: (k [B,K,H,S], v [B,K,S,H], visible [B,T,S] bool) per block, e.g. the cached
    slots and the new tokens. Only the small scores are concatenated, never the keys.
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

    scores = [jnp.where(vis[:, None, None], score(k) * (h ** -0.5), _MASKED)  # [B, K, G, T, S]
              for k, _, vis in parts]
    probs = barrier(jax.nn.softmax(barrier(jnp.concatenate(scores, axis=-1)), axis=-1))
    bounds = np.cumsum([sc.shape[-1] for sc in scores])[:-1]
    out = sum(mix(p, v) for p, (_, v, _) in zip(jnp.split(probs, bounds, axis=-1), parts))
    return out.reshape(b, t, n, h).astype(q.dtype)  # [B, T, N, H]


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
    reads the S slots, then these T. The caller writes the new keys into the cache once,
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
    if cache_kv is not None:
        parts.insert(0, (cache_kv[0].astype(dt), cache_kv[1].astype(dt), visible[0]))
    attn = attention(q, parts)  # [B, T, N, H]
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
    written at `cache.index` and attend to every valid slot before it and to each other.
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
        return x, (KVCache(*kv, mask, jnp.asarray(t, jnp.int32)) if keep_kv else None)

    s = cache.v.shape[3]
    before = (jnp.arange(s) < cache.index)[None] & cache.valid  # [B, S]: earlier valid slots
    visible = (jnp.broadcast_to(before[:, None], (b, t, s)), causal)

    def cached_body(x, xs):
        w, k_i, v_i = xs
        return layer(cfg, x, w, positions, visible, (k_i, v_i))

    x, (k_new, v_new) = jax.lax.scan(cached_body, x, (weights["layers"], cache.k, cache.v))
    zero = jnp.zeros((), jnp.int32)  # write the T new slots at `index`, in place
    ks = jax.lax.dynamic_update_slice(cache.k, k_new.astype(cache.k.dtype),
                                      (zero, zero, zero, zero, cache.index))
    vs = jax.lax.dynamic_update_slice(cache.v, v_new.astype(cache.v.dtype),
                                      (zero, zero, zero, cache.index, zero))
    valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, mask, cache.index, axis=1)
    x = rms_norm(x, weights["final_norm"], cfg.rms_norm_eps)
    return x, KVCache(ks, vs, valid, cache.index + t)


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
