"""The split train step (`--profile-split`) is the fused one, run as separate programs.

Same pieces (`local_sums`, `allreduce_sums`, `apply`), on a 2-device data-parallel mesh,
through micro-batches, mini-batches and epochs. Not bitwise: XLA compiles the local sums in
their own module, where it may fuse and so round differently. So the test compares what
rounding can only move by a little, before Adam normalises it away, and derives each bound:

1. Every gradient entry is a sum of the same terms in another order: with n terms and f32's
   u = 2^-24, each entry moves by at most n·u·Σ|terms|, which over the whole array is
   <= δ = RTOL = 1e-5 of its norm (tests/test_shared_prefix.py derives it for this model
   and batch). Clipping multiplies by c = M/‖g‖, whose relative
   error is ‖Δg‖/‖g‖ <= δ, so the clipped gradient x = c·g moves by ‖Δx‖ <= 2δ‖x‖ <= 2δM
   (‖x‖ <= M, the clip norm).
2. Adam's moments are linear in x: μ = Σ_k (1-b1) b1^(U-1-k) x_k, so
   ‖Δμ‖ <= 2δM(1 - b1^U); ν = Σ_k (1-b2) b2^(U-1-k) x_k², and |Δ(x²)| = |2x + Δx|·|Δx|
   gives ‖Δν‖₁ <= (1 - b2^U)·(4δ + 4δ²)M². These hold only if every update sees the same
   params, so the test of several updates runs at lr = 0 (then the params must stay bitwise
   equal: θ + (-0)·u = θ for finite u). μ and ν still carry every update's gradient: a
   missing micro-batch or mini-batch or a wrong row split moves μ by O(‖x‖), where the
   bound is 2δ of it. Measured (-O0 and classic emitters): ‖Δμ‖ at <= 0.6% of its bound,
   ‖Δν‖₁ at <= 0.4%; with XLA's default flags every case here was bitwise equal.
3. The params after one update at lr > 0, entry by entry, from the measured Δx (point 2 at
   U = 1: Δx = Δμ / (1 - b1)). Adam's first step is u(x) = x/(|x| + ε) (m̂ = x, √v̂ = |x|),
   whose slope ε/(|x| + ε)² is largest where |x| is smallest, so over |Δx| <= D it moves
   by <= D·ε/(max(|x| - D, 0) + ε)², and never by more than 2 (|u| < 1). This is why the
   earlier bound (θ within ulp + 2·lr·δ) failed under the in-process phase's XLA flags
   (`make test`: -O0, classic emitters): an entry with |x| ~ ε gets a step of 0.5-1 lr, so
   a rounding-level Δx moved it by O(lr), 65x that bound at β = 0. Each side then rounds
   u (two bias corrections, a sqrt, the ε add, a divide, the decay and the product by lr:
   < 16u of |u| + wd|θ| each, |u| < 1) and the new param to the nearest float (1/2 ulp
   each): |Δθ| <= lr·(Δu + 32u(1 + wd|θ|)) + ulp(max |θ'|). An entry whose μ agrees to
   the bit may still differ by that one ulp (measured: up to 0.99 of this bound).
Metrics are sums of the same terms: within δ relative (measured: bitwise equal here; 5e-7
under the earlier test's lr = 1e-3 over four updates). Real
differences fail (each injected under the in-process phase's flags, 2026-12-04): a micro-batch
dropped from the local sums and mini-batch 0 taken by every update break μ's bound; a second
all-reduce (gradients doubled) is clipped back to M, so μ hides it, and `actor/grad_norm`
fails. Not caught, here as before: `first` wrongly true in every update (π_old = sg(π_θ)),
whose effect on this batch stays below δ even at lr = 1e-3.
Each piece must also have been timed in its own phase.
"""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from locojax.model import params
from locojax.model.sharding import TRAIN_DP, make_mesh, weight_shardings
from locojax.profiler import StepTimer
from locojax.rl import batch as batch_lib
from locojax.rl import gradients, train_state
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
from locojax.train import loop
from tests import backend
from tests.test_shared_prefix import MODEL, RTOL, grouped_batch

pytestmark = pytest.mark.accelerator  # numbers that depend on the backend (docs/tpu.md)

U32 = 2.0 ** -24  # f32's unit roundoff


def run(cfg, split: bool, mesh):
    w = jax.device_put(params.init(MODEL, jax.random.key(0)),
                       weight_shardings(MODEL, mesh, TRAIN_DP))
    ref = jax.device_put(params.init(MODEL, jax.random.key(1)),
                         weight_shardings(MODEL, mesh, TRAIN_DP))
    state = train_state.init(w, cfg.optim, MODEL)
    before = jax.device_get(state.params)
    batch = batch_lib.shard(grouped_batch(), mesh, TRAIN_DP)
    timer = StepTimer()
    state, metrics = loop.update(state, batch, MODEL, cfg, ref, mesh, timer, split)
    return before, jax.device_get(state), metrics, timer.finish_step()


def moments(state):
    """Adam's (μ, ν) as flat float64 vectors."""
    adam = next(x for x in jax.tree.leaves(
        state.opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
        if isinstance(x, optax.ScaleByAdamState))
    flat = lambda t: np.concatenate([np.ravel(x).astype(np.float64)  # noqa: E731
                                     for x in jax.tree.leaves(t)])
    return flat(adam.mu), flat(adam.nu)


def check_moments(fused, split, o: OptimConfig, u: int):
    """Point 2 of the module doc."""
    (mu_f, nu_f), (mu_s, nu_s) = moments(fused), moments(split)
    m = o.max_grad_norm
    assert m > 0, "the bounds use the clip norm M"
    assert np.linalg.norm(mu_s - mu_f) <= 2 * RTOL * m * (1 - o.b1 ** u)
    assert np.abs(nu_s - nu_f).sum() <= (1 - o.b2 ** u) * (4 * RTOL + 4 * RTOL ** 2) * m * m
    return mu_f, mu_s


def check_params_after_one_update(before, fused, split, o: OptimConfig):
    """Point 3 of the module doc, entry by entry."""
    mu_f, mu_s = moments(fused)[0], moments(split)[0]
    x, d = mu_f / (1 - o.b1), np.abs(mu_s - mu_f) / (1 - o.b1)
    du = np.minimum(2.0, d * o.eps / (np.maximum(np.abs(x) - d, 0) + o.eps) ** 2)
    leaves = lambda t: np.concatenate([np.ravel(v).astype(np.float64)  # noqa: E731
                                       for v in jax.tree.leaves(t)])
    theta, new_f, new_s = leaves(before), leaves(fused.params), leaves(split.params)
    big = np.maximum(np.abs(new_f), np.abs(new_s)).astype(np.float32)
    ulp = np.spacing(big).astype(np.float64)
    bound = o.lr * (du + 32 * U32 * (1 + o.weight_decay * np.abs(theta))) + ulp
    assert (np.abs(new_s - new_f) <= bound).all(), np.max(np.abs(new_s - new_f) / bound)


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("algo,lr", [
    (dict(), 1e-3),  # one update, two micro-batches: params compared after Adam (point 3)
    (dict(ppo_epochs=2, num_minibatches=2), 0.0),  # four updates, π_old from a separate pass
])
def test_split_step_is_the_fused_step_to_rounding(algo, lr, beta):
    mesh = make_mesh({"data": 2}, backend.devices(2))
    cfg = LearnerConfig(algo=AlgoConfig(name="grpo", beta=beta, **algo), grad_accum=2,
                        optim=OptimConfig(lr=lr))
    before, fused, m_fused, p_fused = run(cfg, False, mesh)
    _, split, m_split, p_split = run(cfg, True, mesh)
    u = cfg.updates_per_step
    assert int(split.step) == int(fused.step) == 1
    check_moments(fused, split, cfg.optim, u)
    if lr:
        check_params_after_one_update(before, fused, split, cfg.optim)
    else:  # nothing moves: the same params, bitwise, on both sides
        for a, b in zip(jax.tree.leaves(fused.params), jax.tree.leaves(split.params)):
            np.testing.assert_array_equal(a, b)
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
    _, _, _, perf = run(cfg, True, mesh)
    assert "perf/phase/train" in perf and "perf/phase/train_wait" not in perf
