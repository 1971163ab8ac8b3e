"""The split train step (`--profile-split`) is the fused one, run as separate programs.

Same pieces (`local_sums`, `allreduce_sums`, `apply`), on a 2-device data-parallel mesh,
through micro-batches, mini-batches and epochs. Not bitwise: XLA compiles the local sums in
their own module, where it may fuse and so round differently (seen: 665 of 69,856 params
differ after one update, by <= 6.5e-9; 22,177 after four, by <= 6e-8). Bounds, per update:
the gradient sums differ as the same sums in another order do, relative
δ = RTOL = 1e-5 (tests/test_shared_prefix.py derives it); Adam's normalised step m/√v moves
by at most 2δ of its lr-sized value, and the new param rounds to within one ulp. Over U
updates: |θ_split - θ_fused| <= U (ulp(θ) + 2 lr δ); metrics (sums of the same terms)
within δ relative. A real difference (a missing micro-batch, another all-reduce, the wrong
first-update flag) moves params by ~lr = 1e-3 and metrics by far more than δ.
Each piece must also have been timed in its own phase.
"""

import dataclasses

import jax
import numpy as np
import pytest

from locojax.model import params
from locojax.model.sharding import TRAIN_DP, make_mesh, weight_shardings
from locojax.profiler import StepTimer
from locojax.rl import batch as batch_lib
from locojax.rl import gradients, split_step, train_state
from locojax.rl import train_step as ts
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
from tests.test_shared_prefix import MODEL, RTOL, grouped_batch

LR = 1e-3


def run(cfg, split: bool, mesh):
    w = jax.device_put(params.init(MODEL, jax.random.key(0)),
                       weight_shardings(MODEL, mesh, TRAIN_DP))
    ref = jax.device_put(params.init(MODEL, jax.random.key(1)),
                         weight_shardings(MODEL, mesh, TRAIN_DP))
    state = train_state.init(w, cfg.optim, MODEL)
    batch = batch_lib.shard(grouped_batch(), mesh, TRAIN_DP)
    timer = StepTimer()
    state, metrics = split_step.timed_update(state, batch, MODEL, cfg, ref, mesh, timer, split)
    return jax.device_get(state), metrics, timer.finish_step()


@pytest.mark.parametrize("algo", [
    dict(),  # one update, no micro-batches
    dict(ppo_epochs=2, num_minibatches=2),  # four updates, π_old from a separate pass
])
def test_split_step_is_the_fused_step_bitwise(algo):
    mesh = make_mesh({"data": 2}, jax.devices()[:2])
    cfg = LearnerConfig(algo=AlgoConfig(name="grpo", beta=0.04, **algo), grad_accum=2,
                        optim=OptimConfig(lr=LR))
    fused, m_fused, p_fused = run(cfg, False, mesh)
    split, m_split, p_split = run(cfg, True, mesh)
    u = cfg.updates_per_step
    assert int(split.step) == int(fused.step) == 1
    for a, b in zip(jax.tree.leaves(fused.params), jax.tree.leaves(split.params)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        ulp = np.spacing(np.abs(a).astype(np.float32)).astype(np.float64)
        assert (np.abs(a - b) <= u * (ulp + 2 * LR * RTOL)).all()
    assert m_split.keys() == m_fused.keys()
    for k, v in m_fused.items():
        assert m_split[k] == pytest.approx(v, rel=RTOL, abs=1e-30), k
    assert "perf/phase/train" in p_fused and "perf/phase/train_compute" not in p_fused
    for phase in ("train_compute", "train_wait", "train_collective"):
        assert p_split[f"perf/phase/{phase}"] > 0, phase
    assert "perf/phase/train" not in p_split


def test_one_device_has_no_collective_to_split():
    mesh = make_mesh({"data": 1}, jax.devices()[:1])
    cfg = dataclasses.replace(LearnerConfig(algo=AlgoConfig(name="grpo")), grad_accum=1)
    assert gradients.flat_allreduce_axis(mesh, cfg) is None
    _, _, perf = run(cfg, True, mesh)
    assert "perf/phase/train" in perf and "perf/phase/train_wait" not in perf
