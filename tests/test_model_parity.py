"""The locojax Qwen3 forward against HF transformers `Qwen3ForCausalLM` (the reference),
on random weights where no parameter is inert (norm scales included).

Checked: logits for tied and untied embeddings; a left-padded batch of different lengths
(real positions only); KV-cache decode, one token at a time, against the full forward at
every position, with and without left padding; bf16 compute against f32.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from locojax.model import qwen3
from locojax.model.qwen3 import KVCache
from tests.hf_reference import paired, tiny_cfg

TOL = 1e-5


@functools.partial(jax.jit, static_argnames="cfg")
def _logits(weights, tokens, positions, cfg, mask=None):
    hidden, _ = qwen3.forward(weights, tokens, positions, cfg, mask=mask)
    return qwen3.logits(weights, hidden, cfg)


@functools.partial(jax.jit, static_argnames="cfg")
def _cached_logits(weights, tokens, positions, cache, cfg, mask=None):
    hidden, cache = qwen3.forward(weights, tokens, positions, cfg, mask=mask, cache=cache)
    return qwen3.logits(weights, hidden, cfg), cache


def _hf_logits(model, tokens, mask=None, positions=None):
    kw = {}
    if mask is not None:
        kw["attention_mask"] = torch.as_tensor(np.asarray(mask, np.int64))
    if positions is not None:
        kw["position_ids"] = torch.as_tensor(np.asarray(positions, np.int64))
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(np.asarray(tokens, np.int64)), **kw
                     ).logits.float().numpy()


def _left_padded(lengths, total, vocab, seed):
    """tokens, mask, positions [B, total] with row b's real tokens right-aligned."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (len(lengths), total))
    mask = np.arange(total)[None, :] >= (total - np.asarray(lengths))[:, None]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    tokens = np.where(mask, tokens, 0)  # pad id 0; must not matter
    return tokens.astype(np.int32), mask, positions.astype(np.int32)


@pytest.mark.parametrize("tied", [True, False])
def test_logits_match_hf(tied):
    cfg = tiny_cfg(tie_word_embeddings=tied)
    model, w = paired(cfg, seed=1)
    assert ("lm_head" in w) != tied
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 11)).astype(np.int32)
    positions = np.broadcast_to(np.arange(11, dtype=np.int32), (2, 11))
    ours = np.asarray(_logits(w, tokens, positions, cfg))
    ref = _hf_logits(model, tokens)
    assert ours.shape == ref.shape == (2, 11, cfg.vocab_size)
    assert np.abs(ref).max() > 0.1  # logits are not trivially small
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)


def test_left_padded_batch_matches_hf():
    cfg = tiny_cfg()
    model, w = paired(cfg, seed=2)
    lengths = [9, 5, 1]
    tokens, mask, positions = _left_padded(lengths, 9, cfg.vocab_size, seed=3)
    ours = np.asarray(_logits(w, tokens, positions, cfg, mask=mask))
    ref = _hf_logits(model, tokens, mask, positions)
    np.testing.assert_allclose(ours[mask], ref[mask], atol=TOL, rtol=0)
    assert np.isfinite(ours).all()  # pad rows give finite garbage, never NaN
    # Each padded row equals that sequence run alone, unpadded, through HF.
    for b, n in enumerate(lengths):
        alone = _hf_logits(model, tokens[b:b + 1, -n:])
        np.testing.assert_allclose(ours[b, -n:], alone[0], atol=TOL, rtol=0)


@pytest.mark.parametrize("lengths", [[8, 8], [8, 5, 2]], ids=["unpadded", "left_padded"])
def test_kv_cache_decode_matches_full_forward(lengths):
    """Prefill a prefix into an empty cache, then feed one token at a time: every step's
    logits equal the full forward's (and HF's) at that position."""
    cfg = tiny_cfg()
    model, w = paired(cfg, seed=4)
    total, prefix, slots = 8, 3, 12  # more slots than tokens: unused slots must be inert
    tokens, mask, positions = _left_padded(lengths, total, cfg.vocab_size, seed=5)
    full = np.asarray(_logits(w, tokens, positions, cfg, mask=mask))
    np.testing.assert_allclose(full[mask], _hf_logits(model, tokens, mask, positions)[mask],
                               atol=TOL, rtol=0)

    cache = KVCache.empty(cfg, len(lengths), slots)
    step_logits, cache = _cached_logits(w, tokens[:, :prefix], positions[:, :prefix], cache, cfg,
                                        mask=mask[:, :prefix])
    got = [np.asarray(step_logits)]
    for t in range(prefix, total):
        step_logits, cache = _cached_logits(w, tokens[:, t:t + 1], positions[:, t:t + 1], cache,
                                            cfg, mask=mask[:, t:t + 1])
        got.append(np.asarray(step_logits))
    got = np.concatenate(got, axis=1)
    assert int(cache.index) == total
    np.testing.assert_array_equal(np.asarray(cache.valid)[:, :total], mask)
    assert not np.asarray(cache.valid)[:, total:].any()
    np.testing.assert_allclose(got[mask], full[mask], atol=TOL, rtol=0)


def test_bf16_compute_stays_close_to_f32():
    cfg = tiny_cfg()
    _, w = paired(cfg, seed=6)
    bf16 = dataclasses.replace(cfg, compute_dtype="bfloat16")
    tokens, mask, positions = _left_padded([10, 6], 10, cfg.vocab_size, seed=7)
    ref = np.asarray(_logits(w, tokens, positions, cfg, mask=mask))
    low = np.asarray(_logits(w, tokens, positions, bf16, mask=mask))
    assert low.dtype == np.float32 and np.isfinite(low).all()
    err = np.abs(low - ref)[mask]
    scale = np.abs(ref[mask]).max()
    # bf16 has an 8-bit mantissa (~0.4% per rounding); a 2-layer model stays within a few %.
    assert err.max() < 0.05 * scale, (err.max(), scale)
    assert err.max() > 0  # it really ran in bf16
    # Greedy choices agree almost everywhere.
    agree = (low.argmax(-1) == ref.argmax(-1))[mask].mean()
    assert agree >= 0.9

    # The cached path in bf16 (bf16 cache, prefill into spare slots) agrees as closely.
    cache = KVCache.empty(bf16, 2, 12)
    assert cache.k.dtype == jnp.bfloat16
    cached, cache = _cached_logits(w, tokens, positions, cache, bf16, mask=mask)
    assert np.abs(np.asarray(cached) - low)[mask].max() < 0.05 * scale
