"""A bf16 rollout copy of the weights (`Engine(weights_dtype="bf16")`) and the decode loop's
skip of left padding every row shares (`CacheBlocks.first`).

Checked: the copy narrows the matrices only and leaves the learner's weights as they were;
its logprobs stay within bf16 rounding of the f32 trainer's (and really differ from f32's);
a dtype that is no narrower float is refused by name. Skipping the all-pad blocks changes
no token and no logprob (bitwise) against reading them.

Bounds use bf16's unit roundoff u = 2^-8 (8 significant bits).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.engine.engine import Engine, pad_prompts, rollout_copy
from locojax.engine.sampling import SamplingConfig
from locojax.model import attention, config, decoder, params

U_BF16 = 2.0 ** -8
MODEL = config.tiny()
SAMPLING = SamplingConfig(max_new_tokens=16, temperature=1.0)


@pytest.fixture(scope="module")
def weights():
    return params.init(MODEL, jax.random.key(3))


def _prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, MODEL.vocab_size, n).tolist() for n in lengths]


def _trainer(w, prompts, out, g):
    """The f32 trainer's logprobs of the completions [R, N], and its final hidden states."""
    pt, pm = pad_prompts(prompts)
    tok = np.concatenate([np.repeat(pt, g, 0), np.asarray(out.tokens)], 1)
    att = np.concatenate([np.repeat(pm, g, 0), np.asarray(out.mask)], 1)
    pos = np.maximum(np.cumsum(att, 1) - 1, 0)
    hidden, _ = decoder.forward(w, jnp.asarray(tok), jnp.asarray(pos), MODEL,
                                mask=jnp.asarray(att))
    lp, _ = decoder.token_logprobs(w, hidden[:, pt.shape[1] - 1:-1], out.tokens, MODEL)
    return np.asarray(lp), hidden


def test_rollout_copy_narrows_the_matrices_only(weights):
    copy = rollout_copy(weights, jnp.dtype(jnp.bfloat16))
    for x, y in zip(jax.tree.leaves(weights), jax.tree.leaves(copy)):
        assert x.dtype == jnp.float32  # the learner's weights are untouched
        assert y.dtype == (jnp.bfloat16 if x.ndim >= 2 else jnp.float32)
    engine = Engine(MODEL, weights_dtype="bf16")
    assert engine.place_weights(copy) is copy  # already a copy: not cast again


def test_bf16_weights_logprobs_stay_within_bf16_rounding_of_the_f32_trainers(weights):
    """Each matmul of the bf16 copy rounds its input and its weights (2u relative on each
    product): 4 matmul stages a layer (q/k/v, o, gate/up, down), the embedding and the LM
    head. As in tests/test_precision.py (whose bf16 compute rounds these and more), near-
    identity layers at init let these add in the residual stream: hidden states differ by
    <= (4L + 2) 2u relative, hence a logit by that times A = max_v sum_d |h_d W_vd|, and a
    log-softmax by twice the largest logit difference; the head's own 2u adds one more."""
    prompts = _prompts([3, 9, 5, 7])
    out = Engine(MODEL, weights_dtype="bf16").generate(
        weights, prompts, jax.random.key(0), SAMPLING, num_samples=2)
    ref, hidden = _trainer(weights, prompts, out, 2)
    m = np.asarray(out.mask)
    gap = np.abs(np.asarray(out.logprobs) - ref)[m]
    a = float(jnp.max(jnp.abs(hidden).reshape(-1, MODEL.hidden_size)
                      @ jnp.abs(weights["embed"]).T))
    bound = 2 * (4 * MODEL.num_hidden_layers + 3) * 2 * U_BF16 * a
    assert gap.max() <= bound, (gap.max(), bound)
    # bf16 really in use: f32 agrees to ~1e-6 (tests/test_engine.py's bound is ~1e-5).
    assert gap.mean() > 1e-5


@pytest.mark.parametrize("dtype", ["float32", "int8", "float16x"])
def test_a_rollout_copy_that_is_no_narrower_float_is_refused(dtype):
    with pytest.raises((ValueError, TypeError), match="weights_dtype|float16x"):
        Engine(MODEL, weights_dtype=dtype)


def test_skipping_the_shared_left_padding_changes_nothing(weights, monkeypatch):
    """Prompts of 2-5 tokens padded to 24 with 4-slot blocks: every row's first valid slot is
    past slot 19, so the decode loop starts at block 4 of 10; forced to start at block 0
    (reading the pad blocks, which add exact zeros), every token and logprob is bitwise the
    same."""
    prompts = _prompts([2, 5, 3, 4])
    pt, pm = pad_prompts(prompts, length=24)
    sampling = SamplingConfig(max_new_tokens=16, temperature=1.0)
    firsts = []
    real = attention.CacheBlocks.first

    def spy(self):
        f = real.fget(self)
        firsts.append(f)
        return f

    def run():
        return Engine(MODEL, block=4).generate(weights, pt, jax.random.key(0), sampling,
                                               num_samples=2, prompt_mask=pm)

    monkeypatch.setattr(attention.CacheBlocks, "first", property(spy))
    skipped = run()
    assert firsts, "the decode loop did not run"
    jax.clear_caches()
    monkeypatch.setattr(attention.CacheBlocks, "first",
                        property(lambda self: jnp.zeros((), jnp.int32)))
    read_all = run()
    jax.clear_caches()
    for f in ("tokens", "logprobs", "lengths"):
        np.testing.assert_array_equal(np.asarray(getattr(skipped, f)),
                                      np.asarray(getattr(read_all, f)), err_msg=f)
    # ...and the skip is real: the loop starts at the block of the earliest real token
    cache = decoder.KVCache.empty(MODEL, 8, 24 + 16 - 1, block=4)
    cache = dataclasses.replace(cache, valid=cache.valid.at[:, :24].set(np.repeat(pm, 2, 0)))
    assert int(real.fget(attention.CacheBlocks(cache, jnp.int32(0), 8))) == (24 - 5) // 4
