"""The host half of `locojax predict calibrate` (locojax/predict/calibrate_host.py): the
two-point line of each host phase, and the run's own functions it times. No assertion on
a time's size: only on the arithmetic of the line and that each function runs."""

import pytest

from locojax.predict import calibrate_host


def test_the_line_through_two_sizes_gives_the_fixed_part_and_the_rate():
    times = {16: 1e-3 + 16 * 1e-5, 256: 1e-3 + 256 * 1e-5}
    fixed, rate = calibrate_host._line(times.__getitem__)
    # Two f64 subtractions of numbers near 1e-3: relative error ~1e-13 at most.
    assert fixed == pytest.approx(1e-3, rel=1e-9)
    assert rate == pytest.approx(1e-5, rel=1e-9)


def test_a_slope_that_noise_made_negative_is_zero_and_the_fixed_part_the_small_time():
    times = {16: 2e-3, 256: 1e-3}
    assert calibrate_host._line(times.__getitem__) == (2e-3, 0.0)


def test_every_rate_is_timed_through_the_runs_functions():
    rates = calibrate_host.host_rates()
    assert set(rates) == {"admission_per_prompt", "reward_fixed", "reward_per_row.arith",
                          "batch_fixed", "batch_per_row", "step_fixed", "tensorboard_s"}
    assert all(v >= 0 for v in rates.values())
    assert rates["admission_per_prompt"] > 0 and rates["step_fixed"] > 0
