"""The reference weights in host memory while the rollout and the train step run, and AdamW's
moments while the rollout and evaluation run (issue 55 item 1): the plan chooses each only
when the device needs the room, the run keeps them there (`rl/host_memory.py`) and moves them
back for the programs that read them alone, and the run is bitwise the run that kept them on
the device.

XLA:CPU in jax 0.10.2 has the `pinned_host` memory kind on every CPU device, so the moves
and the jit-cache hits run here for real; only the memory saved is not real (host and
device are the same RAM), which the plan's arithmetic states instead.
"""

import dataclasses

import jax
import numpy as np
import pytest

from locojax.rl import host_memory
from locojax.train import memory_plan
from locojax.train.config import EvalConfig, RolloutConfig, demo


def _run(tmp_path, name, **overrides):
    """One step of the embedded model at β 0.04, 4 prompts x G 2."""
    base = demo()
    return dataclasses.replace(
        base, model="embedded", mode="single", steps=1, run_dir=str(tmp_path / name),
        progress=False, tensorboard=False,
        algo=dataclasses.replace(base.algo, group_size=2, beta=0.04),
        rollout=RolloutConfig(prompts_per_step=4, max_new_tokens=6, max_prompt_tokens=8),
        eval=EvalConfig(every=0), **{"remat": "off", "grad_accum": 1, **overrides})


def test_cpu_devices_have_host_memory():
    assert host_memory.supported()


def test_the_plan_offloads_the_reference_only_when_it_must_and_the_run_is_the_same(tmp_path):
    from locojax.train import wiring
    from locojax.train.loop import start

    kept = start(_run(tmp_path, "kept", offload="off"), wiring.join("single"))
    plan = kept.memory
    assert plan.offloaded == () and plan.fits  # RAM is plenty: nothing to do
    assert not host_memory.on_host(kept.ref_params)
    ref = plan.held["reference"]
    assert ref > 0
    # A device between the peak with the reference held and the peak without it.
    train = next(p for p in plan.programs if p.name == "train_step")
    on, off = plan.peak, plan.peak - ref
    assert plan.peak_program.name != "ref_logprobs" and off < on
    memory = (on + off) / 2
    offloading = start(_run(tmp_path, "offloaded", device_memory_gb=memory / 1e9),
                       wiring.join("single"))
    chosen = offloading.memory
    assert chosen.offloaded == ("reference",) and chosen.fits
    assert chosen.peak_of(next(p for p in chosen.programs if p.name == "train_step")) == \
        plan.peak_of(train) - ref  # the train step runs without it
    assert chosen.chosen == [f"the reference in host memory but in the programs that read them: "
                             f"without it the peak is {memory_plan.size(on)}, with it "
                             f"{memory_plan.size(chosen.peak)}"]
    assert "(host memory but in ref_logprobs)" in chosen.format()
    assert chosen.learner.remat is False  # offloading came first: nothing recompiled
    assert host_memory.on_host(offloading.ref_params)

    # The same device with --offload off (remat and micro-batches fixed): refused.
    with pytest.raises(memory_plan.MemoryPlanError, match="more than the"):
        start(_run(tmp_path, "off", offload="off", device_memory_gb=memory / 1e9),
              wiring.join("single"))

    a, b = kept.run(), offloading.run()
    assert host_memory.on_host(offloading.ref_params)  # still there after the step
    for x, y in zip(jax.tree.leaves(kept.state.params), jax.tree.leaves(offloading.state.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert a["actor/kl"] == b["actor/kl"]  # the reference read from host memory is the same


def test_the_moments_go_to_host_memory_when_rollout_or_eval_alone_does_not_fit(tmp_path):
    """A big evaluation batch (512 prompts) whose programs exceed the device even without
    the reference: only the moments' move helps (remat and micro-batches change the train
    step alone), so the plan keeps them in host memory too, the trainer moves them back
    for each train step, and the run is bitwise the run that kept everything on device."""
    from locojax.train import wiring
    from locojax.train.loop import start

    def run(name, **kw):
        cfg = _run(tmp_path, name, remat="on", **kw)
        rollout = dataclasses.replace(cfg.rollout, max_new_tokens=48)
        return dataclasses.replace(cfg, rollout=rollout,
                                   eval=EvalConfig(every=1, num_examples=512, batch_size=512))

    kept = start(run("kept", offload="off"), wiring.join("single"))
    plan = kept.memory
    ref = plan.held["reference"]
    by_name = {p.name: p for p in plan.programs}
    train = plan.peak_of(by_name["train_step"]) - ref
    evaluation = plan.peak_of(by_name["prefill eval"]) - ref
    assert train < evaluation  # the premise: without the reference, eval is the peak
    memory = (train + evaluation) / 2
    moved = start(run("moved", device_memory_gb=memory / 1e9), wiring.join("single"))
    chosen = moved.memory
    assert chosen.offloaded == ("reference", "optimizer") and chosen.fits
    assert chosen.learner == plan.learner  # nothing recompiled
    assert chosen.peak_of(next(p for p in chosen.programs if p.name == "prefill eval")) == \
        evaluation - plan.held["optimizer"]
    assert host_memory.on_host(moved.state.opt_state) and host_memory.on_host(moved.ref_params)
    a, b = kept.run(), moved.run()
    assert host_memory.on_host(moved.state.opt_state)  # back after the step
    for x, y in zip(jax.tree.leaves(kept.state), jax.tree.leaves(moved.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert a["eval/accuracy"] == b["eval/accuracy"]
