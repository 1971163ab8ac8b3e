"""The terms of a profile whose simulated hosts share one machine
(locojax/predict/shared_machine.py), each against its formula, and their absence where the
hosts do not share one (a cluster's profile, or cpu-here without `shared_cores`).

The tables here are made up for the test (not this machine's): every expected value is
derived from them by the formula in the module docstring, so the checks hold on any CPU;
the tolerance is float rounding only.
"""

import dataclasses

import pytest

from locojax.model import config as model_config
from locojax.predict import hardware, modes, shared_machine
from locojax.predict.origin import Const, Ledger
from locojax.predict.phases import Ctx
from locojax.predict.workload import Lengths, Workload

TERMS = ("shared_cores", "oversubscription", "multi_device_iteration_s")


def _m(v: float) -> Const:
    return Const(v, "x", "measured", "made up for the test")


OVER = {"2": _m(1.1), "4": _m(1.6), "8": _m(2.0)}
LOOP = {"1": _m(1e-5), "2": _m(3e-4), "4": _m(7e-4)}


def _profile(shared: bool = True, **tables) -> hardware.Hardware:
    hw = hardware.load("cpu-here")
    extra = {k: v for k, v in hw.extra.items() if k not in TERMS}
    if shared:
        extra["shared_cores"] = 2
    extra.update(tables)
    return dataclasses.replace(hw, extra=extra)


def _ctx(hw, chips: int, turns: int = 1, tool_s: float = 0.0) -> Ctx:
    wl = Workload("w", 8, 4, 32, 16, Lengths.fixed(16, "test"), turns=turns, obs_tokens=8,
                  tool_s=tool_s)
    return Ctx(model_config.tiny(), "tiny", wl, hardware.Cluster(hw, chips), dtype="float32",
               env_workers=4)


def test_oversubscription_is_one_for_one_process_then_linear_then_held():
    hw, led = _profile(oversubscription=OVER), Ledger()
    rho = lambda k: shared_machine.oversubscription(hw, led, k)
    assert rho(1) == 1.0  # one process alone: the reference
    assert rho(1.5) == pytest.approx(1.05)  # halfway from (1, 1) to (2, 1.1)
    assert rho(2) == pytest.approx(1.1)  # two processes, one a core: measured, not 1
    assert rho(3) == pytest.approx(1.35)  # halfway from (2, 1.1) to (4, 1.6)
    assert rho(4) == pytest.approx(1.6)
    assert rho(6) == pytest.approx(1.8)
    assert rho(16) == pytest.approx(2.0)  # beyond the largest measured k: held
    assert "cpu-here.oversubscription.4" in led.used  # the constant is listed with its origin


def test_loop_iteration_extra_is_the_meeting_beyond_one_device():
    hw, led = _profile(multi_device_iteration_s=LOOP), Ledger()
    extra = lambda n: shared_machine.loop_iteration_extra(hw, led, n)
    assert extra(1) == 0.0
    assert extra(2) == pytest.approx(3e-4 - 1e-5)
    assert extra(3) == pytest.approx(5e-4 - 1e-5)
    assert extra(8) == pytest.approx(7e-4 - 1e-5)


def test_loop_iteration_extra_may_be_a_gain():
    """Two device threads on two cores can beat one device's loop (the idle core): the
    measured gain is kept, not clipped to 0."""
    hw = _profile(multi_device_iteration_s={"1": _m(8e-4), "2": _m(6e-4), "4": _m(3e-3)})
    extra = lambda n: shared_machine.loop_iteration_extra(hw, Ledger(), n)
    assert extra(2) == pytest.approx(-2e-4)
    assert extra(3) == pytest.approx((6e-4 + 3e-3) / 2 - 8e-4)  # linear between 2 and 4


def test_no_machine_term_where_the_hosts_do_not_share_a_machine():
    """The tables are read only under `shared_cores`: without it every prediction is the one
    without the tables, and a TPU profile's env is its own hosts' formula."""
    hw = _profile(shared=False, oversubscription=OVER, multi_device_iteration_s=LOOP)
    assert shared_machine.oversubscription(hw, Ledger(), 8) == 1.0
    assert shared_machine.loop_iteration_extra(hw, Ledger(), 4) == 0.0
    bare = _profile(shared=False)
    for mode in (modes.colocated, modes.controller):
        with_tables = mode(_ctx(hw, 4, turns=2, tool_s=0.1))
        without = mode(_ctx(bare, 4, turns=2, tool_s=0.1))
        assert with_tables.phases == without.phases
    tpu = hardware.parse_cluster("v5e-16")
    ctx = Ctx(model_config.tiny(), "tiny", _ctx(bare, 1, turns=2, tool_s=0.1).wl, tpu,
              env_workers=4)
    workers = min(4, float(tpu.hw.host_cores.value))
    assert ctx.env(32) == pytest.approx(0.1 * 32 / workers / float(tpu.hw.host_core_speed))


@pytest.mark.parametrize("hosts", [1, 2, 4])
def test_env_on_shared_cores_is_the_machines_throughput(hosts):
    """Every host's env processes share the 2 cores: the env phase of H hosts at once takes
    the machine's time for all rows, whatever H (the rate is measured with the machine)."""
    ctx = _ctx(_profile(), hosts, turns=2, tool_s=0.1)
    expected = 0.1 * ctx.wl.rows / float(ctx.cluster.hw.host_core_speed)
    assert modes.colocated(ctx).phases["env"] == pytest.approx(expected)
    assert modes.single(ctx).phases["env"] == pytest.approx(expected)


def test_env_seconds_counts_core_seconds_over_the_cores_the_processes_get():
    # Measured with 2 cores and 4 workers: 0.1 s a row is 0.2 core-seconds a row.
    assert shared_machine.env_seconds(0.1, 10, 1, 4, 0.5, 2) == pytest.approx(0.2 * 10 / 0.5)
    # No more than one core a worker: 8 cores for 4 workers run as 4.
    assert shared_machine.env_seconds(0.1, 10, 2, 4, 8, 2) == pytest.approx(0.2 * 20 / 4)


def test_penalty_applies_to_processes_not_to_devices_of_one_process():
    """Colocated's 4 hosts are 4 processes on 2 cores: device phases times ρ(4); its 2 hosts
    are one a core, and still pay ρ(2), their contention for the memory system. Single's 4
    devices are threads of one process: no penalty, but each decode iteration pays the
    devices' meeting, i(4) - i(1)."""
    plain, penal = _profile(), _profile(oversubscription=OVER, multi_device_iteration_s=LOOP)
    for chips, rho in ((4, 1.6), (2, 1.1)):  # 2 hosts on 2 cores: one a core, still ρ(2)
        co0, co1 = modes.colocated(_ctx(plain, chips)), modes.colocated(_ctx(penal, chips))
        for phase in ("prefill", "decode", "train"):
            assert co1.phases[phase] == pytest.approx(rho * co0.phases[phase])
    ctx = _ctx(penal, 4)
    s0, s1 = modes.single(_ctx(plain, 4)), modes.single(ctx)
    assert s1.phases["train"] == pytest.approx(s0.phases["train"])
    steps = ctx.wl.decode_steps(ctx.wl.rows)
    assert s1.phases["decode"] - s0.phases["decode"] == pytest.approx(steps * (7e-4 - 1e-5))
