"""The one skeleton every bench_peers worker runs its steps in (`benchmarks/peers/common.py`).

`Driven` is what the locojax, TRL and Tunix workers share of the protocol (issue 60 item 2):
the warm-up block reported with `ready`, then each block the driver asks for, until it says
quit. Checked against a fake channel: the peers' workers need their venvs to run.
"""

from benchmarks.peers import common


class FakeChannel:
    def __init__(self, commands):
        self.sent, self.commands = [], list(commands)

    def send(self, **msg):
        self.sent.append(msg)

    def receive(self):
        return self.commands.pop(0)


def test_serve_reports_warm_up_then_each_block_until_quit():
    channel = FakeChannel([{"run": 3}, {"run": 1}, {"quit": True}])
    driven = common.Driven(channel, {"x": "1"}, t_setup=0.0, warmup=2, flops={"total": 1.0})
    steps = iter(range(100))
    common.serve(driven, lambda: {"step": next(steps)})
    ready, first, second = channel.sent
    assert ready["ready"] and ready["versions"] == {"x": "1"} and ready["flops"] == {"total": 1.0}
    assert [r["step"] for r in ready["warmup"]] == [0, 1] and ready["setup_s"] > 0
    assert [r["step"] for r in first["steps"]] == [2, 3, 4]
    assert [r["step"] for r in second["steps"]] == [5]
    assert next(steps) == 6  # no step run after quit


def test_a_step_driven_from_outside_stops_at_quit():
    """As TRL's callback and Tunix's iterator drive it: False once the driver said quit."""
    channel = FakeChannel([{"quit": True}])
    driven = common.Driven(channel, {}, t_setup=0.0, warmup=1)
    assert driven.end_step({"step": 0}) is False
    assert channel.sent[0]["warmup"] == [{"step": 0}]


def test_an_error_reaches_the_driver_named_then_propagates():
    """What every worker wraps its setup and its steps in (`Channel.reporting`)."""
    import pytest

    channel = FakeChannel([])
    with pytest.raises(RuntimeError, match="no chip"):
        with common.Channel.reporting(channel, "setup: "):
            raise RuntimeError("no chip")
    assert channel.sent == [{"error": "setup: RuntimeError: no chip"}]
    with common.Channel.reporting(channel):
        pass
    assert len(channel.sent) == 1  # nothing sent when nothing failed
