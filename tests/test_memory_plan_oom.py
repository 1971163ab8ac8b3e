"""XLA's "out of device memory" is answered by the memory plan, never a traceback (issue 55
item 2).

XLA:TPU refuses to compile a program that cannot fit its HBM (`JaxRuntimeError:
RESOURCE_EXHAUSTED ... HLO temporaries (183.19G) exceeds available HBM (15.75G)`); XLA:CPU
never does. So these tests make the plan's compile of the train step raise that exception
type with that message (monkeypatched) for the settings a small device could not hold, and
check that the plan tries its next automatic setting, or refuses the run naming what it
tried, and that the CLI prints that refusal with no traceback. The same error at run time
gets one paragraph, not a traceback.
"""

import dataclasses

import jax
import pytest

from locojax.rl import train_step
from locojax.train import out_of_memory
from locojax.train.config import EvalConfig, RolloutConfig, demo

MESSAGE = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. HLO temporaries (183.19G) "
           "exceeds available HBM (15.75G)\nbuffer listing ...")


def _oom():
    return jax.errors.JaxRuntimeError(MESSAGE)


def _small_run(tmp_path, **overrides):
    """1 step of the embedded model, 4 prompts x G 2 (8 rows, one per CPU device)."""
    base = demo()
    return dataclasses.replace(
        base, model="embedded", mode="single", steps=1, run_dir=str(tmp_path / "run"),
        progress=False, tensorboard=False, algo=dataclasses.replace(base.algo, group_size=2),
        rollout=RolloutConfig(prompts_per_step=4, max_new_tokens=6, max_prompt_tokens=8),
        eval=EvalConfig(every=0), **overrides)


def _refusing(monkeypatch, refuse):
    """Make the plan's train-step compile raise XLA's out-of-memory error where
    `refuse(cfg)`; record every LearnerConfig it was asked to compile."""
    asked, real = [], train_step.compile_update

    def compile_update(state, batch, model_cfg, cfg, *args, **kwargs):
        asked.append(cfg)
        if refuse(cfg):
            raise _oom()
        return real(state, batch, model_cfg, cfg, *args, **kwargs)

    monkeypatch.setattr(train_step, "compile_update", compile_update)
    return asked


def test_the_compilers_figure_is_read_in_binary_units():
    assert out_of_memory.needed_bytes(MESSAGE) == int(183.19 * 2**30)
    tpu = "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.60G of 15.75G hbm."
    assert out_of_memory.needed_bytes(tpu) == int(20.60 * 2**30)
    assert out_of_memory.needed_bytes("RESOURCE_EXHAUSTED: out of memory") is None
    assert out_of_memory.is_out_of_memory(_oom())
    assert not out_of_memory.is_out_of_memory(jax.errors.JaxRuntimeError("INTERNAL: other"))
    assert not out_of_memory.is_out_of_memory(MemoryError(MESSAGE))


def test_a_compile_out_of_memory_is_answered_by_the_next_setting(tmp_path, monkeypatch):
    """XLA refuses the step without remat: `--remat auto` turns it on, and says why."""
    asked = _refusing(monkeypatch, lambda cfg: not cfg.remat)
    plan = _plan_of(_small_run(tmp_path, device_memory_gb=1000.0))
    assert [c.remat for c in asked] == [False, True]
    assert plan.fits and plan.learner.remat
    assert [p.refused for p in plan.programs] == [""] * len(plan.programs)
    assert plan.chosen[0].startswith(
        "remat on: without it XLA refused to compile train_step (RESOURCE_EXHAUSTED: XLA:TPU "
        "compile permanent error. HLO temporaries (183.19G) exceeds available HBM (15.75G))")


def _plan_of(cfg):
    from locojax.train import wiring
    from locojax.train.build import RunParts
    from locojax.train.loop import plan_memory

    joined = wiring.join("single")
    parts = RunParts.of(cfg)
    return plan_memory(parts, joined, parts.engine(joined.rollout_mesh, joined.rollout_rules))


def test_a_run_no_setting_compiles_is_refused_naming_what_was_tried(tmp_path, monkeypatch,
                                                                     capsys):
    """Every setting refused by XLA: `locojax train` exits 2 with the plan's refusal, which
    names the settings tried and XLA's message, and no traceback."""
    from locojax.commands.train import main

    asked = _refusing(monkeypatch, lambda cfg: True)
    code = main(["demo", "--model", "embedded", "--mode", "single", "--steps", "1",
                 "--run-dir", str(tmp_path / "run"), "--rollout.prompts-per-step", "4",
                 "--algo.group-size", "2", "--rollout.max-new-tokens", "6",
                 "--rollout.max-prompt-tokens", "8", "--eval.every", "0", "--no-progress",
                 "--no-tensorboard", "--device-memory-gb", "1000"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    # at least the compiler's 183.19 GiB (196.70 GB), and the held params and Adam:
    assert ("locojax train: XLA refused to compile train_step for want of device memory (it "
            "needs >= 196.7") in err
    assert "more than the 1000.00 GB available (--device-memory-gb); nothing was run" in err
    assert "Settings that shrink them:\n  --grad-accum N" in err
    # one row per device (8 rows on the session's 8 CPU devices): remat is all there is to try
    assert "(auto: tried remat on: none fits" in err
    assert "(XLA refused to compile train_step: RESOURCE_EXHAUSTED: XLA:TPU compile" in err
    assert [c.remat for c in asked] == [False, True]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_out_of_memory_at_run_time_is_one_paragraph(tmp_path, monkeypatch, capsys):
    """The plan let the run start, then the device ran out in the first step: exit 1 with
    the plan's figures and what to change, no traceback."""
    from locojax.commands.train import main
    from locojax.train.loop import Trainer

    def step(self, step, timer):
        raise _oom()

    monkeypatch.setattr(Trainer, "step", step)
    code = main(["demo", "--model", "embedded", "--mode", "single", "--steps", "1",
                 "--run-dir", str(tmp_path / "run"), "--rollout.prompts-per-step", "4",
                 "--algo.group-size", "2", "--rollout.max-new-tokens", "6",
                 "--rollout.max-prompt-tokens", "8", "--eval.every", "0", "--no-progress",
                 "--no-tensorboard"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    assert "locojax train: the device ran out of memory while running: RESOURCE_EXHAUSTED" in err
    assert "The memory plan expected a peak of" in err and "--device-memory-gb" in err


@pytest.mark.parametrize("message", ["INTERNAL: something else"])
def test_other_compile_errors_still_raise(tmp_path, monkeypatch, message):
    """Only the out-of-memory error is the plan's to answer."""
    from locojax.train import wiring
    from locojax.train.loop import start

    def compile_update(*args, **kwargs):
        raise jax.errors.JaxRuntimeError(message)

    monkeypatch.setattr(train_step, "compile_update", compile_update)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        start(_small_run(tmp_path, plan_only=True), wiring.join("single"))
