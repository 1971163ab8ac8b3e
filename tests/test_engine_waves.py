"""A generate in waves (`engine/waves.py`): B prompts as k plain generates of B / k prompts,
one after another, so one wave's KV cache lives at a time (the memory plan's answer to a
rollout that does not fit, issue 55 item 1).

Checked: greedy tokens equal the one-batch generate's (each row keeps its global id, so
its draws are the same, and greedy needs no draw); sampled tokens too, where the logits
round the same (a tiny model whose sampled tokens are far from ties); logprobs within
the engine's own bound against the learner (a wave is another XLA program, so not
bitwise); the cache the engine keeps is one wave's; `limits` and `first_row` carry over.
"""

import jax
import numpy as np
import pytest

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config, params
from tests.hf_reference import logprob_tol
from tests.test_long_decode import _trainer_logprobs

MODEL = config.tiny()


def _weights():
    return params.init(MODEL, jax.random.key(0))
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [3, 4], [20, 21, 22]]


def _generate(waves, temperature, limits=None, first_row=0):
    weights = _weights()
    engine = Engine(MODEL, waves=waves)
    sampling = SamplingConfig(max_new_tokens=7, temperature=temperature, pad_token_id=0)
    gen = engine.generate(weights, PROMPTS, jax.random.key(3), sampling, num_samples=2,
                          limits=limits, first_row=first_row)
    return gen, engine


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_waves_give_the_one_batch_generates_tokens(temperature):
    whole, _ = _generate(1, temperature)
    for waves in (2, 3):
        split, engine = _generate(waves, temperature)
        assert engine._cache.v.shape[1] == 12 // waves  # the kept cache is one wave's rows
        np.testing.assert_array_equal(np.asarray(split.tokens), np.asarray(whole.tokens))
        np.testing.assert_array_equal(np.asarray(split.mask), np.asarray(whole.mask))
        # Another batch size is another XLA program: its f32 logprobs may round otherwise.
        # Each generate's logprobs are within `logprob_tol` of the learner's one forward
        # (derived in tests/hf_reference.py; tests/test_long_decode.py checks it), so the
        # two are within twice that of each other.
        _, logits = _trainer_logprobs(_weights(), PROMPTS, whole, 2, 1.0)
        np.testing.assert_allclose(np.asarray(split.logprobs), np.asarray(whole.logprobs),
                                   atol=2 * logprob_tol("float32", logits), rtol=0)
        assert int(split.steps) >= int(whole.steps)  # every wave's steps, summed


def test_limits_and_first_row_follow_each_wave():
    limits = np.array([1, 7, 2, 7, 3, 7, 4, 7, 5, 7, 6, 7])
    whole, _ = _generate(1, 1.0, limits, first_row=40)
    split, _ = _generate(3, 1.0, limits, first_row=40)
    np.testing.assert_array_equal(np.asarray(split.lengths) <= limits, True)
    np.testing.assert_array_equal(np.asarray(split.tokens), np.asarray(whole.tokens))
    other, _ = _generate(3, 1.0, limits, first_row=0)  # another first row: other draws
    assert not np.array_equal(np.asarray(other.tokens), np.asarray(split.tokens))


def test_a_batch_that_does_not_divide_runs_whole():
    engine = Engine(MODEL, waves=4)  # 6 prompts: not 4 waves of one shape
    weights = _weights()
    sampling = SamplingConfig(max_new_tokens=3, temperature=0.0, pad_token_id=0)
    engine.generate(weights, PROMPTS, jax.random.key(0), sampling, num_samples=2)
    assert engine._cache.v.shape[1] == 12
