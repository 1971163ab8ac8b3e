"""A rollout that alone does not fit the device is generated in waves (issue 55 item 1): the
memory plan tries the fewest waves whose programs fit (`plan_fit.in_waves`), sets the run's
engine to them, says so, and the run steps; with `--rollout.waves 1` the same run is
refused, as it was before waves existed.

The device is faked small (`--device-memory-gb`): the embedded model, 64 prompts x G 4 of
8 + 192 tokens over the suite's 8 CPU devices (32 rows each), remat and 32 micro-batches,
so the train step (19.9 MB a device with the held buffers) fits 22 MB and the one-wave
rollout (24.4 MB, its KV cache 13.4 MB) does not; offloading is off, so nothing else can
make the room.
"""

import dataclasses

import numpy as np
import pytest

from locojax.profiler import StepTimer
from locojax.train import wiring
from locojax.train.config import EvalConfig, RolloutConfig, demo
from locojax.train.loop import start
from locojax.train.memory_plan import MemoryPlanError

DEVICE_GB = 0.022


def _run(tmp_path, name, waves):
    base = demo()
    return dataclasses.replace(
        base, model="embedded", mode="single", steps=1, run_dir=str(tmp_path / name),
        progress=False, tensorboard=False, algo=dataclasses.replace(base.algo, group_size=4),
        rollout=RolloutConfig(prompts_per_step=64, max_new_tokens=192, max_prompt_tokens=8,
                              waves=waves),
        eval=EvalConfig(every=0), remat="on", grad_accum=32, offload="off",
        device_memory_gb=DEVICE_GB)


@pytest.mark.slow  # two runs' compiles (~1 min)
def test_a_rollout_that_does_not_fit_is_generated_in_waves(tmp_path):
    trainer = start(_run(tmp_path, "auto", 0), wiring.join("single"))
    plan = trainer.memory
    assert trainer.engine.waves == 2 and plan.fits
    assert any("the rollout in 2 waves of 32 prompts" in c for c in plan.chosen), plan.chosen
    assert "rollout in 2 waves" in plan.format().splitlines()[0]
    metrics = trainer.step(0, StepTimer())
    assert np.isfinite(metrics["actor/pg_loss"])
    with pytest.raises(MemoryPlanError, match="more than the 22.0 MB available"):
        start(_run(tmp_path, "whole", 1), wiring.join("single"))
