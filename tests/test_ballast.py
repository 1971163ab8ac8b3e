"""benchmarks/tpu/ballast.py: the plan's peak judged by the ballast a step survives.

No CPU device has a byte limit, so a fake device gives one and a fake step runs out of
memory when the ballast leaves it less than its true peak; the three verdicts (the plan
low, more than 10% high, within 10%) and the order of the two checks are what is tested.
"""

import jax
import pytest

from benchmarks.tpu import ballast

LIMIT = 1000


class Device:
    def memory_stats(self):
        return {"bytes_limit": LIMIT}


def _run(monkeypatch, true_peak: int, plan_peak: int) -> tuple[str, list[int]]:
    held = []
    monkeypatch.setattr(ballast, "hold", lambda n: held.append(n) or [])

    def step():  # runs out when the ballast leaves less than the step's true peak
        if LIMIT - held[-1] < true_peak:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in hbm")

    return ballast.check(step, plan_peak, Device()), held


def test_a_plan_within_ten_percent(monkeypatch):
    verdict, held = _run(monkeypatch, true_peak=760, plan_peak=800)
    assert "within 10%" in verdict and held == [200, 280]  # free 800 runs, free 720 does not


def test_a_plan_more_than_ten_percent_high(monkeypatch):
    verdict, held = _run(monkeypatch, true_peak=600, plan_peak=800)
    assert "more than 10% high" in verdict and held == [200, 280]


def test_a_low_plan_stops_before_the_tight_check(monkeypatch):
    verdict, held = _run(monkeypatch, true_peak=850, plan_peak=800)
    assert "LOW" in verdict and held == [200]  # a failed step may have lost the run's buffers


def test_other_errors_are_not_an_answer(monkeypatch):
    monkeypatch.setattr(ballast, "hold", lambda n: [])

    def step():
        raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        ballast.check(step, 800, Device())


def test_a_device_without_a_limit_has_nothing_to_check():
    class Cpu:
        def memory_stats(self):
            return None

    assert "nothing to check" in ballast.check(lambda: None, 800, Cpu())
