"""Advantage estimators against hand-computed numbers on a two-group toy batch.

The toy batch interleaves its groups (ids 0,1,0,1,...) so grouping must be by id, not by
position. Group 0 rewards are [1, 0, 0, 0]; group 1 rewards are [3, 1, 1, 1].

Bounds: sums of these small integers, their means (/4, /8) and the stds (1/2, 1) are exact
in f32, so a result is off by its last one or two roundings (u = 6e-8) unless noted.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from locojax.rl import advantages as adv
from locojax.rl.algorithms import ALGORITHMS, compute_advantages, resolve
from locojax.rl.config import AlgoConfig

pytestmark = pytest.mark.accelerator  # numbers that depend on the backend (docs/tpu.md)

GROUP_ID = jnp.array([0, 1, 0, 1, 0, 1, 0, 1])
REWARDS = jnp.array([1.0, 3.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])


def interleave(g0, g1):
    return np.ravel(np.column_stack([g0, g1]))


def test_grpo_group_mean_and_unbiased_std():
    # g0: mean 1/4; squared deviations 9/16 + 3·1/16 = 12/16; unbiased var (12/16)/3 = 1/4,
    #     std 1/2 → advantages (3/4)/(1/2) = 1.5 and (-1/4)/(1/2) = -0.5.
    # g1: mean 6/4 = 1.5; deviations 1.5, -0.5 ×3; var (2.25 + 0.75)/3 = 1, std 1 → 1.5, -0.5.
    a, m = adv.grpo(REWARDS, GROUP_ID, eps=1e-6)
    expected = interleave([1.5, -0.5, -0.5, -0.5], [1.5, -0.5, -0.5, -0.5])
    # ε = 1e-6 in the denominator moves the exact values by ε/std ≤ 2e-6, plus 2 roundings.
    np.testing.assert_allclose(np.asarray(a), expected, rtol=2e-6 + 2 * 2 ** -24)
    assert float(m["rollout/frac_zero_std"]) == 0.0


def test_dr_grpo_only_centres():
    # Dr.GRPO: r - mean. g0: 1 - 1/4 = 0.75, 0 - 1/4 = -0.25; g1: 3 - 1.5 = 1.5, 1 - 1.5 = -0.5.
    a, _ = adv.grpo(REWARDS, GROUP_ID, scale_by_std=False)
    np.testing.assert_allclose(np.asarray(a), interleave([0.75, -0.25, -0.25, -0.25],
                                                         [1.5, -0.5, -0.5, -0.5]),
                               rtol=2 ** -24)  # r - mean is exact in binary; 1 ulp for the /4


def test_rloo_leave_one_out():
    # g0: row with 1 → 1 - mean(0,0,0) = 1; a 0 → 0 - mean(1,0,0) = -1/3.
    # g1: row with 3 → 3 - mean(1,1,1) = 2; a 1 → 1 - mean(3,1,1) = 1 - 5/3 = -2/3.
    a, _ = adv.rloo(REWARDS, GROUP_ID)
    # (total - r) / 3 rounds once; r - 5/3 = -2/3 cancels it by 2.5x, then rounds: ≤ 4u.
    np.testing.assert_allclose(np.asarray(a), interleave([1, -1 / 3, -1 / 3, -1 / 3],
                                                         [2, -2 / 3, -2 / 3, -2 / 3]),
                               rtol=4 * 2 ** -24)


def test_reinforce_batch_baseline():
    # mean over all 8 rows = (1+3+0+1+0+1+0+1)/8 = 7/8; advantage r - 7/8.
    a, _ = adv.batch_baseline(REWARDS, GROUP_ID)
    np.testing.assert_allclose(np.asarray(a), np.asarray(REWARDS) - 0.875, rtol=2 ** -24)  # exact; 1 ulp


def test_zero_std_groups_get_exact_zero_and_are_counted():
    # Three groups: {0: [1, 0]}, {1: [0.1, 0.1, 0.1]} (constant: its float mean is not exactly
    # 0.1), {2: [5]} (a singleton is constant too). 2 of 3 groups have zero std.
    gid = jnp.array([1, 0, 1, 2, 0, 1])
    r = jnp.array([0.1, 1.0, 0.1, 5.0, 0.0, 0.1])
    for fn in (adv.grpo, adv.rloo):
        a, m = fn(r, gid)
        a = np.asarray(a)
        assert (a[[0, 2, 3, 5]] == 0.0).all(), (fn.__name__, a)
        assert a[1] > 0 > a[4]
        # Σ of 1/count over 6 rows (thirds, halves): ≤ 8 roundings in the two sums, a division.
        np.testing.assert_allclose(float(m["rollout/frac_zero_std"]), 2 / 3, rtol=9 * 2 ** -24)


def test_registry_maps_names_to_estimators():
    # Same toy batch; each algorithm's default estimator, by the numbers above.
    grpo_like = interleave([1.5, -0.5, -0.5, -0.5], [1.5, -0.5, -0.5, -0.5])
    expected = {
        "grpo": grpo_like, "dapo": grpo_like, "gspo": grpo_like,
        "dr_grpo": interleave([0.75, -0.25, -0.25, -0.25], [1.5, -0.5, -0.5, -0.5]),
        "rloo": interleave([1, -1 / 3, -1 / 3, -1 / 3], [2, -2 / 3, -2 / 3, -2 / 3]),
        "reinforce": np.asarray(REWARDS) - 0.875,
    }
    assert set(expected) == set(ALGORITHMS)
    for name, want in expected.items():
        a, _ = compute_advantages(AlgoConfig(name=name, max_response_len=8), REWARDS, GROUP_ID)
        np.testing.assert_allclose(np.asarray(a), want, rtol=2e-6 + 4 * 2 ** -24, err_msg=name)


def test_resolve_defaults_and_overrides():
    _, s = resolve(AlgoConfig(name="dapo"))
    assert (s.eps_low, s.eps_high, s.loss_agg, s.ratio_level) == (0.2, 0.28, "token-mean", "token")
    _, s = resolve(AlgoConfig(name="gspo"))
    assert (s.eps_low, s.eps_high, s.ratio_level) == (3e-4, 4e-4, "sequence")
    _, s = resolve(AlgoConfig(name="dapo", eps_high=0.3, loss_agg="seq-mean-token-sum"))
    assert (s.eps_high, s.loss_agg) == (0.3, "seq-mean-token-sum")
    # Overriding scale_by_std turns GRPO into a centred-only estimator.
    fn, _ = resolve(AlgoConfig(name="grpo", scale_by_std=False))
    np.testing.assert_allclose(np.asarray(fn(REWARDS, GROUP_ID)[0])[:2], [0.75, 1.5],
                               rtol=2 ** -24)  # as in test_dr_grpo_only_centres


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="unknown algorithm 'ppo2'"):
        resolve(AlgoConfig(name="ppo2"))
    with pytest.raises(ValueError, match="max_response_len"):
        resolve(AlgoConfig(name="dr_grpo"))
    with pytest.raises(ValueError, match="loss_agg"):
        AlgoConfig(loss_agg="mean")
    with pytest.raises(ValueError, match="dual_clip"):
        AlgoConfig(dual_clip=0.5)
