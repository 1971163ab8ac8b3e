"""`benchmarks.predict_programs measure` (benchmarks/measure.py, measure_child.py): the
run's own step timed here. No assertion on a time: only that the work is the run's, that
the slowest host's step and the median are taken, and that bad requests are refused by
name."""

from __future__ import annotations

import pytest

from benchmarks import measure
from locojax.predict.modes import Prediction
from locojax.predict.workload import Lengths

TINY = ["demo", "--mode", "single", "--model", "tiny", "--rollout.prompts-per-step", "4",
        "--algo.group-size", "2", "--rollout.max-prompt-tokens", "8",
        "--rollout.max-new-tokens", "4", "--rollout.ignore-eos", "--eval.every", "0"]


def test_the_child_gets_the_runs_arguments_less_its_run_dir():
    """Every host gets the step's whole prompt count and takes its share as the run's hosts
    do (`host_slice`): a share passed as the count would be split again (0 rows at 4
    hosts)."""
    argv = ["demo", "--rollout.prompts-per-step", "8", "--run-dir", "/x", "--steps=3",
            "--run-dir=/y"]
    assert measure.child_argv(argv) == ["demo", "--rollout.prompts-per-step", "8",
                                        "--steps=3"]


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


def _times(**phases):
    """A child's output: every timed phase 0 unless given ([per repetition])."""
    reps = len(next(iter(phases.values())))
    return {"times": {k: phases.get(k, [0.0] * reps) for k in measure.TIMED}}


def test_slowest_hosts_step_per_repetition_then_the_median():
    a = _times(prefill=[1, 5, 1], decode=[2, 2, 2], train=[3, 1, 9])  # steps 6, 8, 12
    b = _times(prefill=[2, 1, 2], decode=[1, 4, 1], train=[4, 2, 1])  # steps 7, 7, 4
    # the slowest host's phases: b, a, a -> prefill 2, 5, 1; decode 1, 2, 2; train 4, 1, 9
    got = measure.slowest([a, b])
    assert (got["prefill"], got["decode"], got["train"]) == (2, 2, 4)
    assert set(got) == set(measure.TIMED)


def test_apply_replaces_timed_phases_and_the_model_phases_inside_them():
    pred = Prediction("colocated", "x", {"prefill": 1.0, "decode": 2.0, "tp_comm": 0.5,
                                         "extend": 0.1, "train": 3.0, "allreduce": 0.4,
                                         "collectives": 0.2, "batch": 0.25, "other": 0.01})
    got = measure.apply(pred, {"prefill": 0.1, "decode": 0.2, "train": 0.3, "batch": 0.05})
    assert got.phases == {"prefill": 0.1, "decode": 0.2, "train": 0.3, "batch": 0.05,
                          "other": 0.01}
    assert got.mode == "colocated" and any("predict_programs measure" in n for n in got.notes)


def test_measure_refuses_a_mode_it_cannot_build_here():
    with pytest.raises(ValueError, match="not 'controller'"):
        measure.measure("controller", TINY, 2, 4, 2)


def test_measure_refuses_prompts_that_do_not_split_over_hosts():
    with pytest.raises(ValueError, match="5 prompts per step do not split over 2 hosts"):
        measure.measure("colocated", TINY, 2, 5, 2)


def test_measure_refuses_a_ray_mode(capsys):
    from benchmarks import predict_programs

    code = predict_programs.main(["measure", "demo", "--mode", "async", "--model", "tiny"])
    assert code == 2
    assert "--mode async is predicted by the model only" in capsys.readouterr().err


@pytest.mark.slow
def test_measure_times_the_runs_own_programs():
    """A tiny single run, its rows ending at 2 or 4 tokens (a wave compacted out): every
    timed phase comes back from the child, each a positive time."""
    got = measure.measure("single", TINY, 1, 4, 2, limits=[2, 4] * 4, reps=1)
    assert set(got) == set(measure.TIMED)
    assert all(v > 0 for v in got.values())


@pytest.mark.slow
def test_measure_splits_the_prompts_over_four_colocated_hosts():
    """4 prompts over 4 hosts: one each (the bug this guards against gave each 0 rows)."""
    got = measure.measure("colocated", [*TINY[:2], "colocated", *TINY[3:]], 4, 4, 2, reps=1)
    assert set(got) == set(measure.TIMED) and all(v > 0 for v in got.values())


@pytest.mark.slow
def test_measure_joins_colocated_hosts_as_the_run_does():
    """Two colocated children joined by jax.distributed: the batch's gather, the train
    step's all-reduce and the metrics' sum are collectives, so a child that did not join
    the other would hang or fail here; both hosts' steps come back timed."""
    got = measure.measure("colocated", [*TINY[:2], "colocated", *TINY[3:]], 2, 4, 2, reps=1)
    assert set(got) == set(measure.TIMED) and all(v > 0 for v in got.values())


@pytest.mark.slow
def test_measure_reports_a_run_that_cannot_be_built():
    with pytest.raises(RuntimeError, match="could not be built or run here"):
        measure.measure("single", [*TINY, "--model", "no-such-model"], 1, 4, 2, reps=1)


@pytest.mark.slow
def test_measure_times_a_step_with_a_reference():
    """β > 0: the run's own step gives the update its reference policy (`Trainer.step`); the
    child that composed its own step passed none, and `train_step.update` refused it."""
    got = measure.measure("single", [*TINY, "--algo.beta", "0.04"], 1, 4, 2, reps=1)
    assert set(got) == set(measure.TIMED) and all(v > 0 for v in got.values())
