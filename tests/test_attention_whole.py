"""A cache of at most `attention.WHOLE_BLOCKS` blocks is read whole, in one step without the
block loop, its unwritten slots masked.

Checked: the whole read equals the block loop within the blocked attention's derived bound
(tests/test_long_decode.py, `_attention_bound` at the loop's block count: each side is
within half of it of the exact result), for decode and extend, in a full and in a
sliding-window layer, with large finite values in the unwritten slots (stale rows, as
compaction leaves them: masked, they add exact zeros), with no loop in the whole read's
program; and a greedy generate reading its short cache whole gives the loop's tokens, its
logprobs within `logprob_tol` of the loop's (the trainer-vs-engine tests, tests/
test_engine.py, run their short caches whole at the default `WHOLE_BLOCKS`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import attention, decoder
from tests.hf_reference import assert_decisive_argmax, logprob_tol
from tests.test_attention_fold import _windowed
from tests.test_long_decode import (  # weights: the module's fixture
    MODEL,
    _attention_bound,
    _attention_case,
    _rollout,
    _trainer_logprobs,
    weights,  # noqa: F401
)
from tests.tolerance import x64


def _stale(prefix):
    """The case's cache with its NaN (unwritten) slots holding large finite values."""
    c = prefix.cache
    fill = lambda a: jnp.where(jnp.isnan(a), 1e3, a)
    return dataclasses.replace(prefix, cache=dataclasses.replace(c, k=fill(c.k), v=fill(c.v)))


@pytest.mark.parametrize("window", [None, 5], ids=["full", "window"])
@pytest.mark.parametrize("t", [1, 3], ids=["decode", "extend"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_short_cache_read_whole_equals_the_block_loop(dtype, t, window, monkeypatch):
    with x64():
        q, new, prefix, dense = _attention_case(dtype, t)  # 5 blocks of 4, 4 written
        prefix = _stale(prefix)
        if window is not None:
            prefix = _windowed(prefix, window)
            prefix = dataclasses.replace(prefix, positions=prefix.positions + jnp.arange(t))
        out = {}
        for whole in (1, 5):
            monkeypatch.setattr(attention, "WHOLE_BLOCKS", whole)
            jaxpr = str(jax.make_jaxpr(lambda q: decoder.attention(q, [new], prefix))(q))
            assert ("while" in jaxpr) == (whole == 1), whole  # the loop, or none
            out[whole] = np.asarray(decoder.attention(q, [new], prefix), np.float64)
        assert np.isfinite(out[5]).all()
        bound = _attention_bound(q, dense, dtype, int(prefix.count))
        err = float(np.abs(out[5] - out[1]).max())
        assert err <= bound, (err, bound)


def test_generate_reading_a_short_cache_whole_samples_as_the_loop(weights, monkeypatch):  # noqa: F811
    """16 greedy rows, 40 new tokens over prompts of 1-9: a 48-slot cache, two 24-slot
    blocks. Read whole (WHOLE_BLOCKS 2) against the loop (1): tokens equal (decisive argmax:
    the same in any program), logprobs within the bound of two programs (`logprob_tol`)."""
    greedy = SamplingConfig(max_new_tokens=40, temperature=0.0)
    runs = {}
    for whole in (1, 2):
        monkeypatch.setattr(attention, "WHOLE_BLOCKS", whole)
        jax.clear_caches()  # the decode program is traced anew under each setting
        eng = Engine(MODEL)
        runs[whole] = _rollout(eng, weights, greedy)
        assert eng._cache.v.shape[3] // eng._cache.block == 2, eng._cache.v.shape
    jax.clear_caches()
    (prompts, ref), (_, got) = runs[1], runs[2]
    _, logits = _trainer_logprobs(weights, prompts, ref, 2, 1.0)
    m = np.asarray(ref.mask)
    assert_decisive_argmax(logits[m])
    for f in ("tokens", "lengths", "steps"):
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)),
                                      err_msg=f)
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(ref.logprobs), rtol=0,
                               atol=logprob_tol("float32", logits))
