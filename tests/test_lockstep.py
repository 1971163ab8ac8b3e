"""Meetings of device threads and hosts that share the cores (`calibrate_lockstep.py`), as
`benchmarks.predict_programs compiled` prices them (`KernelModel.meeting`, `priced.phases`, `priced.meetings`):
the fit and the terms on made-up numbers, and the probe itself, run."""

import pytest

from benchmarks import calibrate_joined, calibrate_lockstep, priced
from locojax.predict.modes import Prediction
from benchmarks.kernel_model import KernelModel
from tests.test_kernel_model import _model

TABLE = {"2": {"a": 1e-3, "b": 0.1}, "4": {"a": 3e-3, "b": 0.3}}


def _with(lockstep: dict) -> KernelModel:
    m = _model()
    return KernelModel(m.prices, m.weights, m.cores, lockstep)


def test_the_fit_recovers_the_cost_and_the_lateness_that_made_the_times():
    """Times made as reference x (1 + b) + a are a line in the reference: least squares
    through three points of it returns a and b up to rounding."""
    ref = [1e-4, 1e-3, 2e-2]
    got = calibrate_lockstep.fit(ref, [r * 1.25 + 4e-4 for r in ref])
    assert got["a"] == pytest.approx(4e-4, rel=1e-6) and got["b"] == pytest.approx(0.25, rel=1e-6)


def test_a_lateness_the_scatter_cannot_tell_from_zero_is_dropped():
    """Two repeats a size, scattered by up to 1.5 ms: the least-squares slope is 0.0101 with
    a standard error of 0.0107 (under `RESOLVED` of them from zero), so b = 0 and a is the
    mean excess, 0.2 ms + the mean scatter; the same points 100 times less scattered keep
    their slope of 0.25 (its standard error 100 times smaller)."""
    ref = [1e-4, 1e-4, 1e-3, 1e-3, 5e-2, 5e-2]
    scatter = [0.0, 1e-3, 1e-3, 0.0, 5e-4, 1.5e-3]
    got = calibrate_lockstep.fit(ref, [r + 2e-4 + d for r, d in zip(ref, scatter)])
    assert got["b"] == 0.0 and got["b_se"] > 0.0101 / calibrate_lockstep.RESOLVED
    assert got["a"] == pytest.approx(2e-4 + sum(scatter) / 6, rel=1e-9)
    clean = [r * 1.25 + 2e-4 + d / 100 for r, d in zip(ref, scatter)]
    kept = calibrate_lockstep.fit(ref, clean)
    assert abs(kept["b"] - 0.25) < 2 * kept["b_se"] and kept["b_se"] < 1e-3


def test_a_meeting_is_free_for_one_unit_linear_between_counts_and_held_beyond():
    m = _with({"process_gather": TABLE})
    assert m.meeting("process_gather", 1, 5.0) == 0.0
    assert m.meeting("process_gather", 2, 0.01) == pytest.approx(1e-3 + 0.1 * 0.01)
    assert m.meeting("process_gather", 3, 0.01) == pytest.approx(2e-3 + 0.2 * 0.01)
    assert m.meeting("process_gather", 8, 0.01) == m.meeting("process_gather", 4, 0.01)
    assert m.meeting("process_psum", 4, 0.01) == 0.0  # not measured: no term


def test_a_meeting_never_makes_the_work_faster():
    """A noisy fit can have a < 0; a unit that waits is still not done sooner."""
    m = _with({"device_calls": {"2": {"a": -1e-3, "b": 0.0}}})
    assert m.meeting("device_calls", 2, 1e-3) == 0.0


def test_device_threads_wait_at_every_call_and_every_decode_iteration():
    one = {"call": 0, "launch": 0, "matmul": 1e-3, "elementwise": 0, "fill": 0}
    feats = {"train_step": one, "prefill rollout": one, "decode rollout once": one,
             "decode rollout iteration": one}
    m = _with({"device_calls": TABLE})
    alone = priced.phases(feats, m, iterations=10, cores=2.0)
    two = priced.phases(feats, m, iterations=10, cores=2.0, devices=2)
    wait = 1e-3 + 0.1 * 1e-3  # a + b x the call's 1 ms (all-core weights: matmul x 1)
    assert alone["train"] == pytest.approx(1e-3)
    assert two["train"] == pytest.approx(1e-3 + wait)
    assert two["decode"] == pytest.approx(11 * (1e-3 + wait))  # once + 10 iterations


def test_the_cache_buffer_joins_the_prefill_at_its_timed_price_and_the_hosts_share():
    """Its seconds (the tables' price of its kernels alone, on one core) times the penalty,
    over the share of a core below one, a device's wait after it as after any call."""
    one = {"call": 0, "launch": 0, "matmul": 1e-3, "elementwise": 0, "fill": 0}
    feats = {"prefill rollout": one, priced.CACHE: {"seconds": 2e-4}}
    m = _with({"device_calls": TABLE})
    base = priced.phases({"prefill rollout": one}, m, iterations=0, cores=0.5, penalty=1.2)
    got = priced.phases(feats, m, iterations=0, cores=0.5, penalty=1.2)
    assert got["prefill"] - base["prefill"] == pytest.approx(1.2 * 2e-4 / 0.5)
    two = priced.phases(feats, m, iterations=0, cores=1.0, devices=2)
    cache = 2e-4
    assert two["prefill"] == pytest.approx(
        2e-3 + m.meeting("device_calls", 2, 2e-3) + cache + m.meeting("device_calls", 2, cache))


def test_colocated_hosts_meet_after_the_rollout_and_at_the_metrics():
    """The two host-side all-gathers; the psum inside the train step is the joined update's
    (next test), not priced here too."""
    m = _with({"process_gather": TABLE, "process_psum": {"2": {"a": 5e-4, "b": 0.05}}})
    ph = {"prefill": 0.002, "decode": 0.006, "detokenize_reward": 0.002, "train": 0.01,
          "batch": 9.0}  # batch is after the meeting: not work before it
    got = priced.meetings(ph, m, 2)
    assert got == pytest.approx((1e-3 + 0.1 * 0.01) + 1e-3)


def test_a_joined_train_step_costs_its_part_per_update_and_per_gradient_byte():
    m = _with({"process_update": {"2": {"a": 7e-3, "b": 2e-9}, "4": {"a": 1.8e-2, "b": 5e-9}}})
    feats = {priced.GRADIENTS: {"bytes": 4e5}}
    assert priced.joined(feats, m, 2) == pytest.approx(7e-3 + 2e-9 * 4e5)
    assert priced.joined(feats, m, 3) == pytest.approx(1.25e-2 + 3.5e-9 * 4e5)
    assert priced.joined(feats, m, 1) == 0.0  # one host joins no one


def test_the_meetings_replace_the_small_collectives_or_a_note_says_they_are_missing():
    ph = {"decode": 0.006, "train": 0.01, "collectives": 0.002, "allreduce": 0.003}
    measured = _with({"process_gather": TABLE})
    got = priced.with_meetings(Prediction("colocated", "2 hosts", dict(ph)), measured, 2, True)
    assert "collectives" not in got.phases and "allreduce" not in got.phases
    assert got.phases["lockstep"] == pytest.approx(priced.meetings(ph, measured, 2))
    old = priced.with_meetings(Prediction("colocated", "2 hosts", dict(ph)), _with({}), 2, True)
    assert old.phases == ph and "predict_programs calibrate again" in old.notes[-1]
    one = priced.with_meetings(Prediction("single", "1", dict(ph)), _with({}), 1, False)
    assert one.phases == ph and not one.notes  # one unit: nothing meets


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_probe_measures_every_meeting_of_two_units():
    got = calibrate_lockstep.lockstep(counts=(2,))
    for kind in calibrate_lockstep.MEETINGS:
        ab = got[kind]["2"]
        assert set(ab) == {"a", "b", "b_se"} and all(isinstance(v, float) for v in ab.values())
    samples = got["samples"]["processes_2"]
    # three sizes of work, each timed REPEATS times: the meeting program's and the
    # side-by-side work's
    for k in ("free", "meet", "host"):
        assert set(samples[k]) == {str(r) for r in calibrate_lockstep.WORKS}
        assert all(len(t) == calibrate_lockstep.REPEATS and min(t) > 0
                   for t in samples[k].values())
    # the joined update: each probe decoder's gradient bytes, once a repeat
    update = got["samples"]["update_2"]
    points = len(calibrate_joined.DECODERS) * calibrate_joined.REPEATS
    assert len(update["bytes"]) == len(update["excess"]) == points
    assert len(set(update["bytes"])) == len(calibrate_joined.DECODERS)
