"""A GRPO batch's shared prompt: logits skipped there, its forward run once per group.

`TrainBatch.shared_prefix` changes how the train step computes, never what: on a batch of
groups that share left-padded, variable-length prompts (as `from_rollout(group_size=G)`
builds it), the gradients, metrics and sequence logprobs equal those of the plain path.

Bounds: the three paths compute the same f32 sums in different orders (the prompt's
backward sums G rows' cotangents before the weight-gradient matmul rather than inside it;
attention mixes the prompt's and the response's values in two partial sums). Each gradient
entry is a sum over at most B·T = 16·14 products, so reordering moves it by a few ulps of the
sum's magnitude: ≲ 1e-6 relative over the whole array (measured 2e-7 .. 5e-7 at this size,
1.3e-6 at SMALL's 12k rows). 1e-5 leaves that margin on any CPU, while the bugs this guards
against (a wrong prompt row, a missing group sum, a target dropped or shifted by one column)
move the gradient by O(1) relative.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.model import config, params
from locojax.rl import batch as batch_lib
from locojax.rl import logprobs, train_state, train_step
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig

MODEL = config.tiny(num_hidden_layers=1)  # one layer: the prefix path is per layer; compiles fast
B, G, P, R = 16, 4, 6, 8
RTOL = 1e-5  # see the module docstring


def grouped_batch(seed=0, group_size=G):
    rng = np.random.default_rng(seed)
    pm = np.arange(P)[None] >= rng.integers(0, 4, B // G)[:, None]  # left-padded prompts
    pt = np.where(pm, rng.integers(1, MODEL.vocab_size, (B // G, P)), 0)
    rm = np.arange(R)[None] < rng.integers(1, R + 1, B)[:, None]  # uneven responses
    rt = np.where(rm, rng.integers(1, MODEL.vocab_size, (B, R)), 0)
    behav = rng.uniform(-7.0, -5.5, (B, R))
    adv = rng.normal(size=B).astype(np.float32)
    rows = lambda x: np.repeat(x, G, axis=0)  # noqa: E731
    return batch_lib.from_rollout(rows(pt), rows(pm), rt, rm, behav, adv,
                                  np.repeat(np.arange(B // G), G), staleness=np.arange(B) % 2,
                                  group_size=group_size)


def learner(grad_accum=1):
    return LearnerConfig(algo=AlgoConfig(name="grpo", beta=0.04), grad_accum=grad_accum,
                         optim=OptimConfig(lr=1e-3))


def one_update(batch, cfg, model=MODEL):
    w = params.init(model, jax.random.key(0))
    state = train_state.init(w, cfg.optim, model)
    ref = params.init(model, jax.random.key(1))  # a reference policy unlike the actor
    _, metrics, grads = train_step.train_step(state, jax.device_put(batch), ref, model_cfg=model,
                                              cfg=cfg, return_grads=True)
    return jax.device_get(metrics), jax.device_get(grads)


def rel_err(a, b):
    a, b = (np.concatenate([np.ravel(x).astype(np.float64) for x in jax.tree.leaves(t)])
            for t in (a, b))
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture(scope="module")
def plain():
    return one_update(dataclasses.replace(grouped_batch(), shared_prefix=None), learner())


def test_from_rollout_records_the_prefix():
    assert grouped_batch().shared_prefix == batch_lib.SharedPrefix(P, G)
    assert grouped_batch(group_size=0).shared_prefix is None


def test_same_gradients_and_metrics(plain):
    metrics, grads = one_update(grouped_batch(), learner())
    assert rel_err(grads, plain[1]) <= RTOL
    for name in ("actor/pg_loss", "actor/entropy", "actor/kl", "actor/grad_norm"):
        assert metrics[name] == pytest.approx(plain[0][name], rel=RTOL, abs=1e-7), name


@pytest.mark.parametrize("remat", [False, True])
def test_same_gradients_through_layers(remat):
    """Two layers: each response layer must attend to its own layer's prompt keys and values
    (the prompt and the responses advance through the layers in one scan); with remat too."""
    model, cfg = config.tiny(num_hidden_layers=2), dataclasses.replace(learner(), remat=remat)
    want = one_update(dataclasses.replace(grouped_batch(), shared_prefix=None), cfg, model)[1]
    assert rel_err(one_update(grouped_batch(), cfg, model)[1], want) <= RTOL


def test_grad_accum_keeps_the_objective(plain):
    """Strided micro-batches hold no whole group: the prefix falls back to skipping the
    prompt's logits only (the group-1 path), and must not mis-share."""
    metrics, grads = one_update(grouped_batch(), learner(grad_accum=2))
    assert rel_err(grads, plain[1]) <= RTOL


def test_logprobs_match_at_targets():
    b = grouped_batch()
    w = params.init(MODEL, jax.random.key(0))
    args = (w, jnp.asarray(b.tokens), jnp.asarray(b.positions), jnp.asarray(b.attn_mask))
    want, _ = logprobs.compute_logprobs(*args, model_cfg=MODEL)
    got, _ = logprobs.compute_logprobs(*args, model_cfg=MODEL, prefix=b.shared_prefix)
    m = b.loss_mask
    # Per-token logprobs of one forward: f32 rounding of a ~6-magnitude log-softmax.
    np.testing.assert_allclose(np.asarray(got)[m], np.asarray(want)[m], rtol=0, atol=2e-5)
    assert not np.asarray(got)[:, :P].any()  # no target there: 0 by definition


def test_a_wrong_group_is_an_error():
    b = grouped_batch()
    with pytest.raises(ValueError, match="differ within a group"):
        batch_lib.from_rollout(np.roll(np.asarray(b.tokens)[:, :P], 1, axis=0),
                               np.roll(np.asarray(b.attn_mask)[:, :P], 1, axis=0),
                               np.asarray(b.tokens)[:, P:], np.asarray(b.loss_mask)[:, P:],
                               np.zeros((B, R)), np.zeros(B), np.arange(B) // G, group_size=G)
    with pytest.raises(ValueError, match="groups of 3"):
        batch_lib.from_rollout(np.ones((B, P), int), np.ones((B, P), bool), np.ones((B, R), int),
                               np.ones((B, R), bool), np.zeros((B, R)), np.zeros(B),
                               np.arange(B) // G, group_size=3)
    bad = dataclasses.replace(b, loss_mask=np.asarray(b.loss_mask).copy())
    bad.loss_mask[0, P - 1] = True
    with pytest.raises(ValueError, match="loss target lies in the first"):
        batch_lib.validate(bad)


def test_padding_rows_keeps_a_valid_prefix():
    b = grouped_batch()
    assert batch_lib.pad_rows(b, 20).shared_prefix == batch_lib.SharedPrefix(P, G)  # +4 rows
    odd = batch_lib.pad_rows(b, 18)  # +2 rows: no longer whole groups of G
    assert odd.shared_prefix == batch_lib.SharedPrefix(P, 1)
    batch_lib.validate(odd)
