"""LoRA (`locojax/model/lora.py`): the forward, the gradient and the train step's state.

- with B = 0 the LoRA forward IS the base forward, bitwise, on every family;
- the adapters' gradient is the full gradient's projection (f64): for W' = W + s A B,
  dL/dA = s · G Bᵀ and dL/dB = s · Aᵀ G, G = dL/dW' (chain rule through the merge);
- a train step changes the adapters only: the base comes back bitwise, and the optimizer
  state has the adapters' size, not the model's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.model import decoder, lora, params
from locojax.model.config import LoraConfig, tiny
from locojax.rl import batch as batch_lib
from locojax.rl import gradients, train_state
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
from locojax.rl.train_step import update
from tests.tolerance import probabilistic, x64

FAMILIES = ("qwen3", "qwen2", "llama", "gemma3_text")


def lora_cfg(model_type="qwen3", rank=4, dtype="float32", **kw):
    cfg = tiny(model_type=model_type, param_dtype=dtype, compute_dtype=dtype)
    return dataclasses.replace(cfg, lora=LoraConfig(rank=rank, alpha=8.0, **kw))


def tokens(cfg, b=2, t=7, seed=1):
    toks = jax.random.randint(jax.random.key(seed), (b, t), 0, cfg.vocab_size)
    return toks, jnp.broadcast_to(jnp.arange(t), (b, t))


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_b_forward_is_the_base_bitwise(family):
    cfg = lora_cfg(family)
    base = params.init(cfg, jax.random.key(0))
    adapters = lora.init(cfg, jax.random.key(1))
    assert all(not np.any(np.asarray(ab["b"])) for ab in adapters["layers"].values())
    assert all(np.any(np.asarray(ab["a"])) for ab in adapters["layers"].values())
    toks, pos = tokens(cfg)
    want, _ = decoder.forward(base, toks, pos, cfg)
    got, _ = decoder.forward(lora.view(base, adapters, cfg), toks, pos, cfg)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # ...and the adapters are really applied: a non-zero B moves the output.
    moved = jax.tree.map(lambda x: x + 0.1, adapters)
    other, _ = decoder.forward(lora.view(base, moved, cfg), toks, pos, cfg)
    assert not np.array_equal(np.asarray(other), np.asarray(want))


def test_declared_shapes_and_targets():
    cfg = lora_cfg(targets=("q", "o", "down"))
    ad = lora.init(cfg, jax.random.key(0))
    L, d, n, h, f, r = 2, 64, 4, 16, 128, 4
    assert sorted(ad["layers"]) == ["w_down", "wo", "wq"]
    assert ad["layers"]["wq"]["a"].shape == (L, d, r)
    assert ad["layers"]["wq"]["b"].shape == (L, r, n, h)
    assert ad["layers"]["wo"]["a"].shape == (L, n, h, r)
    assert ad["layers"]["wo"]["b"].shape == (L, r, d)
    assert ad["layers"]["w_down"]["a"].shape == (L, f, r)
    with pytest.raises(ValueError, match="lora targets"):
        LoraConfig(rank=4, targets=("q", "lm_head"))
    with pytest.raises(ValueError, match="rank"):
        LoraConfig(rank=-1)


def _random_b(adapters, key):
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                        for x, k in zip(leaves, keys)])


def test_adapter_gradient_is_the_projection_of_the_full_gradient():
    with x64():
        cfg = lora_cfg("qwen2", dtype="float64")  # q/k/v biases too
        base = params.init(cfg, jax.random.key(0))
        adapters = _random_b(lora.init(cfg, jax.random.key(1)), jax.random.key(2))
        toks, pos = tokens(cfg)

        def loss(weights):
            hidden, _ = decoder.forward(weights, toks, pos, cfg)
            return jnp.sum(jnp.sin(decoder.logits(weights, hidden, cfg)))

        g_ad = jax.grad(lambda ad: loss(lora.view(base, ad, cfg)))(adapters)
        g_full = jax.grad(loss)(lora.merge(base, adapters, cfg))
        s = cfg.lora.scale
        worst = 0.0
        for name, ab in adapters["layers"].items():
            k = lora.INPUT_DIMS.get(name, 1)
            a = ab["a"].reshape(ab["a"].shape[0], -1, ab["a"].shape[-1])  # [L, IN, r]
            b = ab["b"].reshape(ab["b"].shape[0], ab["b"].shape[1], -1)  # [L, r, OUT]
            g = g_full["layers"][name].reshape(a.shape[0], a.shape[1], b.shape[2])
            want_a = s * jnp.einsum("lio,lro->lir", g, b)
            want_b = s * jnp.einsum("lir,lio->lro", a, g)
            for got, want in ((g_ad["layers"][name]["a"], want_a),
                              (g_ad["layers"][name]["b"], want_b)):
                got = np.asarray(got).reshape(want.shape)
                scale = float(np.max(np.abs(want)))
                assert scale > 0, name
                worst = max(worst, float(np.max(np.abs(got - want))) / scale)
            assert k in (1, 2)
        # Both sides are the same chain rule evaluated in two orders over a forward and
        # backward of depth ~ d·L·(ops per layer) ≈ 4096 terms: f64's probabilistic bound,
        # relative to the largest entry (the test problem's sums are well-conditioned:
        # sin of logits of size ~1 at N(0, 0.02) weights).
        assert worst <= probabilistic(4096, np.float64), worst


def _batch(cfg, rows=8, cols=12, seed=3):
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, cfg.vocab_size, (rows, cols)).astype(np.int32)
    mask = np.ones((rows, cols), bool)
    loss_mask = np.zeros((rows, cols), bool)
    loss_mask[:, 6:] = True
    adv = np.repeat(rng.standard_normal(rows // 4), 4).astype(np.float32)
    return batch_lib.TrainBatch(
        tokens=toks, positions=np.broadcast_to(np.arange(cols), (rows, cols)).astype(np.int32),
        attn_mask=mask, loss_mask=loss_mask,
        advantages=adv, old_logprobs=np.full((rows, cols), -5.0, np.float32),
        group_id=np.repeat(np.arange(rows // 4), 4).astype(np.int32))


@pytest.mark.parametrize("base_dtype,remat,accum", [("float32", False, 1),
                                                    ("bfloat16", False, 1),
                                                    ("float32", True, 2)])
def test_train_step_updates_adapters_only(base_dtype, remat, accum):
    """Also with remat and micro-batches, what the memory plan picks for a large model: the
    layers' in-place gradient sum is for the full fine-tune's layer shapes, and LoRA keeps
    the plain backward (`gradients.in_place`)."""
    cfg = lora_cfg(base_dtype=base_dtype)
    learner = LearnerConfig(algo=AlgoConfig(group_size=4), optim=OptimConfig(lr=1e-2),
                            remat=remat, grad_accum=accum)
    assert not gradients.in_place(learner, cfg)
    base = lora.base_copy(cfg, params.init(cfg, jax.random.key(0)))
    adapters = lora.init(cfg, jax.random.key(1))
    before = jax.tree.map(np.asarray, (base, adapters))
    state = train_state.init(adapters, learner.optim, cfg, frozen=base)
    assert jax.tree.structure(state.opt_state[1][0].mu) == jax.tree.structure(adapters)
    state, metrics = update(state, _batch(cfg), cfg, learner)
    assert np.isfinite(metrics["actor/pg_loss"])
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.frozen),
                 before[0])
    assert all(x.dtype == jnp.dtype(base_dtype) for x in jax.tree.leaves(state.frozen))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    changed = [not np.array_equal(np.asarray(x), y) for x, y in
               zip(jax.tree.leaves(state.params), jax.tree.leaves(before[1]))]
    assert all(changed), "every A and B moves on the first update (B from 0 by Adam)"
