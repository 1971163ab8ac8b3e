"""The env work of hosts that share one machine (`phases.env_seconds`): every host's env
processes share its cores, against the formula, and the hosts' own formula where they do
not share one (a cluster's profile, or cpu-here without `shared_cores`).

The rates are made up for the test (not this machine's): every expected value is derived
from them by the formula in the docstring, so the checks hold on any CPU; the tolerance is
float rounding only.
"""

import dataclasses

import pytest

from locojax.model import config as model_config
from locojax.predict import hardware, modes, phases
from locojax.predict.phases import Ctx
from locojax.predict.workload import Lengths, Workload


def _profile(shared: bool = True) -> hardware.Hardware:
    hw = hardware.load("cpu-here")
    extra = {k: v for k, v in hw.extra.items() if k != "shared_cores"}
    if shared:
        extra["shared_cores"] = 2
    return dataclasses.replace(hw, extra=extra)


def _ctx(hw, chips: int, turns: int = 1, tool_s: float = 0.0) -> Ctx:
    wl = Workload("w", 8, 4, 32, 16, Lengths.fixed(16, "test"), turns=turns, obs_tokens=8,
                  tool_s=tool_s)
    return Ctx(model_config.tiny(), "tiny", wl, hardware.Cluster(hw, chips), dtype="float32",
               env_workers=4)


def test_env_where_the_hosts_do_not_share_a_machine_is_their_own_workers():
    """Without `shared_cores` a host's env runs on its own cores, its workers at most its
    cores: a TPU profile's env is its own hosts' formula."""
    tpu = hardware.parse_cluster("v5e-16")
    wl = _ctx(_profile(shared=False), 1, turns=2, tool_s=0.1).wl
    ctx = Ctx(model_config.tiny(), "tiny", wl, tpu, env_workers=4)
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
    assert phases.env_seconds(0.1, 10, 1, 4, 0.5, 2) == pytest.approx(0.2 * 10 / 0.5)
    # No more than one core a worker: 8 cores for 4 workers run as 4.
    assert phases.env_seconds(0.1, 10, 2, 4, 8, 2) == pytest.approx(0.2 * 20 / 4)
