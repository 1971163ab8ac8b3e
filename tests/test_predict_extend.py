"""An env turn's extend (the prefill of the observation tokens written after it) costs what
the cost model charges a prefill of those tokens, tensor-parallel traffic included
(`phases.Ctx.extend` against `Ctx.prefill`, two code paths of one program kind)."""

import pytest

from locojax.model import config
from locojax.predict import hardware, phases
from locojax.predict.workload import Lengths, Workload


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_an_extend_costs_a_prefill_of_its_observation(tp):
    """The same sums in the same order on both sides: equal up to f64 rounding (rel 1e-12)."""
    turns, obs = 3, 24
    multi = Workload("w", 8, 4, 32, 16, Lengths.fixed(16, "test"), turns=turns, obs_tokens=obs)
    prompt = Workload("p", 8, 4, obs, 16, Lengths.fixed(16, "test"))  # a prompt of obs tokens
    cluster = hardware.parse_cluster("v5e-8")
    ctx, ref = (phases.Ctx(config.tiny(), "tiny", wl, cluster, tp=tp) for wl in (multi, prompt))
    rows = multi.rows  # the rows that extend: each row's observation is a prompt of obs tokens
    want = (turns - 1) * ref.prefill(rows, 8)
    assert ctx.extend(rows, 8) == pytest.approx(want, rel=1e-12)
    assert (ref.tp_comm(rows / (8 / tp) * obs, tp) > 0) == (tp > 1)  # the traffic is there
