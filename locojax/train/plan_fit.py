"""The memory plan's automatic settings: what it raises, in which order, until a run fits.

`memory_plan.plan` compiles a run's programs once at the settings given; when they do not fit
(or XLA refuses to compile one for want of memory: `out_of_memory.py`), `fit` first keeps the
reference weights in host memory outside the one program that reads them (`--offload auto`,
where the device has host memory kinds: `rl/host_memory.py`), which costs a copy over the host
link per step and no compile; when a rollout alone still does not fit (its KV cache), it
generates in waves (`in_waves`, `--rollout.waves 0`); then it tries the automatic settings
in order, each a `LearnerConfig` the train step is compiled for again, on every backend
alike: remat when `--remat auto`, then more micro-batches when `--grad-accum 0` (auto).
The paper's studies escalate remat and micro-batches in the same order
(`benchmarks/paper.py`, `memory_fit`); `locojax predict` times every layout that fits
instead (`locojax/predict/layout.py`).
"""

from __future__ import annotations

import dataclasses

from locojax.rl.config import AUTO_ACCUM
from locojax.train.program_cost import size


def _offloaded(plan, names: tuple[str, ...]):
    plan.offloaded = names
    return plan


def _offload(plan, allowed: bool) -> tuple[str, ...]:
    """What `plan` keeps in host memory (set on it): the reference (β > 0), and AdamW's
    moments too when a program other than the train step, which alone reads them, still
    exceeds the device without them (rollout's KV cache; remat and micro-batches cannot
    help there, and the moments cost two copies a step, the reference one)."""
    if not allowed:
        return ()
    names = ("reference",) if plan.held.get("reference") else ()
    room = plan.device_memory or float("inf")
    _offloaded(plan, names)
    if any(p.name != "train_step" and plan.peak_of(p) > room for p in plan.programs):
        names += ("optimizer",)
    return _offloaded(plan, names).offloaded


def keep_on_host(plan) -> None:
    """`--offload host`: the reference (β > 0) and AdamW's moments in host memory whether or
    not the device needs the room, so a run's state lives where a larger run's would."""
    _offloaded(plan, (("reference",) if plan.held.get("reference") else ()) + ("optimizer",))
    plan.chosen = [f"{_said(plan.offloaded)} (--offload host)"]


def in_waves(first, with_waves, engine, engine_shapes, offload: str):
    """When a rollout alone does not fit the device (its KV cache, which remat, micro-batches
    and offloading leave as it is): the plan generating in the fewest waves that fits it
    (`engine/waves.py`), after what `_offload` would keep in host memory; `first` if none
    helps. Tried: the divisors k of the rollout's prompts whose waves still split evenly
    over the engine's devices; each costs a compile of prefill and decode at B / k."""
    room = first.device_memory or float("inf")
    kept = first.offloaded  # restored unless waves are chosen: `fit` says what it offloads
    names = kept if offload == "host" else _offload(first, offload == "auto")

    def beyond(plan):
        return [p for p in plan.programs if p.phase == "rollout" and plan.peak_of(p) > room]

    over = beyond(first)
    rollout = next((s for s in engine_shapes if s.name == "rollout"), None)
    if not over or rollout is None:
        return _offloaded(first, kept)
    devices = first.settings["rollout_devices"]
    tried = first
    for k in range(2, rollout.prompts + 1):
        if rollout.prompts % k or (rollout.prompts // k * rollout.num_samples) % devices:
            continue
        tried = _offloaded(with_waves(k), names)
        if not beyond(tried):
            tried.chosen = [f"the rollout in {k} waves of {rollout.prompts // k} prompts, one "
                            f"wave's KV cache at a time: without it {over[0].name} alone "
                            f"needs {size(first.peak_of(over[0]))}"]
            return tried
    with_waves(1)  # none helps: the run's engine as it was (its programs compiled already)
    return _offloaded(first, kept)


def _said(names: tuple[str, ...]) -> str:
    return " and ".join({"reference": "the reference", "optimizer": "AdamW's moments"}[n]
                        for n in names) + " in host memory but in the programs that read them"


CPU_AUTO_SHARE = 0.4
"""On a CPU host, the share of its RAM a run's plan may fill before `--remat auto` turns remat
on, though the run would fit the whole RAM without it. The RAM is the host's, shared with
every other process, and a process's RSS exceeds its plan (the runtime, the allocator's
slack): GSM8K prompts (P 256) with 128 new tokens at G 4 planned 24.5 of 25.3 GB without
remat and peaked at 20.4 GB RSS, twice TRL's 10.1 GB at the same work; with remat its train
step's temporaries are 1.6 GB instead of 18.0 (docs/results/cpu_long_step.md). The real
demo's plan (7.7 GB, 30%) stays under it, so its step keeps every activation."""


def host_budget(memory: int | None, source: str) -> int | None:
    """What `--remat auto` lets a plan fill of memory detected as a CPU host's RAM
    (`memory_plan.detect_device_memory`); None for a device's own, or a size given."""
    return int(CPU_AUTO_SHARE * memory) if memory and source.startswith("host RAM") else None


def cpu_budget(first, with_learner, auto_remat: bool):
    """`first`, or on a CPU host where it fits but fills more than CPU_AUTO_SHARE of the RAM
    (`host_budget`) with remat off and `--remat auto`, the plan with remat on, saying why;
    micro-batches are not raised for it (the run fits)."""
    budget = host_budget(first.device_memory, first.device_source)
    if (not auto_remat or budget is None or first.learner.remat or not first.fits
            or first.peak <= budget):
        return first
    tried = _offloaded(with_learner(dataclasses.replace(first.learner, remat=True)),
                       first.offloaded)
    if not tried.fits or tried.peak >= first.peak:
        return first
    tried.chosen = list(first.chosen) + [
        f"remat on: without it the peak is {size(first.peak)} ({first.peak_program.name}), "
        f"more than {size(budget)} ({CPU_AUTO_SHARE:.0%} of this host's RAM, which other "
        f"processes share); with it {size(tried.peak)}"]
    return tried


def fit(first, with_learner, estimate, auto_remat: bool, offload: str = "off"):
    """The plan of the first escalation of the automatic settings that fits, saying what it
    chose and why; else the last one tried, saying what was tried (`check` refuses it). One
    that fits a CPU host's RAM may still get remat (`cpu_budget`).

    The reference in host memory first (`offload`, with β > 0), kept through every later
    step. Then remat: it keeps only each layer's input whatever the batch, for about one more
    forward, and keeps the matmuls whole; then more micro-batches (divisors of a device's
    rows, fewest first), which divide what is left of the activations and the logits. The
    logits are already chunked automatically (`--logprob-chunk -1`) once they are large.
    Only the train step is compiled again: from the first escalation that `estimate` (no
    compile) says fits, or the last, on until one does; not at all when a rollout or
    evaluation program alone exceeds the device (its KV cache is not the train step's)."""
    if first.fits:
        return cpu_budget(first, with_learner, auto_remat)
    prior = list(first.chosen)  # `in_waves` or `keep_on_host`: said first, kept
    learner, st = first.learner, first.settings
    if offload == "host":  # kept there (`keep_on_host`) through every later step
        before, names = first.peak, first.offloaded
    else:
        before, names = first.peak, _offload(first, offload == "auto")
    if names and first.fits:
        first.chosen = prior + [f"{_said(names)}: without it the peak is {size(before)}, "
                                f"with it {size(first.peak)}"]
        return first
    steps = []
    if auto_remat and not learner.remat:
        learner = dataclasses.replace(learner, remat=True)
        steps.append((learner, "remat on"))
    if first.learner.grad_accum == AUTO_ACCUM:
        rows = st["rows_per_device"]
        for k in range(st["grad_accum"] + 1, rows + 1):
            if rows % k == 0:
                steps.append((dataclasses.replace(learner, grad_accum=k),
                              ("remat on and " if learner.remat and not first.learner.remat
                               else "") + f"{k} micro-batches of {rows // k} rows per device"))
    refused = [p for p in first.programs if p.refused]
    available = (f"the {size(first.device_memory)} available" if first.device_memory else
                 "the device's memory")
    why = (f"without it XLA refused to compile {refused[0].name} ({refused[0].refused})"
           if refused else f"without it the peak is {size(before)} "
           f"({first.peak_program.name}), more than {available}")
    if not steps:
        return first
    room = first.device_memory or float("inf")  # unknown size: try every step in order
    beyond = [p for p in first.programs if p.phase != "train" and first.peak_of(p) > room]
    if beyond:  # rollout or evaluation alone does not fit: no train-step setting helps
        first.chosen = prior + [
            f"not tried ({', '.join(w for _, w in steps)}): {beyond[0].name} alone needs "
            f"{size(first.peak_of(beyond[0]))}, which they do not change"]
        return first
    start = next((i for i, (c, _) in enumerate(steps) if estimate(c) <= room), len(steps) - 1)
    skipped = f" ({', '.join(w for _, w in steps[:start])}: estimated not to)" if start else ""
    if names:
        steps = [(c, f"{_said(names)}, {w}") for c, w in steps]
    for candidate, what in steps[start:]:
        tried = _offloaded(with_learner(candidate), names)
        if tried.fits:
            tried.chosen = prior + [f"{what}: {why}; with it {size(tried.peak)}"]
            return tried
    tried.chosen = prior + [
        f"tried {', then '.join(w for _, w in steps[start:])}{skipped}: none fits, "
        f"the last needs {size(tried.peak)}"]
    return tried
