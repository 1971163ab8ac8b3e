"""Qwen2.5, Llama 3.x (tied and untied), SmolLM2 and Gemma 3 against HF transformers, each
from its published config.json cut down to TINY's sizes with every feature kept on (q/k/v
biases; llama3 RoPE scaling, whose tiny head dim still spans its kept, ramped and slowed
frequencies; Gemma's local/global layers with their own RoPE bases, a window of 4 tokens
that the 11-token sequences pass, query_pre_attn_scalar unlike the head dim, linear RoPE
scaling of the global layers as in Gemma 3 4B+, embedding scale, four (1 + w) norms).

Per family: logits equal transformers' on a left-padded batch (f32 within `logit_tol`, f64
decisive, as test_model_parity); KV-cache decode one token at a time equals the full
forward, past the window; the engine's logprobs equal the trainer's recomputation; the HF
checkpoint round trip is bitwise. And each real full-size config loads abstractly (shapes
only) with the parameter count its model page publishes.

Bounds: `hf_reference.logit_tol` (derived there for TINY-shaped chains of FWD_DEPTH = 2048
reduction terms; Gemma's two extra norms per layer add 2 x 2 x 64 terms to the ~1.2k) and
`logprob_tol`, taken relative to the measured Σ_d |h_d e_vd| of each logit
(`measured_logit_tol`) rather than through their premise that it is ≤ 2 · max|logit|,
which an untied head breaks (2.1). Decode compares f64 only: there a wrong mask or position
is ~1e9 times the bound; the engine test runs the f32 programs a run uses.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import decoder, hf_io, params
from locojax.model.attention import CacheBlocks, KVCache, slot_positions
from locojax.model.config import FULL, SLIDING
from locojax.model.hf_config import config_from_dict, load_config
from locojax.rl.logprobs import compute_logprobs
from tests.hf_reference import (
    FWD_DEPTH,
    computing_in,
    cut_down,
    logit_tol,
    logprob_tol,
    measured_logit_tol,
    paired_from,
    published,
)
from tests.test_engine import _full_forward, _greedy
from tests.test_extend import converse
from tests.test_model_parity import _cached_logits, _hf_logits, _left_padded
from tests.test_shared_prefix import grouped_batch
from tests.tolerance import probabilistic

GEMMA_TINY = dict(sliding_window=4, sliding_window_pattern=2, query_pre_attn_scalar=24,
                  rope_scaling={"rope_type": "linear", "factor": 8.0})
CASES = {
    "qwen2.5": cut_down(published("qwen2.5-0.5b-instruct")),
    "llama-3.2": cut_down(published("llama-3.2-1b-instruct")),  # tied, llama3 RoPE x32
    "llama-3.1": cut_down(published("llama-3.1-8b")),  # untied, llama3 RoPE x8
    "smollm2": cut_down(published("smollm2-135m-instruct")),  # head_dim derived
    "gemma3": cut_down(published("gemma-3-1b-it"), **GEMMA_TINY),
}
FAMILIES = ["qwen2.5", "llama-3.1", "gemma3"]  # one case per family for the costlier tests
LENGTHS, TOTAL = [11, 6, 2], 11  # a left-padded batch; 11 > Gemma's window of 4
# model page (huggingface.co/<name>, "Model size" of the safetensors) -> exact count
PUBLISHED_PARAMS = {
    "qwen2.5-0.5b-instruct": 494_032_768, "qwen2.5-1.5b-instruct": 1_543_714_304,
    "llama-3.2-1b-instruct": 1_235_814_400, "llama-3.2-3b-instruct": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248, "smollm2-135m-instruct": 134_515_008,
    "smollm2-360m-instruct": 361_821_120, "gemma-3-1b-it": 999_885_952,
}


@functools.cache
def _pair(case):
    return paired_from(CASES[case], seed=1)


def _in(dtype, case):
    """(HF model, weights, cfg) computing in `dtype` (`computing_in`)."""
    return computing_in(dtype, *_pair(case))


@functools.partial(jax.jit, static_argnames="cfg")
def _logits(weights, tokens, positions, cfg, mask=None):
    hidden, _ = decoder.forward(weights, tokens, positions, cfg, mask=mask)
    return decoder.logits(weights, hidden, cfg), hidden


def test_the_cut_down_configs_keep_each_familys_features():
    """Guards the premise of the tests below: the tiny configs switch every feature on."""
    qwen, llama, untied, smol, gemma = (config_from_dict(CASES[c]) for c in CASES)
    assert qwen.family.qkv_bias and not qwen.family.qk_norm and qwen.tie_word_embeddings
    assert llama.rope_scaling.rope_type == "llama3" and llama.tie_word_embeddings
    assert untied.model_type == "llama" and not untied.tie_word_embeddings
    assert smol.head_dim == 16 and smol.rope_scaling is None
    assert gemma.layer_types == (SLIDING, FULL) and gemma.sliding_window == 4
    assert (gemma.rope_local_theta, gemma.rope_theta) == (10_000.0, 1_000_000.0)
    assert gemma.query_pre_attn_scalar != gemma.head_dim and gemma.rope_scaling.factor == 8
    fam = gemma.family
    assert fam.qk_norm and fam.sandwich_norms and fam.unit_offset_norm and fam.scaled_embedding
    # llama3 RoPE at head dim 16: some frequencies kept, some ramped, some slowed.
    ratio = np.asarray(decoder.inv_freq(llama, FULL, jnp.float32) /
                       decoder.inv_freq(dataclasses.replace(llama, rope_scaling=None), FULL,
                                        jnp.float32))
    assert (ratio == 1).any() and np.isclose(ratio, 1 / 32).any()
    assert ((ratio > 1 / 32 + 1e-3) & (ratio < 1 - 1e-3)).any()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf(case, dtype):
    with _in(dtype, case) as (model, w, cfg):
        tokens, mask, positions = _left_padded(LENGTHS, TOTAL, cfg.vocab_size, seed=3)
        ours, hidden = _logits(w, tokens, positions, cfg, mask=mask)
        ours, hidden = np.asarray(ours), np.asarray(hidden, np.float64)
        ref = _hf_logits(model, tokens, mask, positions)
    assert ours.dtype == ref.dtype == np.dtype(dtype)
    assert np.abs(ref[mask]).max() > 0.1 and np.isfinite(ours).all()
    np.testing.assert_allclose(ours[mask], ref[mask], rtol=0,
                               atol=measured_logit_tol(dtype, w, cfg, hidden[mask]))


@pytest.mark.parametrize("case", FAMILIES)
def test_kv_cache_decode_matches_full_forward(case):
    """f64 (where any wrong mask or position is ~1e9 times the bound): prefill 3 tokens,
    then one at a time past Gemma's window, reading the cache in blocks of 4 slots (so the
    window starts inside a block, and, once every row is past it, the first block is
    skipped); every step equals the full forward."""
    lengths = [11, 9, 8]  # left-padded; every row passes the window of 4
    with _in("float64", case) as (_, w, cfg):
        tokens, mask, positions = _left_padded(lengths, TOTAL, cfg.vocab_size, seed=5)
        full = np.asarray(_logits(w, tokens, positions, cfg, mask=mask)[0])
        cache = KVCache.empty(cfg, len(lengths), 16, block=4)
        got = []
        for a, b in [(0, 3)] + [(t, t + 1) for t in range(3, TOTAL)]:
            step, cache = _cached_logits(w, tokens[:, a:b], positions[:, a:b], cache, cfg,
                                         mask=mask[:, a:b])
            got.append(np.asarray(step))
        got = np.concatenate(got, axis=1)
    assert int(cache.index) == TOTAL and cache.v.shape[3] // cache.block == 4
    if cfg.windowed:  # the last steps' local layers started at block 1 (slots 4..7)
        at = CacheBlocks(cache, jnp.int32(0), len(lengths), jnp.int32(cfg.sliding_window),
                         jnp.asarray(positions[:, -1:]), slot_positions(cache.valid))
        assert int(at.first) == 1
    np.testing.assert_allclose(got[mask], full[mask], atol=logit_tol("float64", full[mask]), rtol=0)


def test_a_local_layer_sees_only_its_window():
    """The window is real: widening it past the sequence changes every logit whose query
    sees more than W = 4 tokens, and none before (f64, decisive either way)."""
    with _in("float64", "gemma3") as (_, w, cfg):
        tokens, mask, positions = _left_padded([TOTAL], TOTAL, cfg.vocab_size, seed=7)
        windowed = np.asarray(_logits(w, tokens, positions, cfg)[0])[0]
        full = dataclasses.replace(cfg, sliding_window=TOTAL)
        unwindowed = np.asarray(_logits(w, tokens, positions, full)[0])[0]
    err = np.abs(windowed - unwindowed).max(-1)  # per position
    assert (err[:4] <= logit_tol("float64", windowed)).all()
    assert (err[4:] > 1e3 * logit_tol("float64", windowed)).all()


def test_the_shared_prompt_train_forward_keeps_the_window():
    """The train step's shared-prompt path (each group's prompt run once, its responses
    attending to those keys: `logprobs.prefix_hidden`) windows by position as the plain
    forward does: the same logprobs, on prompts of 6 and responses of 8 tokens past W = 4.
    f64, within `logprob_tol` at these logits' scale: a key let through the window moves a
    logprob by O(0.1)."""
    with _in("float64", "gemma3") as (_, w, cfg):
        b = grouped_batch()
        args = (w, b.tokens, b.positions, b.attn_mask, cfg)
        plain = np.asarray(compute_logprobs(*args)[0])
        shared = np.asarray(compute_logprobs(*args, prefix=b.shared_prefix)[0])
        logits = _logits(w, b.tokens, b.positions, cfg, mask=b.attn_mask)[0]
    targets = np.asarray(b.loss_mask)
    assert targets.sum() > 0 and np.abs(plain[targets]).max() > 0
    np.testing.assert_allclose(shared[targets], plain[targets], rtol=0,
                               atol=logprob_tol("float64", np.asarray(logits)))


def test_multi_turn_holes_keep_the_window():
    """Multi-turn extend on Gemma 3 (test_extend's scripted conversation: turns cut short,
    rows ending at different turns, observations written into each row's cache, finished
    rows compacted out): the cache's holes are not positions, so the window counts real
    tokens only, and every behaviour logprob equals the trainer's one forward over the
    trajectory (f32, the `logprob_tol` derivation on the measured logit terms)."""
    _, w, cfg = _pair("gemma3")
    seqs = converse(cfg, w, [0, 1, 2, 3], compact=True)
    rows = sorted(seqs)
    width = max(len(seqs[g][0]) for g in rows)
    tok, att = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), bool)
    is_model, behav = np.zeros_like(att), np.zeros((len(rows), width), np.float32)
    for i, g in enumerate(rows):
        t, m, lp = seqs[g]
        tok[i, :len(t)], att[i, :len(t)], is_model[i, :len(t)], behav[i, :len(t)] = t, 1, m, lp
    assert is_model.sum() > 40 and (~is_model & att).sum() > 10 and width > 4 * 4
    pos = np.maximum(np.cumsum(att, 1) - 1, 0).astype(np.int32)
    ref = np.asarray(compute_logprobs(w, tok, pos, att, cfg)[0])
    hidden = _logits(w, tok, pos, cfg, mask=att)[1]
    bound = 2 * measured_logit_tol("float32", w, cfg, np.asarray(hidden)[att]) + \
        2 * probabilistic(FWD_DEPTH)
    np.testing.assert_allclose(behav[is_model], ref[is_model], atol=bound, rtol=0)


@pytest.mark.parametrize("case", FAMILIES)
def test_engine_logprobs_equal_the_trainers(case):
    """Greedy generation past the window (prompts of 1-7 tokens + 8 new): each token is the
    full forward's argmax, its logprob the trainer's `token_logprobs` (f32, `logprob_tol`)."""
    _, w, cfg = _pair(case)
    prompts = [np.random.default_rng(i).integers(1, cfg.vocab_size, n).tolist()
               for i, n in enumerate([7, 3, 5, 1])]
    eng = Engine(cfg)
    tokens = _greedy(eng, w, prompts)  # checks each step decisive
    out = eng.generate(w, prompts, jax.random.key(0),
                       SamplingConfig(max_new_tokens=8, temperature=0.0))
    hidden, logits = _full_forward(w, cfg, prompts, out)
    np.testing.assert_array_equal(np.argmax(np.asarray(logits), -1), tokens)
    ref, _ = decoder.token_logprobs(w, hidden, out.tokens, cfg)
    # As `logprob_tol`: the token's logit and the log-sum-exp each move by the logits' bound,
    # plus the rounding of the sum of V terms in each program.
    bound = 2 * measured_logit_tol("float32", w, cfg, hidden) + 2 * probabilistic(FWD_DEPTH)
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref), rtol=0, atol=bound)


@pytest.mark.parametrize("case", list(CASES))
def test_hf_round_trip_is_bitwise(case, tmp_path):
    """transformers' save_pretrained → locojax load → locojax save: the same tensors, bit for
    bit, under the same names, and the saved config.json reads back as the same model."""
    model, _, cfg = _pair(case)
    model.save_pretrained(tmp_path / "hf")
    cfg2, w = hf_io.load_model(tmp_path / "hf")
    assert cfg2 == cfg
    hf_io.save_weights(w, cfg2, tmp_path / "ours")
    theirs, ours = load_file(str(tmp_path / "hf" / hf_io.SINGLE_FILE)), load_file(
        str(tmp_path / "ours" / hf_io.SINGLE_FILE))
    if cfg.tie_word_embeddings:  # transformers 5 writes the tied head; locojax omits it
        theirs.pop("lm_head.weight", None)
    assert sorted(theirs) == sorted(ours)
    for name, t in theirs.items():
        assert ours[name].dtype == t.dtype and ours[name].tobytes() == t.tobytes(), name
    assert load_config(tmp_path / "ours") == cfg


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_real_configs_load_abstractly_with_their_published_size(name):
    """Full size, shapes only (`jax.eval_shape` of init): the declared weights count the
    published parameters exactly, `num_params` agrees, and Gemma's layer pattern is HF's."""
    d = published(name)
    cfg = config_from_dict(d)
    shapes = jax.eval_shape(lambda k: params.init(cfg, k), jax.random.key(0))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    assert count == cfg.num_params() == PUBLISHED_PARAMS[name]
    if cfg.model_type == "gemma3_text":
        from transformers import AutoConfig
        hf = AutoConfig.for_model(d["model_type"], **{k: v for k, v in d.items()
                                                      if k != "model_type"})
        assert list(cfg.layer_types) == hf.layer_types and cfg.sliding_window == 512
        assert hf.rope_parameters[SLIDING]["rope_theta"] == cfg.rope_local_theta



@pytest.mark.parametrize("case, change, words", [
    ("gemma3", dict(final_logit_softcapping=30.0), "final_logit_softcapping=30.0 is not"),
    ("gemma3", dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
    ("gemma3", dict(hidden_activation="gelu"), "hidden_activation='gelu' is not supported"),
    ("gemma3", dict(rope_parameters={SLIDING: {"rope_type": "linear", "factor": 2.0,
                                               "rope_theta": 1e4}}), "sliding_attention is scaled"),
    ("gemma3", dict(layer_types=["sliding_attention", "chunked_attention"]), "layer 1 uses"),
    ("llama-3.1", dict(attention_bias=True), "attention_bias=true is not supported"),
    ("llama-3.1", dict(mlp_bias=True), "mlp_bias=true"),
    ("llama-3.1", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "'yarn'"),
    ("qwen2.5", dict(use_sliding_window=True, max_window_layers=1), "layer 1 uses"),
])
def test_unsupported_family_features_are_refused_by_name(case, change, words):
    with pytest.raises(ValueError, match="config.json: ") as e:
        config_from_dict({**CASES[case], **change})
    assert words in str(e.value)
