"""The decoder of every family as one pure function over a weight pytree.

`forward(weights, tokens, positions, cfg, mask=..., cache=...) -> (hidden, cache)`
serves prefill, decode and training alike, so the sampler's logprobs and the trainer's
logprobs come from the same code (docs/design.md, "sampler logprobs equal trainer logprobs").
Qwen3, Qwen2/2.5, Llama 3.x and Gemma 3 share it; `cfg.family` (`families.py`) switches
the parts that differ (biases, q/k norms, Gemma's norms, embedding scale and activation),
and each layer's `LayerKind` carries its RoPE frequencies and attention window, so Gemma's
local and global layers are one scan.

Reference: HF transformers `modeling_qwen3.py` (and the `modeling_*.py` of the other
families); layout after jax-llm-examples `qwen3`. Departures: layers are scanned (stacked
weights), and attention reads a fixed-size KV cache whose slot validity is tracked
explicitly, which is how left-padded prompts are handled (`attention.py`). A cached forward
(decode, extend) reads only the cache's written slots, block by block, under an online
softmax, so its cost grows with the tokens written.

Legend: b batch, t query time, s key slot, d model, n q heads, k kv heads, g q heads per kv,
h head dim, f ffn, v vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

# BLOCK and attention too: the engine and tests name the cache and attention as qwen3.*.
from locojax.model.attention import (  # noqa: F401
    BLOCK,
    CacheBlocks,
    KVCache,
    as_bits,
    attention,
    from_bits,
    slot_positions,
    wide_dtype,
    within,
)
from locojax.model import accumulating_scan, invariant
from locojax.model.config import FULL, SLIDING, ModelConfig
from locojax.model.lora import Lora
from locojax.model.params import Weights

# `unroll_for_grad`: differentiated forwards of models with at most this many layers unroll
# the layer scan. The scanned backward stacks every layer's residuals into [L, ...] buffers,
# and zero-filling and slicing them cost ~20% of a small model's gradient on XLA:CPU;
# unrolled, the residuals stay separate buffers. Deeper models keep the scan's compile time.
UNROLL_MAX_LAYERS = 8
_NO_WINDOW = 2**30  # a full-attention layer's window in a model that also has local ones


def norm(x, scale, cfg: ModelConfig):
    """RMSNorm, normalising in f32 (f64 for f64 x). HF Qwen3/Llama: cast back, then scale
    by w; Gemma (`unit_offset_norm`): scale by (1 + w) in f32, then cast back."""
    wide = wide_dtype(x.dtype)
    x32 = x.astype(wide)
    mean = invariant.tree_mean if cfg.batch_invariant else jnp.mean
    x32 = x32 * jax.lax.rsqrt(mean(x32 * x32, axis=-1, keepdims=True) + cfg.rms_norm_eps)
    if cfg.family.unit_offset_norm:
        return (x32 * (1.0 + scale.astype(wide))).astype(x.dtype)
    return scale.astype(x.dtype) * x32.astype(x.dtype)


def inv_freq(cfg: ModelConfig, kind: str, dtype) -> jax.Array:
    """[H/2] RoPE inverse frequencies of a layer of `kind` (HF `ROPE_INIT_FUNCTIONS`:
    default, linear, llama3), computed in `dtype` as HF computes them in f32."""
    h = cfg.head_dim
    local = kind == SLIDING and cfg.rope_local_theta is not None
    theta = cfg.rope_local_theta if local else cfg.rope_theta
    freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=dtype) / h))
    rs = None if kind == SLIDING else cfg.rope_scaling
    if rs is None:
        return freq
    if rs.rope_type == "linear":
        return freq / rs.factor
    # llama3: long wavelengths slowed by `factor`, short ones kept, a linear ramp between.
    old = rs.original_max_position_embeddings
    wavelen = 2 * math.pi / freq
    scaled = jnp.where(wavelen > old / rs.low_freq_factor, freq / rs.factor, freq)
    smooth = (old / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = ~(wavelen < old / rs.high_freq_factor) & ~(wavelen > old / rs.low_freq_factor)
    return jnp.where(medium, smoothed, scaled)


def rope(x, positions, freq):
    """Rotate-half RoPE (HF `apply_rotary_pos_emb`). x: [B, T, heads, H], positions: [B, T],
    freq: [H/2] inverse frequencies (`inv_freq`)."""
    wide = wide_dtype(x.dtype)
    angles = positions.astype(wide)[..., None] * freq.astype(wide)  # [B, T, H/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, H]
    x1, x2 = jnp.split(x.astype(wide), 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x.astype(wide) * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerKind:
    """What differs between one model's layers besides their weights: RoPE frequencies and
    the attention window (None in models without local layers). Scanned with the weights."""

    inv_freq: jax.Array  # [H/2] (stacked: [L, H/2])
    window: jax.Array | None  # [] int32 W, or _NO_WINDOW in a full layer (stacked: [L])


def layer_kind(cfg: ModelConfig, kind: str, dtype) -> LayerKind:
    """One layer of `kind` (FULL or SLIDING)."""
    window = None
    if cfg.windowed:
        window = jnp.int32(cfg.sliding_window if kind == SLIDING else _NO_WINDOW)
    return LayerKind(inv_freq(cfg, kind, dtype), window)


def layer_kinds(cfg: ModelConfig, dtype) -> LayerKind:
    """Every layer's kind, stacked on a leading [L] axis to scan with the layer weights."""
    kinds = cfg.layer_types or (FULL,) * cfg.num_hidden_layers
    return jax.tree.map(lambda *xs: jnp.stack(xs), *[layer_kind(cfg, k, dtype) for k in kinds])


def embed(weights: Weights, tokens, cfg: ModelConfig):
    """[B, T] tokens -> [B, T, D] in the compute dtype (Gemma: times sqrt(d), rounded to the
    weights' dtype as HF's `Gemma3TextScaledWordEmbedding` does); lookups of
    `cfg.embedding_padding_idx` pass no gradient back to the table."""
    table = weights["embed"]  # gathered as bits: see `attention.as_bits` (a bf16 rollout copy)
    x = from_bits(jnp.take(as_bits(table), tokens, axis=0), table.dtype)  # [B, T, D]
    if cfg.embedding_padding_idx is not None:  # HF's padding_idx: no gradient through it
        x = jnp.where((tokens == cfg.embedding_padding_idx)[..., None],
                      jax.lax.stop_gradient(x), x)
    if cfg.family.scaled_embedding:
        x = x * jnp.asarray(cfg.hidden_size ** 0.5, x.dtype)
    return x.astype(cfg.dtype)


def final_norm(weights: Weights, x, cfg: ModelConfig):
    return norm(x, weights["final_norm"], cfg)


def dense(x, w, contract: int = 1, tiled: bool = False):
    """x [B, T, *in] @ w [*in, *out] -> [B, T, *out]; `contract`: how many trailing dims are in.

    Written as one 2-D matmul over B*T rows. The einsum form ("btd,dnh->btnh") gives the
    same forward, but its weight gradient contracts over two dims (b, t), which XLA:CPU
    runs off its fast matmul path: the layer backward measured ~1.5x slower.
    tiled: in fixed row tiles (`invariant.matmul`), for `ModelConfig.batch_invariant`.
    """
    if isinstance(w, Lora):  # x @ W + s (x @ A) @ B, the sum after both: B = 0 adds exact 0
        low = dense(x, w.a, contract, tiled)  # [B, T, r]
        return dense(x, w.w, contract, tiled) + w.scale * dense(low, w.b, tiled=tiled)
    lead, inner = x.shape[:-contract], x.shape[-contract:]
    out = w.shape[contract:]
    x2, w2 = x.reshape(-1, int(np.prod(inner))), w.reshape(int(np.prod(inner)), -1)
    dot = jnp.matmul
    if narrow(w.dtype, x.dtype):  # a rollout copy's bf16 weights under f32 compute
        x2, dot = x2.astype(w.dtype), functools.partial(jax.lax.dot, preferred_element_type=x.dtype)
    y = invariant.matmul(x2, w2, dot) if tiled else dot(x2, w2)
    return y.reshape(*lead, *out)


def narrow(weight_dtype, compute_dtype) -> bool:
    """Whether weights of `weight_dtype` are a narrower copy than the compute (a bf16 rollout
    copy, `Engine(weights_dtype=...)`): such a matmul rounds its activations to the weights'
    dtype and accumulates in the compute dtype. XLA:CPU runs a bf16 x bf16 -> f32 dot 1.3-1.9x
    faster than the f32 one at decode's 8-128 rows, but a bf16 weight upcast to f32 first
    2-14x slower (docs/results/engine_real_roofline.md, "Real model"); f32 weights are as before.
    """
    w, c = jnp.dtype(weight_dtype), jnp.dtype(compute_dtype)
    return w.itemsize == 2 and jnp.issubdtype(w, jnp.floating) and c.itemsize > 2


def matrix(w, dtype):
    """A weight matrix as a matmul takes it: cast to the compute dtype, or kept as a narrower
    rollout copy (`narrow`), which `dense` and `logits` multiply without upcasting. A LoRA
    weight (`lora.Lora`) casts each part so: a bf16 frozen base stays bf16, its f32
    adapters compute in the compute dtype."""
    if isinstance(w, Lora):
        return Lora(matrix(w.w, dtype), matrix(w.a, dtype), matrix(w.b, dtype), w.scale)
    return w if narrow(w.dtype, dtype) else w.astype(dtype)


def layer(cfg: ModelConfig, x, w, positions, visible, cache_kv=None,
          kind: LayerKind | None = None):
    """One decoder layer; returns this layer's new keys [B, K, H, T] and values [B, K, T, H].

    visible: ([B, T, S] over the cached slots or None, [B, T, T] over these T tokens).
    With `cache_kv` (this layer's cached keys and values, in KVCache layout, read-only, and in
    a model with local layers their positions [B, S]) attention reads the S slots, then
    these T; with `CacheBlocks` instead (the cached forward), it reads the written slots
    block by block. The caller writes the new keys into the cache once, after all layers:
    writing inside the layer loop made XLA copy the whole cache per layer.
    kind: this layer's RoPE and window (`layer_kinds`); None: a full-attention layer, which
    needs no key positions (e.g. `memory_plan`'s probe of one layer's shapes).
    """
    dt, fam = cfg.dtype, cfg.family
    mm = functools.partial(dense, tiled=cfg.batch_invariant)
    kind = LayerKind(inv_freq(cfg, FULL, wide_dtype(dt)), None) if kind is None else kind
    y = norm(x, w["attn_norm"], cfg)
    q = mm(y, matrix(w["wq"], dt))  # [B, T, N, H]
    k = mm(y, matrix(w["wk"], dt))  # [B, T, K, H]
    v = mm(y, matrix(w["wv"], dt))
    if fam.qkv_bias:
        q, k, v = q + w["bq"].astype(dt), k + w["bk"].astype(dt), v + w["bv"].astype(dt)
    if fam.qk_norm:
        q, k = norm(q, w["q_norm"], cfg), norm(k, w["k_norm"], cfg)
    q, k = rope(q, positions, kind.inv_freq), rope(k, positions, kind.inv_freq)
    new_kv = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)  # [B, K, H, T], [B, K, T, H]
    near = (lambda vis, _: vis) if kind.window is None else (  # noqa: E731
        lambda vis, k_pos: vis & within(positions, k_pos, kind.window))
    parts = [(*new_kv, near(visible[1], positions))]
    blocks = cache_kv if isinstance(cache_kv, CacheBlocks) else None
    if blocks is not None and kind.window is not None:
        blocks = dataclasses.replace(blocks, window=kind.window, positions=positions)
    if cache_kv is not None and blocks is None:
        k_pos = cache_kv[2] if kind.window is not None else None
        parts.insert(0, (cache_kv[0].astype(dt), cache_kv[1].astype(dt), near(visible[0], k_pos)))
    scale = None if cfg.query_pre_attn_scalar is None else cfg.query_pre_attn_scalar ** -0.5
    attend = invariant.attention if cfg.batch_invariant else attention
    attn = attend(q, parts, blocks, scale)  # [B, T, N, H]
    out = mm(attn, matrix(w["wo"], dt), contract=2)
    x = x + (norm(out, w["attn_out_norm"], cfg) if fam.sandwich_norms else out)

    y = norm(x, w["mlp_norm"], cfg)
    gate = mm(y, matrix(w["w_gate"], dt))
    up = mm(y, matrix(w["w_up"], dt))
    act = jax.nn.silu(gate) if fam.activation == "silu" else jax.nn.gelu(gate, approximate=True)
    out = mm(act * up, matrix(w["w_down"], dt))
    x = x + (norm(out, w["mlp_out_norm"], cfg) if fam.sandwich_norms else out)
    return x, new_kv


def layer_weights(stacked: Weights, i) -> Weights:
    """Layer i's weights, read out of the stacked [L, ...] ones inside a cached forward's loop.

    Not as the layer scan's `xs`: scanned, a bf16 rollout copy's whole stack was converted to
    f32 at every call (XLA:CPU slices no bf16 array as it is). The optimization barrier tying
    the stack to the loop index (as `KVCache.read` ties the cache) keeps the slice inside the
    loop. Each layer's slice is still copied before its matmuls, in f32 as when scanned
    (~22 ms of a 32-row SmolLM2-135M step; neutral in f32 against the scan), in bf16 at half
    the bytes (docs/results/engine_real_roofline.md, "Real model")."""
    stacked, i = jax.lax.optimization_barrier((stacked, i))
    return jax.tree.map(lambda w: jax.lax.dynamic_index_in_dim(w, i, 0, keepdims=False), stacked)


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
    layer_grads: Weights | None = None,
) -> tuple[jax.Array, KVCache | None]:
    """Final hidden states [B, T, D] (after the last norm) and the updated cache.

    tokens, positions: [B, T] int. mask: [B, T] bool, False for padding (default all True).
    Without a cache, attention is causal over these T tokens; with one, the T tokens are
    written at `cache.index` and attend to every valid slot before it (read in blocks, only
    those holding a written slot) and to each other; B may be less than the cache's rows
    (`KVCache.read`). A sliding-window layer sees only the keys less than W positions back.
    keep_kv (without a cache): also return these T tokens' keys/values as a T-slot cache,
    which is how a sampler prefills (no empty cache to attend over).
    unroll (without a cache): unroll the layer loop, for a forward that is differentiated
    (see `unroll_for_grad`); a forward alone measured ~25% slower unrolled on XLA:CPU.
    remat (without a cache): rematerialise each layer in the backward (`jax.checkpoint`):
    a differentiated forward then keeps only each layer's input [B, T, D] instead of all
    its activations (attention scores, MLP), for about one more forward of compute.
    layer_grads (with remat, without a cache or keep_kv): the f32 running sum of the layers'
    gradients, [L, ...] like `weights["layers"]`; differentiated, its cotangent is that sum
    plus this forward's layer gradients, added in place (`accumulating_scan.py`), and the
    layer weights get none.
    """
    b, t = tokens.shape
    mask = jnp.ones((b, t), bool) if mask is None else mask
    x = embed(weights, tokens, cfg)  # [B, T, D]
    causal = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :]  # [B, T, T]
    kinds = layer_kinds(cfg, wide_dtype(cfg.dtype))

    if cache is None:
        # Training / scoring path: no cache in the scan carry, so autodiff through the scan
        # stores O(L) activations, not L copies of an [L, ...] cache.
        def body(x, xs):
            w, kind = xs
            x, new_kv = layer(cfg, x, w, positions, (None, causal), kind=kind)
            return x, (new_kv if keep_kv else None)

        if layer_grads is not None:  # the gradient summed in place: one f32 buffer
            x = accumulating_scan.scan(
                lambda x, w, kind, c: layer(cfg, x, w, c[0], (None, c[1]), kind=kind)[0], x,
                weights["layers"], kinds, layer_grads, (positions, causal), unroll)
            return final_norm(weights, x, cfg), None
        if remat:  # prevent_cse is needed only where the scan is unrolled into straight code
            body = jax.checkpoint(body, prevent_cse=unroll)

        x, kv = jax.lax.scan(body, x, (weights["layers"], kinds), unroll=unroll)
        x = final_norm(weights, x, cfg)
        return x, (KVCache(*kv, mask, jnp.asarray(t, jnp.int32), block=t) if keep_kv else None)

    slot_pos = slot_positions(cache.valid) if cfg.windowed else None

    def cached_body(x, xs):
        i, kind = xs
        w = layer_weights(weights["layers"], i)
        blocks = CacheBlocks(cache, i, b, slot_positions=slot_pos)
        return layer(cfg, x, w, positions, (None, causal), blocks, kind)

    x, (k_new, v_new) = jax.lax.scan(
        cached_body, x, (jnp.arange(cfg.num_hidden_layers, dtype=jnp.int32), kinds))
    # Write the T new slots at `index`, in place, once after all layers.
    cache = dataclasses.replace(
        cache, k=cache.write(cache.k, k_new, 1, 4), v=cache.write(cache.v, v_new, 1, 3),
        valid=cache.write(cache.valid, mask, 0, 1), index=cache.index + t)
    return final_norm(weights, x, cfg), cache


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
    head = matrix(weights["embed"] if tied else weights["lm_head"], hidden.dtype)  # [V, D]/[D, V]
    dims = (((1,), (1 if tied else 0,)), ((), ()))
    h2 = hidden.reshape(b * t, d)
    if narrow(head.dtype, hidden.dtype):  # a bf16 rollout copy: see `narrow`
        h2 = h2.astype(head.dtype)
    dot = functools.partial(jax.lax.dot_general, dimension_numbers=dims,
                            preferred_element_type=wide_dtype(hidden.dtype))
    out = invariant.matmul(h2, head, dot) if cfg.batch_invariant else dot(h2, head)
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
        if cfg.batch_invariant:  # as the engine: the log-softmax of the logits matmul
            return invariant.logprobs_and_entropy(logits(weights, h, cfg) / temperature, tg)
        wide = h.dtype == wide_dtype(h.dtype)
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
