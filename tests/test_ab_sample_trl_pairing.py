"""ab_sample_trl's comparison: paired over the rows both sides scored, refused otherwise."""

import math

import pytest

from benchmarks.ab_sample_trl import paired, report


def test_the_difference_is_paired_over_rows():
    a = {"r0": 0.5, "r1": 0.25, "r2": 1.0}
    b = {"r0": 0.25, "r1": 0.25, "r2": 0.5}
    d, se = paired(a, b)  # differences 0.25, 0, 0.5: mean 0.25, sample std 0.25
    # Dyadic inputs: every sum and product below is exact but the square root's rounding.
    assert d == 0.25 and se == pytest.approx(0.25 / math.sqrt(3), rel=1e-15)


def test_sides_that_scored_different_rows_are_refused():
    with pytest.raises(ValueError, match="different rows .*first \\['r2'\\]"):
        paired({"r0": 0.0, "r1": 1.0}, {"r0": 0.0, "r1": 1.0, "r2": 1.0})


def test_the_report_reads_each_quantity_of_both_sides():
    rows = {"locojax": {"r0": {"rewards": [1, 0], "lengths": [4, 8], "truncated": [0, 1]},
                        "r1": {"rewards": [0, 0], "lengths": [2, 2], "truncated": [0, 0]}},
            "trl": {"r0": {"rewards": [0, 0], "lengths": [4, 4], "truncated": [0, 0]},
                    "r1": {"rewards": [0, 0], "lengths": [2, 2], "truncated": [0, 0]}}}
    lines = report(rows)
    reward = next(line for line in lines if line.startswith("| reward"))
    assert [c.strip() for c in reward.strip("|").split("|")][:4] == [
        "reward", "0.2500", "0.0000", "+0.2500"]
