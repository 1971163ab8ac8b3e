"""A decode step's attention loop may fold several cache blocks per iteration
(`CacheBlocks.fold`, `KVCache.fold_slots`): each block gets the online-softmax update it gets
one block per iteration, in the same order, as ops over all the fold's blocks at once.

Checked: folded attention equals one softmax over the same slots within the blocked
attention's derived bound (tests/test_long_decode.py), for every fold from 2 to all the
blocks, with the written prefix ending inside and at the edge of a fold, in a full and in
a sliding-window layer (whose loop starts past block 0), never reading past the written
blocks (NaN there); and a greedy generate compacted from 16 to 8 rows gives the same
tokens folded as not, logprobs within `logprob_tol`. Not bitwise: on XLA:CPU the same
updates over other shapes round differently in the last bit (why the fold is off by
default, attention.FOLD_SLOTS).
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import decoder
from locojax.model.attention import BLOCK, CacheBlocks, slot_positions
from tests.hf_reference import assert_decisive_argmax, logprob_tol
from tests.test_long_decode import (  # weights: the module's fixture
    MODEL,
    _attention_bound,
    _attention_case,
    _compactions,
    _rollout,
    _trainer_logprobs,
    block_loop,  # noqa: F401
    weights,  # noqa: F401
)


def _folded(prefix: CacheBlocks, fold_slots: int) -> CacheBlocks:
    return dataclasses.replace(
        prefix, cache=dataclasses.replace(prefix.cache, fold_slots=fold_slots))


def _windowed(prefix: CacheBlocks, window: int) -> CacheBlocks:
    """The same cache read by a sliding-window layer, each row's query one position past its
    last written slot."""
    c = prefix.cache
    pos = slot_positions(c.valid)
    used = c.read(pos, 0, prefix.rows, (jnp.zeros((), jnp.int32),), (pos.shape[1],))
    query = jnp.max(jnp.where(jnp.arange(pos.shape[1]) < c.index, used, -1), 1)[:, None] + 1
    return dataclasses.replace(prefix, window=jnp.int32(window), positions=query,
                               slot_positions=pos)


@pytest.mark.usefixtures("block_loop")
@pytest.mark.parametrize("window", [None, 5], ids=["full", "window"])
@pytest.mark.parametrize("index", [3, 8, 13, 20])
def test_folded_blocks_attend_as_one_softmax(index, window):
    """Without a window against the one softmax (bound: `_attention_bound`); with one,
    against the one-block loop, each within that bound of the exact result (twice it)."""
    q, new, prefix, dense = _attention_case(np.float32, 1, index=index)  # 6 rows, 5 blocks of 4
    bound = _attention_bound(q, dense, np.float32, int(prefix.count))
    if window is None:
        ref = np.asarray(decoder.attention(q, dense), np.float64)
    else:
        prefix = _windowed(prefix, window)
        ref = np.asarray(decoder.attention(q, [new], _folded(prefix, 0)), np.float64)
        bound *= 2
        if index >= 13:
            assert int(prefix.first) >= 1  # the loop starts past block 0
    for fold_slots, m in [(48, 2), (72, 3), (96, 4), (1024, 5)]:  # rows x block = 24
        at = _folded(prefix, fold_slots)
        assert at.fold(1) == m and at.fold(3) == 1  # several queries: one block each
        got = np.asarray(decoder.attention(q, [new], at), np.float64)
        assert np.isfinite(got).all()  # no NaN slot was read
        assert np.abs(got - ref).max() <= bound, (m, np.abs(got - ref).max(), bound)


class _Engine(Engine):
    """An engine whose caches fold `fold_slots` row-slots per iteration of attention."""

    def __init__(self, *a, fold_slots: int, **k):
        super().__init__(*a, **k)
        self.fold_slots = fold_slots

    def _empty(self, rows, slots):
        return dataclasses.replace(super()._empty(rows, slots), fold_slots=self.fold_slots)


@pytest.mark.usefixtures("block_loop")  # its 4-block cache is otherwise read whole
def test_folded_generate_samples_as_unfolded(weights, monkeypatch):  # noqa: F811
    """16 greedy rows in 32-slot blocks (`BLOCK`), 120 new tokens (4 blocks), own budgets,
    compacted to 8 rows; a fold of 1,024 row-slots: 2 blocks an iteration at 16 rows, 4 at
    8. Tokens equal (decisive argmax: the same in any program), logprobs within the bound
    of two programs (`logprob_tol`)."""
    sizes = _compactions(monkeypatch)
    greedy = SamplingConfig(max_new_tokens=120, temperature=0.0)
    limits = np.random.default_rng(1).integers(1, 121, 16)
    prompts, ref = _rollout(_Engine(MODEL, fold_slots=0), weights, greedy, limits=limits)
    eng = _Engine(MODEL, fold_slots=1024)
    _, got = _rollout(eng, weights, greedy, limits=limits)
    assert eng._cache.v.shape[3] == 4 * BLOCK and 1024 // (16 * BLOCK) == 2
    assert sizes == [8, 8], sizes  # each engine compacted 16 -> 8 rows
    _, logits = _trainer_logprobs(weights, prompts, ref, 2, 1.0)
    assert_decisive_argmax(logits[np.asarray(ref.mask)])
    for f in ("tokens", "lengths", "steps"):
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)),
                                      err_msg=f)
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(ref.logprobs), rtol=0,
                               atol=logprob_tol("float32", logits))
