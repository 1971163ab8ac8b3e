"""Policy loss, KL, IS weight and aggregation against hand-computed numbers.

Toy batch for the objective tests: two groups of two rows, 3 columns, per-token ratios
r = π_θ / π_old given directly through log r = logp - old_logp:
  group 0: row 0  A = +1    r = [1.5, 1.1, -]   (2 tokens)
           row 1  A = -1    r = [0.5, -, -]     (1 token)
  group 1: row 2  A = +0.5  r = [0.5, 1.5, 1.0] (3 tokens)
           row 3  A = -0.5  r = [4.0, -, -]     (1 token)
"-" is masked out; NaN is stored there to prove masked garbage is inert.

Bounds: every expected value is exact (a fraction, or the formula in numpy f64); the f32
result is off by a few roundings of its terms, so |got - want| ≤ k·u·Σ|terms| with k the
roundings along the way, counting EXP for each exp and LOG for each log computed on the
backend: XLA's are approximations, not correctly rounded, and how far off depends on the
backend (`tolerance.elementwise`: 4 u each on XLA:CPU, far more on a TPU), and Σ|terms| the
scale before any cancellation (`close`). A log's error is absolute, LOG·u·max(1, |log x|).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.rl import aggregation as agg
from locojax.rl.losses import (LossSettings, clipped_pg, kl_penalty, log_ratio, objective,
                               truncated_is_weight)
from tests.tolerance import elementwise, unit_roundoff

pytestmark = pytest.mark.accelerator  # numbers that depend on the backend (docs/tpu.md)

U = unit_roundoff("float32")
EXP, LOG = elementwise("exp"), elementwise("log")


def close(got, want, roundings: int, scale=None):
    """|got - want| ≤ roundings · u · scale, scale Σ|terms| (default |want|: no cancelling)."""
    want = np.asarray(want, np.float64)
    scale = np.abs(want) if scale is None else scale
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0,
                               atol=np.max(roundings * U * scale))


@functools.cache
def compiled(fn, **static):
    """`fn` with its `static` settings as one compiled program, as the train step runs it
    (inside its own program). Run op by op, each of its ops was a program of its own to
    compile: ~190 in this module, and the chip compiles every one."""
    return jax.jit(functools.partial(fn, **static))


NAN = float("nan")
RATIOS = np.array([[1.5, 1.1, NAN], [0.5, NAN, NAN], [0.5, 1.5, 1.0], [4.0, NAN, NAN]])
MASK = jnp.asarray(~np.isnan(RATIOS))
ADV = jnp.array([1.0, -1.0, 0.5, -0.5])


def toy(settings: LossSettings, stale=None, behav_shift=0.0, ref_shift=None):
    """objective() on the toy batch, with logp = 0 and old = -log r (so logp - old = log r)."""
    logp = jnp.zeros(MASK.shape)
    old = jnp.asarray(-np.log(RATIOS), jnp.float32)  # NaN under the mask
    behav = old - behav_shift
    ref = None if ref_shift is None else logp - ref_shift
    stale = jnp.zeros(4, bool) if stale is None else jnp.asarray(stale)
    counts = agg.global_counts(MASK)
    return compiled(objective, s=settings)(logp, jnp.ones(MASK.shape), old, behav, ref, ADV,
                                           MASK, stale, counts)


def test_clipped_pg_each_case():
    ratio = jnp.array([1.5, 0.5, 1.1, 0.5, 1.5, 4.0, 1.0])
    adv = jnp.array([1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 0.0])
    # (r, A) → max(-A r, -A clip(r, 0.8, 1.28)):
    # (1.5,+1) → max(-1.5, -1.28) = -1.28, clip_high | (0.5,-1) → max(0.5, 0.8) = 0.8, clip_low
    # (1.1,+1) → -1.1 | (0.5,+1) → max(-0.5, -0.8) = -0.5, r low but A > 0: not clipped
    # (1.5,-1) → max(1.5, 1.28) = 1.5 | (4,-1) → 4.0; dual-clip c=3 caps it at -cA = 3 | A=0 → 0
    loss, low, high = compiled(clipped_pg, eps_low=0.2, eps_high=0.28)(ratio, adv)
    # f32 of each ratio or clip bound (1 ± ε: two roundings), times A = ±1 (exact)
    close(loss, [-1.28, 0.8, -1.1, -0.5, 1.5, 4.0, 0.0], 3)
    assert np.asarray(high).tolist() == [True, False, False, False, False, False, False]
    assert np.asarray(low).tolist() == [False, True, False, False, False, False, False]
    loss, _, _ = compiled(clipped_pg, eps_low=0.2, eps_high=0.28, dual_clip=3.0)(ratio, adv)
    close(loss, [-1.28, 0.8, -1.1, -0.5, 1.5, 3.0, 0.0], 3)


def test_kl_estimators():
    # δ = log π - log π_ref = ±ln 2. k1 = δ; k2 = δ²/2 = 0.2402265; k3 = e^{-δ} - 1 + δ:
    # δ = ln 2 → 1/2 - 1 + 0.6931472 = 0.1931472; δ = -ln 2 → 2 - 1 - 0.6931472 = 0.3068528.
    ln2 = float(np.log(2.0))
    logp, ref = jnp.array([0.0, 0.0]), jnp.array([-ln2, ln2])
    kl = {k: compiled(kl_penalty, estimator=k)(logp, ref) for k in ("k1", "k2", "k3")}
    close(kl["k1"], [ln2, -ln2], 1)  # f32(ln 2)
    close(kl["k2"], [ln2 ** 2 / 2] * 2, 4)  # δ's rounding, doubled; δ²
    # exp (EXP), δ's rounding and two sums (4 with room), at the scale e^{-δ} + 1 + |δ| ≤ 3.7
    # (the result 0.19 cancels most of it: a bound of 1e-6 relative would be tighter than
    # XLA's exp).
    close(kl["k3"], [0.5 - 1 + ln2, 2 - 1 - ln2], EXP + 4, scale=2 + 1 + ln2)
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(logp, ref, "k4")


def test_truncated_is_weight():
    # Token level, log(π_old/π_behav) = [ln 3, ln 0.5] → min([3, 0.5], C=2) = [2, 0.5] on the
    # stale row, 1 on the fresh row. Sequence level (GSPO): exp(mean(ln 3, ln 0.5)) =
    # sqrt(1.5) = 1.2247449 on every token of the stale row.
    old = jnp.log(jnp.array([[3.0, 0.5], [3.0, 0.5]]))
    behav = jnp.zeros((2, 2))
    mask = jnp.ones((2, 2), bool)
    stale = jnp.array([True, False])
    w = compiled(truncated_is_weight, cap=2.0)(old, behav, mask, stale)
    # log (|ln 0.5| < 1: LOG·u absolute, w's relative error) then exp; 2 and 1 are exact
    close(w, [[2.0, 0.5], [1.0, 1.0]], LOG + EXP)
    w = compiled(truncated_is_weight, cap=2.0, level="sequence")(old, behav, mask, stale)
    # the exponent's absolute error is w's relative error: two logs (LOG·u·max(1, |log x|):
    # ln 3 = 1.0986 and 1), their mean (one rounding of the 0.41 sum, the halving exact),
    # then exp.
    close(w, [[1.5 ** 0.5] * 2, [1.0, 1.0]], LOG * (np.log(3) + 1) / 2 + 1 + EXP,
          scale=1.5 ** 0.5)
    assert (np.asarray(compiled(truncated_is_weight, cap=0.0)(old, behav, mask, stale))
            == 1.0).all()


def test_gspo_sequence_ratio_is_length_normalised_geometric_mean():
    # Row 0 token log-ratios [ln 1.5, ln 1.1] → exp(mean) = sqrt(1.65) = 1.2845233;
    # row 2 [ln .5, ln 1.5, 0] → 0.75^(1/3) = 0.9085603; masked NaNs do not enter.
    lr = compiled(log_ratio, level="sequence")(jnp.zeros(MASK.shape),
                                               jnp.asarray(-np.log(RATIOS)), MASK)
    s = np.exp(np.asarray(lr, np.float64))
    # f32 inputs (one rounding of each |log r| ≤ 1.4), a ≤ 3-term mean: the exponent's
    # absolute error, ≤ 4u·Σ|log r| / n, is s's relative error.
    close(s[0], [1.65 ** 0.5] * 3, 4, scale=1.65 ** 0.5 * (np.log(1.5) + np.log(1.1)) / 2)
    close(s[2], [0.75 ** (1 / 3)] * 3, 4, scale=0.75 ** (1 / 3) * np.log(3) / 3)
    close(s[3, 0], 4.0, 4, scale=4.0 * np.log(4))


# Aggregation toy: per-token loss L (NaN under the mask), n_b = [3, 1, 0, 4]; row 2 has no
# response token, so it counts as no sequence. Σ m L = 6 + 4 + 0 + 4 = 14, tokens 8, seqs 3.
AGG_L = jnp.array([[1.0, 2.0, 3.0, NAN], [4.0, NAN, NAN, NAN], [NAN] * 4, [1.0, 1.0, 1.0, 1.0]])
AGG_M = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
AGG_EXPECTED = {
    "token-mean": 14 / 8,
    "seq-mean-token-mean": (6 / 3 + 4 / 1 + 4 / 4) / 3,  # = 7/3
    "seq-mean-token-sum": 14 / 3,
    "seq-mean-token-sum-norm": 14 / (3 * 5),  # L_max = 5
}


@pytest.mark.parametrize("mode", list(AGG_EXPECTED))
def test_aggregation_modes(mode):
    counts = agg.global_counts(AGG_M)
    assert (float(counts.tokens), float(counts.seqs)) == (8.0, 3.0)
    aggregate = compiled(agg.aggregate, mode=mode, max_len=5)
    got = aggregate(AGG_L, AGG_M, counts)
    close(got, AGG_EXPECTED[mode], 2)  # sums of small integers are exact; ≤ 2 divisions
    # Split the rows in two micro-batches: partial sums over global counts add up exactly
    # (up to rounding: two parts of ≤ 2 divisions each, one add)...
    halves = (np.array([0, 3]), np.array([1, 2]))
    parts = [aggregate(AGG_L[i], AGG_M[i], counts) for i in halves]
    close(sum(parts), AGG_EXPECTED[mode], 5)
    # ...while the classic bug, each micro-batch normalised by its own counts and averaged,
    # does not (the negative control, off by arithmetic, ≥ 0.02, not by rounding; the
    # layout harness catches it: test_layout_invariance's planted bugs).
    local = [aggregate(AGG_L[i], AGG_M[i], agg.global_counts(AGG_M[i])) for i in halves]
    assert abs(float(sum(local)) / 2 - AGG_EXPECTED[mode]) > 0.02


def test_aggregation_norm_needs_max_len():
    with pytest.raises(ValueError, match="max_response_len"):
        agg.aggregate(AGG_L, AGG_M, agg.global_counts(AGG_M), "seq-mean-token-sum-norm")


# Per-token PPO losses on the toy batch with ε = (0.2, 0.28), from test_clipped_pg_each_case:
# row 0: (1.5,+1) → -1.28 [high], (1.1,+1) → -1.1      row 1: (0.5,-1) → 0.8 [low]
# row 2: (0.5,+.5) → max(-.25, -.4) = -0.25, (1.5,+.5) → max(-.75, -.64) = -0.64 [high],
#        (1,+.5) → -0.5                                 row 3: (4,-.5) → max(2, .64) = 2.0
# Σ = -0.97 over 7 tokens and 4 sequences; per-row means -1.19, 0.8, -1.39/3, 2.0.
DAPO_TOKENS = np.array([[-1.28, -1.1, 0], [0.8, 0, 0], [-0.25, -0.64, -0.5], [2.0, 0, 0]])
DAPO_EXPECTED = {
    "token-mean": -0.97 / 7,
    "seq-mean-token-mean": (-1.19 + 0.8 - 1.39 / 3 + 2.0) / 4,
    "seq-mean-token-sum": -0.97 / 4,
    "seq-mean-token-sum-norm": -0.97 / (4 * 4),  # L_max = 4
}


def _abs_scale(mode, tokens=DAPO_TOKENS, max_len=4):
    """The aggregate of |per-token loss|: Σ|terms| of the loss, the scale of its rounding."""
    return float(compiled(agg.aggregate, mode=mode, max_len=max_len)(
        jnp.abs(jnp.asarray(tokens, jnp.float32)), MASK, agg.global_counts(MASK)))


# Per token: f32(-log r) (1 rounding of |log r| ≤ 1.4, taken on the host), exp (EXP), a clip
# bound (2), ×A (exact or 1); then the aggregate's sums and divisions (≤ 7 + 2).
OBJECTIVE_ROUNDINGS = 12 + EXP


@pytest.mark.parametrize("mode", list(DAPO_EXPECTED))
def test_ppo_objective_each_mode(mode):
    s = LossSettings(eps_low=0.2, eps_high=0.28, loss_agg=mode, max_response_len=4)
    loss, m, e = toy(s)
    close(loss, DAPO_EXPECTED[mode], OBJECTIVE_ROUNDINGS, scale=_abs_scale(mode))
    close(m["actor/pg_loss"], DAPO_EXPECTED[mode], OBJECTIVE_ROUNDINGS, scale=_abs_scale(mode))
    close(m["actor/clip_frac_high"], 2 / 7, 1)  # an exact count over an exact count
    close(m["actor/clip_frac_low"], 1 / 7, 1)
    close(e["actor/ratio_max"], 4.0, EXP + 2)  # exp of f32(log 4): EXP + |log 4|·u relative
    close(e["actor/ratio_min"], 0.5, EXP + 2)
    assert "actor/kl" not in m  # β = 0: no KL term at all


def test_dual_clip_in_objective():
    # Row 3's 2.0 is capped at -c A = 3 · 0.5 = 1.5: Σ = -0.97 - 0.5 = -1.47 over 7 tokens.
    s = LossSettings(eps_low=0.2, eps_high=0.28, dual_clip=3.0, loss_agg="token-mean")
    capped = DAPO_TOKENS.copy()
    capped[3, 0] = 1.5
    close(toy(s)[0], -1.47 / 7, OBJECTIVE_ROUNDINGS, scale=_abs_scale("token-mean", capped))


def test_gspo_objective():
    # Sequence ratios s = [sqrt(1.65) = 1.2845, 0.5, 0.75^(1/3) = 0.90856, 4], ε = (3e-4, 4e-4):
    # row 0 (A=+1): clipped to 1.0004 → -1.0004        row 1 (A=-1): max(0.5, 0.9997) = 0.9997
    # row 2 (A=+.5): max(-0.4542801, -0.49985) = -0.4542801   row 3 (A=-.5): max(2, 0.5002) = 2
    # seq-mean-token-mean = (-1.0004 + 0.9997 - 0.4542801 + 2) / 4; every token of rows 0, 1
    # is clipped: high 2/7 (row 0), low 1/7 (row 1).
    s = LossSettings(ratio_level="sequence", eps_low=3e-4, eps_high=4e-4,
                     loss_agg="seq-mean-token-mean")
    loss, m, _ = toy(s)
    row2 = -0.5 * 0.75 ** (1 / 3)
    # The sequence ratio's mean of logs adds ≤ 3 roundings to OBJECTIVE_ROUNDINGS.
    close(loss, (-1.0004 + 0.9997 + row2 + 2.0) / 4, OBJECTIVE_ROUNDINGS + 3,
          scale=(1.0004 + 0.9997 - row2 + 2.0) / 4)
    close(m["actor/clip_frac_high"], 2 / 7, 1)
    close(m["actor/clip_frac_low"], 1 / 7, 1)


def test_kl_and_is_weight_in_objective():
    # On-policy ratios (old = logp): pg per token = -A. Row 1 is stale with
    # log(π_old/π_behav) = ln 3 → w = min(3, 2) = 2. Two rows only: row 0 (A=+1, 2 tokens),
    # row 1 (A=-0.5, 1 token). pg = [-1, -1 | 0.5·2 = 1] → token-mean -1/3.
    # KL k3 with δ = ln 2 on every token = 0.1931472; loss = -1/3 + 0.1 · 0.1931472.
    mask = jnp.array([[True, True], [True, False]])
    logp = jnp.array([[-1.0, -2.0], [-3.0, NAN]])
    behav = logp - jnp.log(3.0)
    ref = logp - jnp.log(2.0)
    s = LossSettings(beta=0.1, kl_estimator="k3", loss_agg="token-mean", is_cap=2.0)
    loss, m, e = compiled(objective, s=s)(logp, jnp.ones((2, 2)), logp, behav, ref,
                                          jnp.array([1.0, -0.5]), mask,
                                          jnp.array([False, True]), agg.global_counts(mask))
    close(m["actor/pg_loss"], -1 / 3, 1)  # ratio exp(0) = 1 and w = 2 exact: one division
    # k3 as in test_kl_estimators (EXP + 4 roundings at scale 1/2 + 1 + ln 2), plus δ's own
    # error: the backend's log(2) (LOG·u) and ref = logp - log(2) rounding at |ref| ≤ 3.7 (δ =
    # logp - ref is then exact, Sterbenz), passed on with dk3/dδ = 1 - e^{-δ} = 1/2.
    ln2 = float(np.log(2.0))
    kl, kl_tol = 0.5 - 1 + ln2, U * ((EXP + 4) * (1.5 + ln2) + 0.5 * (3.7 + LOG))
    np.testing.assert_allclose(float(m["actor/kl"]), kl, rtol=0, atol=kl_tol)
    np.testing.assert_allclose(float(loss), -1 / 3 + 0.1 * kl, rtol=0,
                               atol=U * (1 / 3 + 0.4) + 0.1 * kl_tol)  # + β·kl, one add
    close(m["actor/is_weight_mean"], 4 / 3, 1)  # w = 1, 1, 2 exactly: one division
    assert float(e["actor/is_weight_max"]) == 2.0


def test_on_policy_ratio_exactly_one_and_gradient():
    # old = sg(logp): the ratio is exp(0) = 1 exactly, nothing clips, and the token-mean
    # gradient wrt logp is the REINFORCE one, -A m / N.
    logp = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)

    def f(lp):
        s = LossSettings(eps_low=0.2, eps_high=0.28, loss_agg="token-mean")
        return objective(lp, lp, jax.lax.stop_gradient(lp), lp, None, ADV, MASK, jnp.zeros(4, bool),
                         agg.global_counts(MASK), s)

    (loss, (m, e)), g = jax.jit(jax.value_and_grad(lambda lp: (f(lp)[0], f(lp)[1:]),
                                                   has_aux=True))(logp)
    assert float(e["actor/ratio_max"]) == 1.0 and float(e["actor/ratio_min"]) == 1.0
    assert float(m["actor/clip_frac_low"]) == 0.0 and float(m["actor/clip_frac_high"]) == 0.0
    expected = np.where(np.asarray(MASK), -np.asarray(ADV)[:, None] / 7, 0.0)
    close(g, expected, 2)  # -A · 1 / 7: a division and a product


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_masked_positions_cannot_poison_gradients(estimator):
    # A trained model can give a prompt/pad position log π = -200; e^{200} overflows in f32,
    # and inf · (zero cotangent) would be NaN. Masked entries must not reach the arithmetic.
    mask = jnp.array([[False, True, True]])
    logp = jnp.array([[-200.0, -1.0, -2.0]])

    def loss(lp):
        s = LossSettings(beta=0.1, kl_estimator=estimator, loss_agg="token-mean")
        return objective(lp, jnp.zeros((1, 3)), jax.lax.stop_gradient(lp), lp, jnp.zeros((1, 3)),
                         jnp.array([1.0]), mask, jnp.zeros(1, bool), agg.global_counts(mask),
                         s)[0]

    g = np.asarray(jax.jit(jax.grad(loss))(logp))
    assert np.isfinite(g).all() and g[0, 0] == 0.0
