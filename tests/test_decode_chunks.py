"""A decode run K iterations at a time (`engine.Decoding`, the controller's
`--controller.decode-chunk K`) is the whole decode's, bitwise.

Guards: the `stop_at` bound stops the one decode program exactly K iterations on, the
next call resumes from the same cache and turn, and compaction happens at the step it
would without bounds, so no token, logprob, length or step count moves. Exact equality
holds on any CPU: both paths run the same compiled programs on the same inputs in the same
order; only where the loop pauses differs.
"""

import jax
import numpy as np
import pytest

from locojax.engine.engine import Decoding, Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config, params
from tests.test_long_decode import _compactions

MODEL = config.tiny()
N = 24
# 32 of the 512 ids stop a row (~6% of draws), and per-row budgets: rows end all through
# the 24 steps, so the batch of 16 is compacted several times on the way.
SAMPLING = SamplingConfig(max_new_tokens=N, temperature=1.0,
                          stop_token_ids=tuple(range(100, 132)))
PROMPTS = [[1 + (7 * i + j) % 90 for j in range(3 + i % 5)] for i in range(8)]
LIMITS = np.random.default_rng(3).integers(2, N + 1, 16)


@pytest.fixture(scope="module")
def weights():
    return params.init(MODEL, jax.random.key(2))


def _prefill(eng, weights):
    return eng.prefill(weights, PROMPTS, jax.random.key(5), SAMPLING, num_samples=2,
                       limits=LIMITS)


@pytest.mark.parametrize("chunk", [1, 5])
def test_chunked_decode_equals_the_whole_loop(weights, monkeypatch, chunk):
    """K = 1 (a round trip per token) and K = 5: every field of the generation equal
    bitwise; each bounded call ran at most K iterations and the calls cover the decode."""
    sizes = _compactions(monkeypatch)
    eng = Engine(MODEL, block=8, min_rows=1)
    whole = eng.decode(_prefill(eng, weights))
    whole_sizes, sizes[:] = list(sizes), []
    assert len(whole_sizes) >= 2, whole_sizes  # the case compacts

    decoding = Decoding(eng, _prefill(eng, weights))
    steps = [decoding.step]
    while not decoding.advance(chunk):
        steps.append(decoding.step)
        assert steps[-1] - steps[-2] == chunk  # a bound stops the loop exactly there
    chunked = decoding.result()
    assert sizes == whole_sizes
    assert len(steps) == -(-int(whole.steps) // chunk)  # ceil(iterations / K) calls
    for f in ("tokens", "mask", "logprobs", "lengths", "steps"):
        np.testing.assert_array_equal(np.asarray(getattr(chunked, f)),
                                      np.asarray(getattr(whole, f)), err_msg=f)


def test_a_decode_is_advanced_by_whole_iterations_and_read_once_finished(weights):
    eng = Engine(MODEL, block=8)
    decoding = Decoding(eng, _prefill(eng, weights))
    with pytest.raises(ValueError, match="has not finished"):
        decoding.result()
    with pytest.raises(ValueError, match=">= 1"):
        decoding.advance(0)
