"""`--rollout.tp 2`: the engine on a data x tensor mesh (ROLLOUT_TP) generates the tokens
it generates with tp 1 (ROLLOUT_REPLICATED over the same 2 devices).

Why equal, and how far: the two are different programs for the same forward. Splitting
heads, MLP and vocabulary over `tensor` turns the o-projection's and down-projection's
contractions into per-device partial sums joined by a collective add, and the vocabulary
softmax into a sharded reduction: the same terms in another order, so each logit differs by
at most `logit_tol` (tests/hf_reference.py: the probabilistic bound over the forward's
reduction depth, which holds for any order, on any CPU). Hence:
- greedy tokens are equal wherever the top logit leads by more than twice that bound, which
  `_greedy` asserts for every compared position (decisive: the same argmax in both);
- a sampled token is the inverse-CDF draw of its row's uniform, and the uniforms are bitwise
  equal (integer threefry bits, independent of layout), so two runs can pick different
  tokens only where a uniform lies within the bound of a CDF boundary: both runs' tokens
  are checked to be such draws under the policy a full forward recomputes, and rows
  whose tokens agree have logprobs within `logprob_tol` (`test_engine._assert_samples_as`).
"""

import jax
import numpy as np
import pytest

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model.sharding import ROLLOUT_TP, make_mesh
from tests.hf_reference import paired, tiny_cfg
from tests.test_engine import _assert_samples_as, _greedy, _prompts


@pytest.fixture(scope="module")
def engines():
    cfg = tiny_cfg()  # 4 heads, 2 kv heads, ffn 128, vocab 512: all split by 2
    _, w = paired(cfg, seed=1)
    devices = jax.devices()[:2]
    tp1 = Engine(cfg, mesh=make_mesh({"data": 2}, devices))
    tp2 = Engine(cfg, mesh=make_mesh({"data": 1, "tensor": 2}, devices), rules=ROLLOUT_TP)
    return cfg, w, tp1, tp2


def test_tp_engine_splits_weights_and_cache_over_tensor(engines):
    cfg, w, _, tp2 = engines
    placed = tp2.place_weights(w)
    specs = {str(x.sharding.spec) for x in jax.tree.leaves(placed)}
    assert any("tensor" in s for s in specs), specs  # not silently replicated
    _greedy(tp2, placed, _prompts(cfg.vocab_size))
    assert tp2._cache.k.sharding.spec[2] == "tensor"  # kv heads


def test_tp2_greedy_tokens_equal_tp1(engines):
    """Decisive at every compared position (asserted in `_greedy`), so equal on any CPU."""
    cfg, w, tp1, tp2 = engines
    prompts = _prompts(cfg.vocab_size, seed=3)
    np.testing.assert_array_equal(_greedy(tp2, w, prompts), _greedy(tp1, w, prompts))


@pytest.mark.slow
def test_tp2_samples_the_draws_tp1_samples(engines):
    cfg, w, tp1, tp2 = engines
    prompts = _prompts(cfg.vocab_size, seed=11)
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, stop_token_ids=(5,))
    _assert_samples_as(tp1, tp2, w, cfg, prompts, sampling)
