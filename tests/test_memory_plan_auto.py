"""The memory plan's automatic settings and its suggestions (issue 26 items 3 and 4a).

`--remat auto` (the default) and `--grad-accum 0` are raised by the plan only when a run
would not fit otherwise, and the plan says what it chose and why; explicit settings are kept,
and a run they do not fit is refused naming `--remat on`, `--train.mesh data=D,fsdp=F` and
`--rollout.tp N` with this run's numbers. Under FSDP the plan counts a device's shard of
params, gradients and optimizer state, and rollout's copy of the weights in its own layout.

Compiled only, on a narrow 8-layer model (deep, so that keeping every layer's activations
costs much more than keeping only their inputs) over 2 of the session's 8 CPU devices; the
device memory each case plans against is set between peaks the test itself compiled, so no
figure here depends on the machine or on XLA's version.
"""

import dataclasses
import math

import jax
import pytest
import tyro

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config
from locojax.model.params import declare, is_decl
from locojax.model.sharding import RULES, make_mesh
from locojax.rl import batch as batch_lib
from locojax.rl import train_state
from locojax.rl.config import AlgoConfig, LearnerConfig
from locojax.train import memory_plan, plan_fit
from locojax.train.config import PRESETS, RunConfig

MODEL = config.tiny(num_hidden_layers=8)
ROWS, COLUMNS, PROMPT = 16, 128, 16  # 8 rows per device, groups of 2 sharing a prompt


def _plan(remat=False, grad_accum=1, memory=0.0, auto_remat=False, fsdp=1, shapes=()):
    """The plan of a train step (and the engine `shapes`) over 2 devices: data parallel, or
    FSDP over both (`fsdp=2`), the engine replicated on the same devices."""
    mesh = make_mesh({"data": 2 // fsdp, "fsdp": fsdp}, jax.devices()[:2])
    rules = "train_fsdp" if fsdp > 1 else "train_dp"
    learner = LearnerConfig(algo=AlgoConfig(group_size=2), remat=remat, grad_accum=grad_accum,
                            rules=rules)
    state = train_state.abstract(MODEL, learner.optim, mesh, rules)
    batch = batch_lib.abstract(ROWS, COLUMNS, mesh, RULES[rules],
                               batch_lib.SharedPrefix(PROMPT, 2))
    engine = Engine(MODEL, mesh=mesh)
    return memory_plan.plan(MODEL, learner, state, batch, None, mesh, engine, list(shapes),
                            device_memory_gb=memory / 1e9, auto_remat=auto_remat)


@pytest.fixture(scope="module")
def peaks():
    """Peaks with remat off and on (both explicit, one micro-batch)."""
    off, on = _plan(remat=False), _plan(remat=True)
    assert on.peak < off.peak  # the premise: remat shrinks this step
    return off.peak, on.peak


def test_auto_turns_remat_on_only_when_the_run_does_not_fit_without_it(peaks):
    off, on = peaks
    between = (off + on) / 2
    chosen = _plan(memory=between, auto_remat=True)
    assert chosen.fits and chosen.learner.remat and chosen.settings["remat"]
    assert chosen.peak == on
    assert len(chosen.chosen) == 1 and chosen.chosen[0].startswith(
        f"remat on: without it the peak is {memory_plan.size(off)} (train_step), more than "
        f"the {memory_plan.size(int(between))} available; with it {memory_plan.size(on)}")
    assert "auto             remat on: without it" in chosen.format()

    kept = _plan(memory=off, auto_remat=True)  # fits as it is: nothing changes
    assert kept.fits and not kept.learner.remat and kept.chosen == []
    assert kept.peak == off


def test_auto_remat_on_a_cpu_host_beyond_its_share_of_the_ram(peaks, monkeypatch):
    """Detected as a CPU host's RAM (shared with other processes), a run that fits but fills
    more than CPU_AUTO_SHARE of it gets remat all the same; under the share, or with the
    memory given (`--device-memory-gb`), it keeps remat off. Without this the GSM8K-128
    run planned 97% of the RAM and peaked at 20.4 GB (docs/results/cpu_long_step.md)."""
    off, on = peaks
    share = plan_fit.CPU_AUTO_SHARE

    def host_ram(ram):
        monkeypatch.setattr(memory_plan, "detect_device_memory",
                            lambda _gb=0.0: (int(ram), "host RAM shared by 2 CPU devices"))

    host_ram(off / share * 0.99)  # fits, but beyond the share
    chosen = _plan(auto_remat=True)
    assert chosen.fits and chosen.learner.remat and chosen.peak == on
    budget = memory_plan.size(int(off / share * 0.99 * share))
    assert chosen.chosen == [
        f"remat on: without it the peak is {memory_plan.size(off)} (train_step), more than "
        f"{budget} ({share:.0%} of this host's RAM, which other processes share); with it "
        f"{memory_plan.size(on)}"]
    assert not _plan(auto_remat=False).learner.remat  # --remat off: kept
    host_ram(off / share * 1.01)  # within the share: kept off
    kept = _plan(auto_remat=True)
    assert not kept.learner.remat and kept.chosen == [] and kept.peak == off
    monkeypatch.undo()  # the same memory given by --device-memory-gb: no share
    assert not _plan(memory=off / share * 0.99, auto_remat=True).learner.remat


def test_explicit_settings_are_kept_and_refused_with_the_settings_by_name(peaks):
    off, on = peaks
    plan = _plan(memory=(off + on) / 2, auto_remat=False)  # --remat off, --grad-accum 1
    assert not plan.fits and not plan.learner.remat and plan.chosen == []
    with pytest.raises(memory_plan.MemoryPlanError) as e:
        plan.check()
    msg = str(e.value)
    assert "--remat on: keep only each layer's input" in msg
    # The run's 2 devices: the fewest FSDP ways that close the gap are both of them.
    assert "--train.mesh data=1,fsdp=2: shard params, gradients and optimizer state" in msg


def test_auto_micro_batches_when_remat_is_off_by_name(peaks):
    """--remat off with --grad-accum 0 (auto): the plan raises the micro-batches instead."""
    off, _ = peaks
    plan = _plan(remat=False, grad_accum=0, memory=off - 1)
    assert plan.fits and not plan.learner.remat and plan.learner.grad_accum >= 2
    k = plan.learner.grad_accum
    assert plan.chosen[0].startswith(f"{k} micro-batches of {8 // k} rows per device: "
                                     "without it the peak is")


@pytest.mark.timeout(900)  # 3 compiles; each took ~3 min with the 2 cores at load 10-18
def test_fsdp_plans_a_devices_shard_and_rollouts_copy():
    """FSDP over 2 devices: a device holds its shard of the params and Adam's moments, and
    the expected gradients are as large; the replicated engine needs its own copy of
    the weights while it runs (not held), made by the reshard before each rollout, so the
    reshard's and a prefill's needs include it; `--rollout.tp 2` is suggested (2 KV heads
    split 2 ways)."""
    sampling = SamplingConfig(max_new_tokens=4, stop_token_ids=(1,), pad_token_id=0)
    plan = _plan(fsdp=2, shapes=[memory_plan.EngineShape("rollout", 2, 8, 2, sampling)])
    whole = 4 * MODEL.num_params()
    # Weights with a model-width axis are halved; the norm scales stay whole.
    shard = sum(4 * math.prod(w.shape) // (2 if "embed" in w.axes else 1)
                for w in jax.tree.leaves(declare(MODEL), is_leaf=is_decl))
    assert whole // 2 < shard < whole
    assert plan.held["params"] == shard
    assert 2 * shard <= plan.held["optimizer"] < 2 * shard + 64  # two moments; counters
    assert plan.expected["gradients"] == shard
    assert plan.settings["rollout_copy"] == whole
    prefill = next(p for p in plan.programs if p.name == "prefill rollout")
    assert prefill.extra >= whole + prefill.temporaries
    reshard = next(p for p in plan.programs if p.name == "reshard")
    # The all-gather's output is the replicated engine's copy of the weights FSDP shards
    # (the norm scales are replicated in both layouts: the engine reads the params' own);
    # what XLA stages it through is less than a second whole replica.
    moved = 2 * (whole - shard)  # whole - shard is half the weights FSDP shards
    assert moved <= reshard.outputs < moved + 1024  # and the output tuple's pointers
    assert reshard.extra == reshard.outputs + reshard.temporaries
    assert reshard.temporaries < whole
    assert "rollout's copy of the weights" in plan.format()
    # Named among the hints once the copy and the cache are >= 5% of the peak; here (a
    # TINY cache against the train step's peak) they are not, so asked for directly.
    assert plan._tp_hint(plan.caches["rollout"]).startswith(
        "--rollout.tp 2: shard the engine's weights and KV cache")


@pytest.mark.parametrize("argv, remat", [
    ([], "auto"), (["--remat", "on"], "on"), (["--remat", "off"], "off"),
    (["--remat", "auto"], "auto")])
def test_remat_flag_spellings(argv, remat):
    """auto is the default; the learner gets a bool."""
    cfg = tyro.extras.overridable_config_cli(PRESETS, args=["demo", *argv],
                                             prog="locojax train")
    assert cfg.remat == remat
    assert cfg.learner_config().remat is (remat == "on")


def test_a_boolean_remat_in_code_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="remat must be 'auto', 'on' or 'off', got True"):
        dataclasses.replace(RunConfig(), remat=True)
