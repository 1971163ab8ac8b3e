"""Long-tailed per-row length caps (`locojax/rollout/lengths.py`, a benchmark's workload)."""

import numpy as np

from locojax.rollout.lengths import tail_limits, tail_quantile


def test_a_rows_cap_depends_on_its_group_alone():
    whole = tail_limits(0, 8, 4, 16, 1.0, 256)
    assert whole.shape == (32,) and whole.dtype == np.int32
    # A lease of groups 2..5 draws what the whole step draws for them: any worker, any split.
    np.testing.assert_array_equal(tail_limits(2, 4, 4, 16, 1.0, 256), whole[8:24])
    assert 1 <= whole.min() and whole.max() <= 256
    assert not np.array_equal(whole[:4], whole[4:8])  # groups differ


def test_the_caps_are_the_lognormal_clipped():
    caps = tail_limits(0, 2000, 8, 16, 1.0, 64)
    assert caps.max() == 64 and caps.min() >= 1  # clipped at N, at least one token
    # 16000 draws: the sample median's standard error is ~1.25 σ / √n ≈ 1% of z's scale, so
    # the median of ceil(16 e^z) is within ceil(16 e^±0.04) ⊂ [16, 18] with margin.
    assert 16 <= np.median(caps) <= 18
    # P(cap = N) = P(16 e^z > 63) = P(z > 1.37) ≈ 0.085; its binomial sd at n = 16000 is 0.002.
    assert abs(np.mean(caps == 64) - 0.085) < 0.01
    assert tail_quantile(16, 1.0, 0.5) == 16.0
    assert 16 * np.e ** 2.3 < tail_quantile(16, 1.0, 0.99) < 16 * np.e ** 2.35  # z_.99 = 2.326
