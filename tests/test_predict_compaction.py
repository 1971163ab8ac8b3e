"""The decode loop's compaction waves as the cost model follows them
(locojax/predict/compaction.py), against the engine's own rule (`Decoding.advance`)."""

import numpy as np

from locojax.predict import compaction
from locojax.predict.compaction import Wave
from locojax.predict.workload import Lengths


def test_min_rows_is_the_engines():
    from locojax.engine import engine

    assert compaction.MIN_ROWS == engine.MIN_ROWS


def test_fixed_lengths_are_one_wave():
    # --rollout.ignore-eos: every row ends at N together, nothing is compacted
    assert compaction.waves(Lengths.fixed(48, "t"), 64, 47) == [Wave(64, 47)]


def test_no_halving_below_twice_min_rows():
    spread = Lengths.from_samples(np.arange(1, 65), "t")
    assert compaction.waves(spread, 12, 63) == [Wave(12, 63)]
    assert compaction.waves(spread, 64, 63, min_rows=None) == [Wave(64, 63)]


def test_waves_halve_at_the_quantiles_down_to_min_rows():
    """Lengths 1..64 evenly, 32 rows a device: half the rows are done after length 32, so the
    32-row batch runs to about iteration 31 and halves; 16 rows then run until a quarter
    of the 32 are live (length 48) and halve to 8, which runs to the end."""
    spread = Lengths.from_samples(np.arange(1, 65), "t")
    got = compaction.waves(spread, 32, 63)
    assert [w.rows for w in got] == [32, 16, 8]
    # the quantile grid has 512 points over 64 lengths: an exit is within one iteration
    assert abs(got[0].iterations - 31) <= 1 and abs(got[1].iterations - 16) <= 1
    assert sum(w.iterations for w in got) == 63


def test_a_long_tail_spends_most_iterations_in_small_waves():
    tail = Lengths.lognormal(100, 1.0, 1024, "t")
    got = compaction.waves(tail, 128, tail.expected_max(128) - 1)
    assert got[0].rows == 128 and got[-1].rows == 8
    small = sum(w.iterations for w in got if w.rows <= 16)
    assert small > 0.5 * sum(w.iterations for w in got)
