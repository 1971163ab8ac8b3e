"""`locojax.engine.sampling`: config validation, the kept sets of top-k / top-p, the draw's
distribution, determinism per key, and the returned logprobs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.engine.sampling import (_TOP_P_RTOL, SamplingConfig, kept_tokens, policy_logprobs,
                                     sample, sample_with_logprobs)
from tests.tolerance import unit_roundoff, worst_case

U = unit_roundoff("float32")

HAND = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]], jnp.float32))  # a hand-made distribution


@pytest.mark.parametrize("kw, field", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(min_new_tokens=-1), "min_new_tokens"),
    (dict(max_new_tokens=4, min_new_tokens=5), "min_new_tokens"),
    (dict(stop_token_ids=[2]), "stop_token_ids"),
    (dict(stop_token_ids=(-3,)), "stop_token_ids"),
    (dict(pad_token_id=-1), "pad_token_id"),
])
def test_bad_config_raises_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=f"SamplingConfig.{field}="):
        SamplingConfig(**kw)


def test_ids_outside_the_vocabulary_raise():
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingConfig(stop_token_ids=(7,)).validate_vocab(7)
    with pytest.raises(ValueError, match="top_k"):
        SamplingConfig(top_k=9).validate_vocab(8)
    SamplingConfig(stop_token_ids=(6,), top_k=8).validate_vocab(8)  # fine


# 0.8 and 0.95 are reached exactly in real numbers; in f32 the softmax of 4 logits (exp: 4
# roundings, a 4-term sum, a division) and the partial mass (≤ 3 adds) are ≤ 12u = 7e-7
# off, inside _TOP_P_RTOL = 1e-6 (17u), which is what makes the exact cases portable.
assert 12 * U < _TOP_P_RTOL


@pytest.mark.parametrize("top_p, kept", [
    (0.8, [1, 1, 0, 0]),  # 0.5 + 0.3 reaches 0.8 exactly: the smallest such set is {0, 1}
    (0.81, [1, 1, 1, 0]),
    (0.5, [1, 0, 0, 0]),
    (0.95, [1, 1, 1, 0]),
    (0.951, [1, 1, 1, 1]),
    (0.1, [1, 0, 0, 0]),  # the most probable token is always kept
])
def test_top_p_keeps_the_smallest_set_reaching_top_p(top_p, kept):
    got = np.asarray(kept_tokens(HAND, SamplingConfig(top_p=top_p)))[0]
    np.testing.assert_array_equal(got, np.asarray(kept, bool))


def test_top_k_and_combined_kept_sets():
    logits = jnp.asarray([[0.3, 2.0, -1.0, 1.5, 0.9, 1.9]], jnp.float32)  # order 1,5,3,4,0,2
    for k, kept in [(1, {1}), (2, {1, 5}), (4, {1, 5, 3, 4}), (6, set(range(6)))]:
        got = set(np.flatnonzero(np.asarray(kept_tokens(logits, SamplingConfig(top_k=k)))[0]))
        assert got == kept, k
    # Both rules: the intersection. top_p 0.5 alone keeps {1, 5} here; top_k 1 narrows it.
    probs = np.asarray(jax.nn.softmax(logits))[0]
    assert probs[1] < 0.5 < probs[1] + probs[5]
    both = np.asarray(kept_tokens(logits, SamplingConfig(top_p=0.5, top_k=1)))[0]
    assert set(np.flatnonzero(both)) == {1}
    # Temperature reshapes the distribution before top-p: flatter keeps more.
    hot = np.asarray(kept_tokens(logits, SamplingConfig(top_p=0.5, temperature=5.0)))[0]
    assert hot.sum() > 2


# Frequencies of n draws: a binomial frequency's σ is ≤ √(1/4n) (0.0056 at n = 8000, 0.0079
# at 4000), so atol 0.02 / 0.03 are ≥ 3.6σ; the uniforms are threefry bits, the same on
# every CPU, and rounding can move only draws within ~1e-6 of a CDF boundary (≪ 1 of n).
# Measured deviations: ≤ 0.008.
def _draws(logits, cfg, n=4000, seed=0):
    keys = jax.random.split(jax.random.key(seed), n)
    return np.asarray(jax.jit(jax.vmap(lambda k: sample(logits, k, cfg)))(keys))  # [n, B]


def test_draws_follow_the_truncated_renormalised_distribution():
    n = 8000
    free = np.bincount(_draws(HAND, SamplingConfig(), n)[:, 0], minlength=4) / n
    np.testing.assert_allclose(free, [0.5, 0.3, 0.15, 0.05], atol=0.02)
    nucleus = np.bincount(_draws(HAND, SamplingConfig(top_p=0.81), n)[:, 0], minlength=4) / n
    assert nucleus[3] == 0  # outside the nucleus: never drawn
    np.testing.assert_allclose(nucleus[:3], np.array([0.5, 0.3, 0.15]) / 0.95, atol=0.02)
    top2 = np.bincount(_draws(HAND, SamplingConfig(top_k=2), n)[:, 0], minlength=4) / n
    np.testing.assert_allclose(top2, [0.625, 0.375, 0, 0], atol=0.02)
    # Temperature 0.5 squares the probabilities (then renormalises).
    sharp = np.bincount(_draws(HAND, SamplingConfig(temperature=0.5), n)[:, 0], minlength=4) / n
    p2 = np.array([0.5, 0.3, 0.15, 0.05]) ** 2
    np.testing.assert_allclose(sharp, p2 / p2.sum(), atol=0.02)


def test_zero_probability_tokens_are_never_drawn_on_a_large_vocabulary():
    """Exercises the two-level draw across block boundaries (vocab 300 = 4 blocks of 64 + pad)."""
    logits = 2.0 * jax.random.normal(jax.random.key(3), (2, 300))
    logits = logits.at[:, 64:128].set(-jnp.inf)  # a whole block with no mass
    draws = _draws(logits, SamplingConfig(), n=4000)
    assert not ((draws >= 64) & (draws < 128)).any()
    probs = np.asarray(jax.nn.softmax(logits[0]))
    freq = np.bincount(draws[:, 0], minlength=300) / 4000
    assert np.abs(freq - probs).max() < 0.03


def test_greedy_top_k_1_and_determinism():
    logits = jax.random.normal(jax.random.key(0), (16, 97))
    # top-k = 1 at τ = 2 keeps one token only if the top two probabilities differ after
    # rounding: the logits' top-2 gaps are far above f32 rounding of e^{x/2} (a few u).
    top2 = np.sort(np.asarray(logits), -1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 1e-3
    greedy = np.asarray(sample(logits, jax.random.key(1), SamplingConfig(temperature=0.0)))
    np.testing.assert_array_equal(greedy, np.argmax(np.asarray(logits), -1))
    for seed in range(3):
        top1 = sample(logits, jax.random.key(seed), SamplingConfig(top_k=1, temperature=2.0))
        np.testing.assert_array_equal(np.asarray(top1), greedy)
    cfg = SamplingConfig(temperature=1.0)
    a = np.asarray(sample(logits, jax.random.key(5), cfg))
    b = np.asarray(sample(logits, jax.random.key(5), cfg))
    c = np.asarray(sample(logits, jax.random.key(6), cfg))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


@pytest.mark.parametrize("cfg", [
    SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7),
    SamplingConfig(temperature=1.3, top_k=5, top_p=0.9), SamplingConfig(temperature=0.0),
])
def test_logprobs_are_of_the_scaled_untruncated_policy(cfg):
    logits = 3.0 * jax.random.normal(jax.random.key(0), (8, 50))
    tokens, lp = sample_with_logprobs(logits, jax.random.key(1), cfg)
    tau = cfg.temperature or 1.0
    ref = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64) / tau, axis=-1))
    # f32 log softmax of x = logits / τ against f64: x - max and the result each round at
    # |x| ≤ max|x|, exp (4 roundings) then the 50-term sum is ≤ 54u relative, and its log
    # (4) turns that into absolute error: ≤ u·(2·2·max|x| + 58). 4e-6 at τ = 0.7.
    tol = U * (4 * np.abs(np.asarray(logits) / tau).max()) + worst_case(58)
    np.testing.assert_allclose(np.asarray(lp), np.take_along_axis(
        ref, np.asarray(tokens)[:, None], -1)[:, 0], atol=tol, rtol=0)
    np.testing.assert_allclose(np.asarray(policy_logprobs(logits, cfg)), ref, atol=tol, rtol=0)
