"""`locojax predict train ... --measure` (locojax/predict/measure.py, measure_child.py): the
run's own programs timed here. No assertion on a time: only that the programs are the
run's, that the slowest host and the median are taken, and that bad requests are refused
by name."""

from __future__ import annotations

import threading

import pytest

from locojax.predict import measure, measure_child
from locojax.predict.modes import Prediction
from locojax.predict.workload import Lengths

TINY = ["demo", "--mode", "single", "--model", "tiny", "--rollout.prompts-per-step", "4",
        "--algo.group-size", "2", "--rollout.max-prompt-tokens", "8",
        "--rollout.max-new-tokens", "4", "--rollout.ignore-eos", "--eval.every", "0"]


def test_host_argv_takes_the_hosts_share_and_writes_no_run_dir():
    argv = ["demo", "--rollout.prompts-per-step", "8", "--run-dir", "/x", "--steps=3",
            "--run-dir=/y", "--rollout.prompts-per-step=8"]
    assert measure.host_argv(argv, 2) == ["demo", "--steps=3", "--rollout.prompts-per-step",
                                          "2"]


def test_limits_none_when_every_row_runs_to_n():
    ctx = type("C", (), {})()
    ctx.wl = type("W", (), {"completion": Lengths.fixed(16, "t"), "max_new": 16})()
    assert measure.limits_of(ctx, 8) is None


def test_limits_drawn_from_the_lengths_within_one_and_n():
    ctx = type("C", (), {})()
    ctx.wl = type("W", (), {"completion": Lengths.lognormal(10, 1.0, 32, "t"),
                            "max_new": 32})()
    got = measure.limits_of(ctx, 64)
    assert len(got) == 64 and min(got) >= 1 and max(got) <= 32
    assert len(set(got)) > 1  # a distribution, so the engine compacts in waves
    assert got == measure.limits_of(ctx, 64)  # seeded: the same rows every time


def test_slowest_host_per_repetition_then_the_median():
    a = {"times": {"prefill": [1, 5, 1], "decode": [2, 2, 2], "train": [3, 1, 9]}}
    b = {"times": {"prefill": [2, 1, 2], "decode": [1, 4, 1], "train": [1, 2, 1]}}
    # prefill: max per rep 2, 5, 2 -> 2; decode: 2, 4, 2 -> 2; train: 3, 2, 9 -> 3
    assert measure.slowest([a, b]) == {"prefill": 2, "decode": 2, "train": 3}


def test_apply_replaces_device_phases_and_keeps_host_ones():
    pred = Prediction("single", "x", {"prefill": 1.0, "decode": 2.0, "tp_comm": 0.5,
                                      "extend": 0.1, "train": 3.0, "batch": 0.25})
    got = measure.apply(pred, {"prefill": 0.1, "decode": 0.2, "train": 0.3})
    assert got.phases == {"prefill": 0.1, "decode": 0.2, "train": 0.3, "batch": 0.25}
    assert got.mode == "single" and any("--measure" in n for n in got.notes)


def test_measure_refuses_a_mode_it_cannot_build_here():
    with pytest.raises(ValueError, match="not 'controller'"):
        measure.measure("controller", TINY, 2, 4, 2)


def test_measure_refuses_prompts_that_do_not_split_over_hosts():
    with pytest.raises(ValueError, match="5 prompts per step do not split over 2 hosts"):
        measure.measure("colocated", TINY, 2, 5, 2)


def test_meet_waits_for_every_host(tmp_path):
    seen = []
    t = threading.Thread(target=lambda: (measure_child._meet(str(tmp_path), "r0", 1, 2),
                                         seen.append(1)))
    t.start()
    measure_child._meet(str(tmp_path), "r0", 0, 2)
    t.join(timeout=30)
    assert seen == [1]


def test_meet_names_the_host_that_waited_too_long(tmp_path):
    with pytest.raises(TimeoutError, match="host 0 waited"):
        measure_child._meet(str(tmp_path), "r0", 0, 2, timeout=0.05)


def test_cli_refuses_measure_for_a_ray_mode(capsys):
    from locojax.commands import predict

    code = predict.main(["train", "demo", "--mode", "async", "--model", "tiny", "--measure"])
    assert code == 2
    assert "--mode async is predicted by the model only" in capsys.readouterr().err


@pytest.mark.slow
def test_measure_times_the_runs_own_programs():
    """A tiny single run, its rows ending at 2 or 4 tokens (a wave compacted out): the three
    device phases come back from the child, each a positive time."""
    got = measure.measure("single", TINY, 1, 4, 2, limits=[2, 4] * 4, reps=1)
    assert set(got) == set(measure.DEVICE_PHASES)
    assert all(v > 0 for v in got.values())


@pytest.mark.slow
def test_measure_reports_a_run_that_cannot_be_built():
    with pytest.raises(RuntimeError, match="could not be built or run here"):
        measure.measure("single", [*TINY, "--model", "no-such-model"], 1, 4, 2, reps=1)
