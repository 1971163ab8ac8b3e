"""One f32 gradient buffer: with remat the layers' gradients are summed into the step's
accumulator inside the backward, in place (`model/accumulating_scan.py`, issue 55 item 1).

Two invariants:
- the gradients are those of the plain scanned backward (`gradients.in_place` off), at one
  micro-batch and at four, in float64 under the layout harness's derived bound;
- XLA's compiled train step at grad_accum 4 no longer holds a second copy of the layers'
  gradients: its temporaries are below two copies, where the plain step's are above, and
  within the memory plan's expectation (`train_memory.gradient_bytes`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import layout_worker as lw
from locojax.model import config, params
from locojax.model.sharding import make_mesh
from locojax.rl import batch as batch_lib
from locojax.rl import gradients, train_state, train_step
from locojax.rl.config import AlgoConfig, LearnerConfig
from locojax.train import train_memory
from tests.tolerance import probabilistic, x64

# The layout harness's fixed problem and chain (tests/test_layout_invariance.py derives
# DEPTH = 4096 terms along its longest reduction chain); x 2: both sides carry that error.
REL = 2 * probabilistic(4096, np.float64)  # 1.4e-13


def _step(in_place: bool):
    """`train_step` under a jit of its own (the module's is cached per static config, which
    does not see `in_place`), with `gradients.in_place` forced."""
    def step(*args, **kwargs):
        original = gradients.in_place
        gradients.in_place = lambda *_: in_place
        try:
            return train_step._train_step(*args, **kwargs)
        finally:
            gradients.in_place = original

    return jax.jit(step, static_argnames=("model_cfg", "cfg", "mesh", "return_grads"),
                   donate_argnums=0)  # as train_step donates the state


def _grads(model_cfg, grad_accum: int, in_place: bool):
    cfg = dataclasses.replace(lw.learner_config("token-mean", grad_accum), remat=True)
    state = train_state.init(params.init(model_cfg, jax.random.key(0)), cfg.optim, model_cfg)
    batch = jax.tree.map(jnp.asarray, lw.make_batch())
    _, _, grads = _step(in_place)(state, batch, model_cfg=model_cfg, cfg=cfg, return_grads=True)
    return {jax.tree_util.keystr(p): np.asarray(g)
            for p, g in jax.tree_util.tree_flatten_with_path(grads)[0]}


@pytest.mark.parametrize("layers", [2, 10])  # unrolled (<= 8 layers) and scanned plain paths
def test_gradients_in_place_equal_the_plain_backward(layers):
    with x64():
        model_cfg = config.tiny(param_dtype="float64", compute_dtype="float64",
                                num_hidden_layers=layers)
        want = _grads(model_cfg, 1, in_place=False)
        for grad_accum in (1, 4):
            got = _grads(model_cfg, grad_accum, in_place=True)
            assert got.keys() == want.keys()
            for name, g in got.items():  # as vectors: entries at the noise floor say nothing
                rel = np.linalg.norm(g - want[name]) / np.linalg.norm(want[name])
                assert rel <= REL, (grad_accum, name, rel)


MODEL = config.tiny(num_hidden_layers=12, hidden_size=256, intermediate_size=768)
ROWS, COLUMNS, PROMPT, GROUP = 16, 32, 8, 4  # small activations: the gradients dominate


def _temporaries(in_place: bool, grad_accum: int) -> int:
    mesh = make_mesh({"data": 1}, jax.devices()[:1])
    learner = LearnerConfig(algo=AlgoConfig(group_size=GROUP), remat=True, grad_accum=grad_accum)
    state = train_state.abstract(MODEL, learner.optim, mesh)
    batch = batch_lib.abstract(ROWS, COLUMNS, mesh,
                               shared_prefix=batch_lib.SharedPrefix(PROMPT, GROUP))
    lowered = _step(in_place).lower(state, batch, model_cfg=MODEL,
                                    cfg=train_step.program_cfg(learner), mesh=mesh)
    return lowered.compile().memory_analysis().temp_size_in_bytes


def test_grad_accum_holds_one_gradient_buffer():
    layers = 4 * sum(x.size for x in jax.tree.leaves(params.abstract(MODEL)["layers"]))
    plain, in_place = _temporaries(False, 4), _temporaries(True, 4)
    assert plain >= 2 * layers  # the premise: the plain step holds the sum and its own
    assert in_place < 2 * layers  # 30.7 MB of layer gradients: ~41 MB in place, ~69 MB plain
    learner = LearnerConfig(algo=AlgoConfig(group_size=GROUP), remat=True, grad_accum=4)
    expected = train_memory.expected_train_temporaries(
        MODEL, learner, ROWS, COLUMNS, devices=1,
        prefix=batch_lib.SharedPrefix(PROMPT, GROUP))
    assert in_place <= sum(expected.values())
    # the plan's own rule: one buffer, one layer's more and the weights outside the layers
    assert expected["gradients"] == 4 * MODEL.num_params() + layers // 12 + 4 * (
        MODEL.num_params() - layers // 4)


@pytest.mark.parametrize("shape,rules", [({"data": 4}, "train_dp"),
                                         ({"data": 2, "fsdp": 2}, "train_fsdp")])
def test_in_place_under_the_layout_harness(monkeypatch, shape, rules):
    """The layout harness's fast-tier layouts (4 devices, whose data-parallel step sums in
    `shard_map` and all-reduces one flat buffer; FSDP 2 x 2, whose sum is sharded), with
    grad-accum 2, padding and remat on, so the layers' gradients are summed in place: equal
    to the harness's one-device plain reference in f64 under its own bound (REL there)."""
    from tests import test_layout_invariance as harness

    plain = harness.reference(harness.QUICK_MODE)  # computed before remat is switched on
    config = lw.learner_config
    monkeypatch.setattr(lw, "learner_config", lambda *a, **k: dataclasses.replace(
        config(*a, **k), remat=True))
    got = harness.run(shape, harness.QUICK_MODE, 2, 2, 3, rules=rules)
    harness.compare(got, plain, f"in place on {shape}", harness.QUICK_MODE, "float64")
