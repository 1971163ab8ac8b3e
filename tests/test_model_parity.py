"""The locojax Qwen3 forward against HF transformers `Qwen3ForCausalLM` (the reference),
on random weights where no parameter is inert (norm scales included).

Checked, in f32 and in float64 (HF widened to f64 by `hf_reference.float64_model`): logits
for tied and untied embeddings; a left-padded batch of different lengths (real positions
only); KV-cache decode, one token at a time, against the full forward at every position,
with and without left padding. And bf16 compute against f32.

The bound is `hf_reference.logit_tol`, derived there: f32 3.7e-4 at max|logit| ≈ 3.4
(measured ≤ 2.5e-6), f64 6.9e-13 (measured ≤ 4e-15). f64 is the decisive check: a wrong
RMSNorm ε (1e-5 for 1e-6) moves these logits by 1.2e-3, three times the f32 bound but 1e9
times the f64 one.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from locojax.model import decoder
from locojax.model.decoder import KVCache
from tests.hf_reference import TERMS_PER_LOGIT, computing_in, logit_tol, paired, tiny_cfg
from tests.tolerance import unit_roundoff, worst_case

BF16_ROUNDINGS = 32
U_BF16 = unit_roundoff(jnp.bfloat16)
DTYPES = ["float32", "float64"]
tol = logit_tol


def paired_in(dtype: str, cfg, seed: int):
    """(HF model, locojax weights, cfg) holding the same random weights, computing in
    `dtype` (`computing_in`)."""
    model, w = paired(cfg, seed)
    return computing_in(dtype, model, w, cfg)


@functools.partial(jax.jit, static_argnames="cfg")
def _logits(weights, tokens, positions, cfg, mask=None):
    hidden, _ = decoder.forward(weights, tokens, positions, cfg, mask=mask)
    return decoder.logits(weights, hidden, cfg)


@functools.partial(jax.jit, static_argnames="cfg")
def _cached_logits(weights, tokens, positions, cache, cfg, mask=None):
    hidden, cache = decoder.forward(weights, tokens, positions, cfg, mask=mask, cache=cache)
    return decoder.logits(weights, hidden, cfg), cache


def _hf_logits(model, tokens, mask=None, positions=None):
    kw = {}
    if mask is not None:
        kw["attention_mask"] = torch.as_tensor(np.asarray(mask, np.int64))
    if positions is not None:
        kw["position_ids"] = torch.as_tensor(np.asarray(positions, np.int64))
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(np.asarray(tokens, np.int64)), **kw).logits.numpy()


def _left_padded(lengths, total, vocab, seed):
    """tokens, mask, positions [B, total] with row b's real tokens right-aligned."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (len(lengths), total))
    mask = np.arange(total)[None, :] >= (total - np.asarray(lengths))[:, None]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    tokens = np.where(mask, tokens, 0)  # pad id 0; must not matter
    return tokens.astype(np.int32), mask, positions.astype(np.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tied", [True, False])
def test_logits_match_hf(tied, dtype):
    with paired_in(dtype, tiny_cfg(tie_word_embeddings=tied), seed=1) as (model, w, cfg):
        assert ("lm_head" in w) != tied
        tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 11)).astype(np.int32)
        positions = np.broadcast_to(np.arange(11, dtype=np.int32), (2, 11))
        ours = np.asarray(_logits(w, tokens, positions, cfg))
        ref = _hf_logits(model, tokens)
        hidden, _ = decoder.forward(w, tokens, positions, cfg)
    # The bound's premise on these weights: Σ_d |h_d e_vd| ≤ TERMS_PER_LOGIT · max|logit|.
    head = np.abs(np.asarray(w["embed"] if tied else w["lm_head"].T, np.float64))  # [V, D]
    terms = np.abs(np.asarray(hidden, np.float64)) @ head.T
    assert terms.max() <= TERMS_PER_LOGIT * np.abs(ref).max(), terms.max() / np.abs(ref).max()
    assert ours.shape == ref.shape == (2, 11, cfg.vocab_size)
    assert ours.dtype == ref.dtype == np.dtype(dtype)
    assert np.abs(ref).max() > 0.1  # logits are not trivially small
    np.testing.assert_allclose(ours, ref, atol=tol(dtype, ref), rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_left_padded_batch_matches_hf(dtype):
    lengths = [9, 5, 1]
    with paired_in(dtype, tiny_cfg(), seed=2) as (model, w, cfg):
        tokens, mask, positions = _left_padded(lengths, 9, cfg.vocab_size, seed=3)
        ours = np.asarray(_logits(w, tokens, positions, cfg, mask=mask))
        ref = _hf_logits(model, tokens, mask, positions)
        alone = [_hf_logits(model, tokens[b:b + 1, -n:])[0] for b, n in enumerate(lengths)]
    np.testing.assert_allclose(ours[mask], ref[mask], atol=tol(dtype, ref[mask]), rtol=0)
    assert np.isfinite(ours).all()  # pad rows give finite garbage, never NaN
    # Each padded row equals that sequence run alone, unpadded, through HF.
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(ours[b, -n:], alone[b], atol=tol(dtype, alone[b]), rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths", [[8, 8], [8, 5, 2]], ids=["unpadded", "left_padded"])
def test_kv_cache_decode_matches_full_forward(lengths, dtype):
    """Prefill a prefix into an empty cache, then feed one token at a time: every step's
    logits equal the full forward's (and HF's) at that position."""
    total, prefix, slots = 8, 3, 12  # more slots than tokens: unused slots must be inert
    with paired_in(dtype, tiny_cfg(), seed=4) as (model, w, cfg):
        tokens, mask, positions = _left_padded(lengths, total, cfg.vocab_size, seed=5)
        full = np.asarray(_logits(w, tokens, positions, cfg, mask=mask))
        hf = _hf_logits(model, tokens, mask, positions)
        got, cache = _decode_one_at_a_time(w, cfg, tokens, mask, positions, prefix, slots)
    np.testing.assert_allclose(full[mask], hf[mask], atol=tol(dtype, hf[mask]), rtol=0)
    assert got.dtype == np.dtype(dtype)
    assert int(cache.index) == total
    np.testing.assert_array_equal(np.asarray(cache.valid)[:, :total], mask)
    assert not np.asarray(cache.valid)[:, total:].any()
    np.testing.assert_allclose(got[mask], full[mask], atol=tol(dtype, full[mask]), rtol=0)


def _decode_one_at_a_time(w, cfg, tokens, mask, positions, prefix, slots):
    """Logits [B, T, V] from prefilling `prefix` tokens into an empty cache, then one
    token per call; and the final cache."""
    total = tokens.shape[1]

    cache = KVCache.empty(cfg, tokens.shape[0], slots)
    step_logits, cache = _cached_logits(w, tokens[:, :prefix], positions[:, :prefix], cache, cfg,
                                        mask=mask[:, :prefix])
    got = [np.asarray(step_logits)]
    for t in range(prefix, total):
        step_logits, cache = _cached_logits(w, tokens[:, t:t + 1], positions[:, t:t + 1], cache,
                                            cfg, mask=mask[:, t:t + 1])
        got.append(np.asarray(step_logits))
    return np.concatenate(got, axis=1), cache


def test_bf16_compute_stays_close_to_f32():
    cfg = tiny_cfg()
    _, w = paired(cfg, seed=6)
    bf16 = dataclasses.replace(cfg, compute_dtype="bfloat16")
    tokens, mask, positions = _left_padded([10, 6], 10, cfg.vocab_size, seed=7)
    ref = np.asarray(_logits(w, tokens, positions, cfg, mask=mask))
    low = np.asarray(_logits(w, tokens, positions, bf16, mask=mask))
    assert low.dtype == np.float32 and np.isfinite(low).all()
    scale = TERMS_PER_LOGIT * np.abs(ref[mask]).max()
    # Each op rounds its output to bf16 once (u = 2^-8; XLA:CPU accumulates dots in f32):
    # ≤ BF16_ROUNDINGS = 32 along the chain (2 layers × ~14 ops, final norm), each reaching
    # a logit at most at its Σ|terms| scale. The worst case bounds every logit; independent
    # roundings bound the RMS over the 16 x 512 logits (an average: no tail factor λ).
    # Measured: max 0.018, RMS 0.0034 of max|logit|; bounds 0.125 and 0.022 of `scale`.
    worst, rms = worst_case(BF16_ROUNDINGS, jnp.bfloat16), BF16_ROUNDINGS ** 0.5 * U_BF16
    err = np.abs(low - ref)[mask]
    assert err.max() <= worst * scale, (err.max(), scale)
    assert np.sqrt(np.mean(err ** 2)) <= rms * scale, (np.sqrt(np.mean(err ** 2)), scale)
    assert err.max() > 0  # it really ran in bf16

    # The cached path in bf16 (bf16 cache, prefill into spare slots): the same bf16 roundings
    # of the same f32 values, up to f32 reordering, so within the same bounds of f32.
    cache = KVCache.empty(bf16, 2, 12)
    assert cache.k.dtype == jnp.bfloat16
    cached, cache = _cached_logits(w, tokens, positions, cache, bf16, mask=mask)
    err = np.abs(np.asarray(cached) - ref)[mask]
    assert err.max() <= worst * scale and np.sqrt(np.mean(err ** 2)) <= rms * scale
