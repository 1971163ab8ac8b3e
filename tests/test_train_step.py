"""The train step on the TINY model: on-policy ratio, non-finite rejection, β = 0, schedule.

Tests in the fast tier share one compiled step (same config and shapes), so they cost one
compile between them.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.model import config, decoder, params
from locojax.rl import batch as batch_lib
from locojax.rl import logprobs, train_state, train_step
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
from tests.hf_reference import logprob_tol

pytestmark = pytest.mark.accelerator  # numbers that depend on the backend (docs/tpu.md)

MODEL = config.tiny()
LEARNER = LearnerConfig(algo=AlgoConfig(name="grpo"), optim=OptimConfig(lr=1e-3))
# Sampler (here `compute_logprobs`) and trainer logprobs are two programs computing one f32
# forward: they differ by ≤ `logprob_tol` at the init weights' logit scale (N(0, 0.02)
# weights, d = 64: max|logit| = 1.3 on these batches; 2 allowed) = 4.9e-4, measured 8e-8.
# A real sampler/trainer gap (another position, mask or temperature) moves logprobs by far
# more: one lr 1e-3 step moves them by 0.3.
MISMATCH_TOL = logprob_tol("float32", 2.0)
ACTOR_METRICS = ("actor/pg_loss", "actor/entropy", "actor/clip_frac_low", "actor/clip_frac_high",
                 "actor/grad_norm", "actor/lr", "actor/is_weight_mean", "actor/is_weight_max",
                 "actor/skipped_steps", "rollout/logprob_mismatch")


def weights():
    return params.init(MODEL, jax.random.key(0))


def on_policy_batch(w, rows=8, prompt=5, resp=7, seed=0):
    """Random prompts/responses whose behaviour logprobs are the trainer's own, as the
    sampler (which shares the forward) would return them."""
    rng = np.random.default_rng(seed)
    pm = np.arange(prompt)[None] >= rng.integers(0, 3, rows)[:, None]
    rm = np.arange(resp)[None] < rng.integers(1, resp + 1, rows)[:, None]
    pt = np.where(pm, rng.integers(1, MODEL.vocab_size, (rows, prompt)), 0)
    rt = np.where(rm, rng.integers(1, MODEL.vocab_size, (rows, resp)), 0)
    adv = rng.normal(size=rows).astype(np.float32)
    b = batch_lib.from_rollout(pt, pm, rt, rm, np.zeros((rows, resp)), adv, np.arange(rows) // 4)
    lp, _ = logprobs.compute_logprobs(w, jnp.asarray(b.tokens), jnp.asarray(b.positions),
                                        jnp.asarray(b.attn_mask), model_cfg=MODEL)
    return dataclasses.replace(b, old_logprobs=np.where(b.loss_mask, np.asarray(lp), 0.0)
                               .astype(np.float32))


def host(tree):
    return jax.tree.map(lambda x: np.array(x), jax.device_get(tree))


def test_first_on_policy_update_has_ratio_exactly_one():
    w = weights()
    b = on_policy_batch(w)
    state = train_state.init(w, LEARNER.optim, MODEL)
    before = host(state.params)
    state, m = train_step.update(state, b, MODEL, LEARNER)
    for name in ACTOR_METRICS:
        assert name in m and np.isfinite(m[name]), name
    assert m["actor/ratio_max"] == 1.0 and m["actor/ratio_min"] == 1.0
    assert m["actor/clip_frac_low"] == 0.0 and m["actor/clip_frac_high"] == 0.0
    assert m["actor/is_weight_mean"] == 1.0 and m["actor/is_weight_max"] == 1.0
    assert m["rollout/logprob_mismatch"] < MISMATCH_TOL  # sampler vs trainer: same function
    assert m["actor/lr"] == pytest.approx(1e-3, rel=2 ** -23)  # lr in f32: one rounding
    assert m["actor/grad_norm"] > 0
    assert m["actor/skipped_steps"] == 0.0
    assert int(state.step) == 1 and int(train_state.adam_count(state.opt_state)) == 1
    moved = max(np.abs(a - b_).max() for a, b_ in zip(jax.tree.leaves(host(state.params)),
                                                     jax.tree.leaves(before)))
    assert moved > 1e-4  # lr 1e-3 Adam step: ~lr per entry

    # A second step on the same rollouts: the behaviour policy is now one version old, so
    # the mismatch metric sees it (an lr 1e-3 step moves every weight by ~5% of its 0.02
    # scale, the logprobs by 0.3: far above MISMATCH_TOL), yet the step's own first ratio
    # is still exactly 1.
    state, m = train_step.update(state, b, MODEL, LEARNER)
    assert m["rollout/logprob_mismatch"] > max(1e-3, 3 * MISMATCH_TOL)
    assert m["actor/ratio_max"] == 1.0 and m["actor/ratio_min"] == 1.0


@pytest.mark.parametrize("epochs", [1, 2])  # the one-update path and the π_old pass
def test_a_batch_with_staleness_leaves_the_mismatch_to_its_producer(epochs):
    """Rows from rollout workers carry their staleness; their sampler/trainer gap is measured
    on the worker at the row's own version (`fleet/rollout_worker.py`), so the learner's
    step must not log a second, different `rollout/logprob_mismatch` for them."""
    w = weights()
    b = on_policy_batch(w)
    stale = dataclasses.replace(b, staleness=np.zeros(len(b.tokens), np.int32))
    cfg = dataclasses.replace(LEARNER, algo=dataclasses.replace(LEARNER.algo, ppo_epochs=epochs))
    _, m = train_step.update(train_state.init(weights(), cfg.optim, MODEL), stale, MODEL, cfg)
    assert "rollout/logprob_mismatch" not in m and m["actor/grad_norm"] > 0
    _, m = train_step.update(train_state.init(weights(), cfg.optim, MODEL), b, MODEL, cfg)
    assert m["rollout/logprob_mismatch"] < MISMATCH_TOL  # the same batch, made inline


def test_garbage_under_the_mask_is_inert():
    w = weights()
    b = on_policy_batch(w)
    dirty = dataclasses.replace(b, old_logprobs=np.where(b.loss_mask, b.old_logprobs, np.nan)
                                .astype(np.float32))
    clean_state, _ = train_step.update(train_state.init(w, LEARNER.optim, MODEL), b, MODEL,
                                       LEARNER)
    dirty_state, m = train_step.update(train_state.init(weights(), LEARNER.optim, MODEL), dirty,
                                       MODEL, LEARNER)
    assert m["actor/nonfinite_loss"] == 0.0
    for a, c in zip(jax.tree.leaves(host(dirty_state)), jax.tree.leaves(host(clean_state))):
        np.testing.assert_array_equal(a, c)


def _nan_advantage(b):
    adv = b.advantages.copy()
    adv[np.flatnonzero(b.loss_mask.any(1))[0]] = np.nan  # a row with response tokens
    return dataclasses.replace(b, advantages=adv)


def test_injected_nan_stops_the_run_naming_the_step():
    w = weights()
    b = on_policy_batch(w)
    poisoned = host(w)
    poisoned["final_norm"][0] = np.nan
    state, _ = train_step.update(train_state.init(w, LEARNER.optim, MODEL), b, MODEL, LEARNER)
    good = host(state)
    with pytest.raises(train_step.NonFiniteError, match=r"step 1: loss is nan in 1 of 1") as err:
        train_step.update(state, _nan_advantage(b), MODEL, LEARNER)
    kept = host(err.value.state)
    for a, g in zip(jax.tree.leaves((kept.params, kept.opt_state)),
                    jax.tree.leaves((good.params, good.opt_state))):
        np.testing.assert_array_equal(a, g)

    # A NaN weight poisons the forward itself; caught the same way.
    with pytest.raises(train_step.NonFiniteError, match=r"step 0: loss is nan"):
        train_step.update(train_state.init(jax.tree.map(jnp.asarray, poisoned), LEARNER.optim,
                                           MODEL), b, MODEL, LEARNER)


def test_injected_nan_is_skipped_and_counted_when_configured():
    w = weights()
    b = on_policy_batch(w)
    skip = dataclasses.replace(LEARNER, skip_nonfinite=True)
    state, _ = train_step.update(train_state.init(w, skip.optim, MODEL), b, MODEL, skip)
    good = host(state)
    for expected in (1.0, 2.0):
        state, m = train_step.update(state, _nan_advantage(b), MODEL, skip)
        assert m["actor/skipped_steps"] == expected and m["actor/nonfinite_loss"] == 1.0
    now = host(state)
    for a, g in zip(jax.tree.leaves((now.params, now.opt_state)),
                    jax.tree.leaves((good.params, good.opt_state))):
        np.testing.assert_array_equal(a, g)
    assert int(now.step) == 3 and int(train_state.adam_count(now.opt_state)) == 1
    # And the run carries on: the next good step is applied.
    state, m = train_step.update(state, b, MODEL, skip)
    assert int(train_state.adam_count(state.opt_state)) == 2 and m["actor/skipped_steps"] == 2.0


def _forwards_traced(cfg, b, ref_params):
    """How many times the model forward is traced for one train step."""
    calls = []
    real = decoder.forward

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    state = train_state.init(weights(), cfg.optim, MODEL)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decoder, "forward", counting)
        jax.make_jaxpr(lambda s, bb, r: train_step._train_step(s, bb, r, model_cfg=MODEL,
                                                               cfg=cfg))(state, b, ref_params)
    return len(calls)


def test_beta_zero_skips_the_reference_forward():
    w = weights()
    b = jax.tree.map(jnp.asarray, on_policy_batch(w))
    beta0 = LEARNER
    beta = dataclasses.replace(LEARNER, algo=dataclasses.replace(LEARNER.algo, beta=0.04))
    base = _forwards_traced(beta0, b, None)  # β = 0 needs neither ref params nor ref logprobs
    assert _forwards_traced(beta0, b, w) == base  # given ref params, still not used
    assert _forwards_traced(beta, b, w) == base + 1  # β > 0: exactly one more (the reference)
    with_ref = dataclasses.replace(b, ref_logprobs=b.old_logprobs)
    assert _forwards_traced(beta, with_ref, None) == base  # precomputed ref logprobs: no forward
    with pytest.raises(ValueError, match="beta=0.04 needs reference logprobs"):
        train_step.check(b, beta)


@pytest.mark.slow
def test_ppo_epochs_hold_old_policy_fixed_and_ref_kl():
    """μ = 2 passes × 2 mini-batches: 4 updates. Only the first sees ratio 1; later ones are
    measured against the start-of-step π_old, so with a large lr ratios move and clip."""
    w = weights()
    b = on_policy_batch(w, rows=8)
    cfg = LearnerConfig(algo=AlgoConfig(name="dapo", ppo_epochs=2, num_minibatches=2, beta=0.1),
                        optim=OptimConfig(lr=3e-2, max_grad_norm=0.0), grad_accum=2)
    state, m = train_step.update(train_state.init(w, cfg.optim, MODEL), b, MODEL, cfg,
                                 ref_params=weights())
    assert int(train_state.adam_count(state.opt_state)) == 4 and int(state.step) == 1
    assert m["actor/ratio_max"] > 1.28 or m["actor/ratio_min"] < 0.8
    assert m["actor/clip_frac_low"] + m["actor/clip_frac_high"] > 0
    assert m["rollout/logprob_mismatch"] < MISMATCH_TOL  # measured at the start of the step
    assert m["actor/kl"] > 0  # the policy moved away from the reference (its start point)


def test_schedule_warmup_then_cosine():
    lr = train_state.schedule(OptimConfig(lr=1.0, warmup_steps=2, decay_steps=10, min_lr_ratio=0.1))
    # update n uses (n+1)/2 during warmup; then 0.1 + 0.9·½(1 + cos(π (n+1-2)/8)).
    got = [float(lr(n)) for n in (0, 1, 5, 9, 20)]
    # A few f32 ops and one cos (XLA's is a polynomial: a few ulp) on O(1) terms: ≤ 8u.
    np.testing.assert_allclose(got, [0.5, 1.0, 0.55, 0.1, 0.1], rtol=8 * 2 ** -24)
    assert float(train_state.schedule(OptimConfig(lr=0.5))(7)) == 0.5


def test_weight_decay_skips_norm_scales():
    mask = train_state.decay_mask(MODEL)
    assert mask["embed"] and mask["layers"]["wq"] and mask["layers"]["w_down"]
    assert not mask["final_norm"] and not mask["layers"]["attn_norm"]
    assert not mask["layers"]["q_norm"] and not mask["layers"]["k_norm"]


def test_bad_batches_are_named():
    w = weights()
    b = on_policy_batch(w, rows=8)
    with pytest.raises(ValueError, match="does not split into num_minibatches=1 x grad_accum=3"):
        train_step.check(b, dataclasses.replace(LEARNER, grad_accum=3))
    with pytest.raises(ValueError, match="TrainBatch.loss_mask has shape"):
        train_step.check(dataclasses.replace(b, loss_mask=b.loss_mask[:, 1:]), LEARNER)
    with pytest.raises(ValueError, match="TrainBatch.group_id has shape"):
        train_step.check(dataclasses.replace(b, group_id=b.group_id[:3]), LEARNER)
    padded = batch_lib.pad_rows(b, 6)
    assert padded.tokens.shape[0] == 12 and not padded.loss_mask[8:].any()
    assert (padded.group_id[8:] == -1).all()
