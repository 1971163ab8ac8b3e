"""The memory plan of a run: what each device holds at its peak, known before the first step.

Before any weight is read, `plan` compiles, without running, the programs of a step at the
run's exact shapes: `train_step` (and with β > 0 the reference logprobs' program before it),
the engine's prefill and decode for rollout (and for evaluation, at its own batch), and, when
rollout lays the weights out otherwise than training, the reshard that moves them
(`meshes.to_layout`). XLA's per-device memory analysis of each gives its arguments, outputs,
the part aliased through donation, and its temporaries. To that the plan adds what
the run holds throughout: the f32 master params, the optimizer state and the reference copy
(β > 0); and, in the rollout and evaluation programs only, the engine's KV cache, in the
engine's cache dtype (a bf16 cache counts half; a generate compacts finished rows within that
one buffer, never a second). The trainer releases that cache after each rollout and
evaluation (`Engine.release_cache`), so the train step and the reshard run without it. A
device's peak is the held memory plus the most any one program needs on top of it.

The compiles are the run's own compiles: the abstract arguments are placed exactly as the
real ones will be, so the jit caches that the first step hits already hold them and start-up
compiles each program once (`Engine.compile`, `train_step.compile_update`); only the decode
of a compacted, smaller batch compiles later, the first time a generate reaches that size.

Each program is kept as a `ProgramCost` (`program_cost.py`): with its memory, XLA's FLOPs and
bytes, the account `locojax predict` reads too. Next to XLA's total for the train step stands
`expected_train_temporaries` (`train_memory.py`), derived from the shapes alone: gradients, one chunk of logits with its softmax and gradient, the embedding
gradient of a chunk, the activations autodiff keeps. It names the biggest buffers when a run
does not fit (with the settings that shrink each), and tests/test_memory_plan.py checks that
XLA's temporaries stay within it, e.g. that no [B, T, V] logits buffer appears at V = 151,936.

Sizes are in GB = 10^9 bytes. On CPU, "device memory" is the host's RAM shared by its CPU
devices (XLA:CPU reports no limit); other processes on the host (local `launch` hosts
included) are not counted. `--device-memory-gb` overrides what is detected.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from locojax.engine import waves
from locojax.engine.sampling import SamplingConfig
from locojax.model import decoder
from locojax.model.config import ModelConfig
from locojax.rl import micro_batches
from locojax.rl import train_step as train_step_lib
from locojax.rl.batch import logit_positions
from locojax.rl.config import LearnerConfig
from locojax.train import meshes, out_of_memory, plan_fit, plan_hints
from locojax.train.program_cost import ProgramCost as Program
from locojax.train.program_cost import GB, argument_bytes, device_bytes, size
from locojax.train.train_memory import (READS, Account, expected_train_temporaries,
                                        layer_residual_bytes, on_device)

__all__ = ["GB", "EngineShape", "MemoryPlan", "MemoryPlanError", "Program", "device_bytes",
           "expected_train_temporaries", "layer_residual_bytes", "plan", "size"]

class MemoryPlanError(ValueError):
    """The run does not fit in device memory; the message says what to change."""


def detect_device_memory(override_gb: float = 0.0) -> tuple[int | None, str]:
    """(bytes per device, where that figure came from); None if it cannot be known."""
    if override_gb > 0:
        return int(override_gb * GB), "--device-memory-gb"
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.platform} memory_stats"
    if device.platform == "cpu":
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None, "unknown"
        n = jax.local_device_count()
        return ram // n, f"host RAM shared by {n} CPU device{'s' * (n > 1)}"
    return None, "unknown"


@dataclasses.dataclass
class MemoryPlan:
    """Per-device memory of a run: held buffers, each program's needs on top, the peak."""

    held: dict[str, int]  # name -> bytes, held all run (the KV caches by phase, see below)
    caches: dict[str, int]  # phase -> bytes of the KV cache live during that phase (none in
    # "train": the trainer releases the engine's cache after each generate, `Engine.release_cache`)
    programs: list[Program]
    expected: dict[str, int]  # `expected_train_temporaries`
    settings: dict  # what the hints need: remat, grad_accum, rows per micro-batch, ...
    device_memory: int | None
    device_source: str
    local_devices: int
    learner: LearnerConfig  # what the run trains with: the plan's automatic choices made
    chosen: list[str] = dataclasses.field(default_factory=list)  # what auto chose, and why
    # Held buffers kept in host memory except while a program that reads them runs
    # (`rl/host_memory.py`; the plan chooses it, `plan_fit.fit`): names of `held`.
    offloaded: tuple[str, ...] = ()

    def peak_of(self, p: Program) -> int:
        return on_device(self.held, self.offloaded, p.name) + self.caches.get(p.phase, 0) + p.extra

    @property
    def analytic(self) -> Account:
        """The plan's analytic account, without XLA's figures (`train_memory.Account`): what
        `locojax predict` counts for hardware that is not here."""
        copy = {"rollout's copy of the weights": self.settings["rollout_copy"]}
        return Account(dict(self.held), {"KV cache": max(self.caches.values(), default=0),
                                         **copy}, dict(self.expected), self.offloaded)

    @property
    def peak_program(self) -> Program:
        return max(self.programs, key=self.peak_of)

    @property
    def peak(self) -> int:
        return self.peak_of(self.peak_program)

    @property
    def refused(self) -> list[Program]:
        """Programs the compiler refused for want of memory (`out_of_memory.py`)."""
        return [p for p in self.programs if p.refused]

    @property
    def fits(self) -> bool:
        """Within the device's memory, and no program refused by the compiler for want of it
        (`out_of_memory.py`; then it does not fit even where the device's size is unknown)."""
        if self.refused:
            return False
        return self.device_memory is None or self.peak <= self.device_memory

    def format(self) -> str:
        """The plan as a short table (what `locojax train` prints at start-up)."""
        st = self.settings
        layout = (f"mesh data={st['devices'] // st['fsdp']},fsdp={st['fsdp']}" if st["fsdp"] > 1
                  else "data parallel") + (f", rollout tp {st['rollout_tp']}"
                                           if st["rollout_tp"] > 1 else "")
        lines = [f"memory plan per device ({self.local_devices} local device"
                 f"{'s' * (self.local_devices > 1)}; {layout}; {st['precision']}, remat "
                 f"{'on' if st['remat'] else 'off'}, {st['grad_accum']} micro-batch"
                 f"{'es' * (st['grad_accum'] > 1)}, logits in {st['logits']}"
                 f"{', rollout in %d waves' % st['waves'] if st.get('waves', 1) > 1 else ''}):"]
        host = {k: f" (host memory but in {', '.join(READS[k])})" for k in self.offloaded}
        held = ", ".join(f"{k} {size(v)}{host.get(k, '')}" for k, v in self.held.items() if v)
        caches = ", ".join(f"{k} {size(v)}" for k, v in self.caches.items())
        caches = f"{caches} ({st['cache_dtype']})" if caches else "none"
        copy = (f"; rollout's copy of the weights {size(st['rollout_copy'])} (another layout "
                "than training's)") if st["rollout_copy"] else ""
        lines.append(f"  {'held':<16} {held}; KV cache: {caches}{copy}")
        for p in self.programs:
            compiled = ("   [compiled with prefill]" if p.name.startswith("decode") else
                        f"   [compiled in {p.compile_s:.1f} s]")
            what = f"XLA temporaries {size(p.temporaries)}"
            if p.refused:
                compiled = f"   [refused by XLA: {p.refused}]"
                what = f"XLA needs >= {size(p.temporaries)} of temporaries"
            if p.name == "reshard":
                what = f"rollout's copy {size(p.outputs)}, {what}"
            lines.append(f"  {p.name:<16} +{size(p.extra)} ({what}) -> {size(self.peak_of(p))}"
                         f"{compiled}")
            if p.name == "train_step":
                parts = ", ".join(f"{k} {size(v)}" for k, v in self.expected.items())
                lines.append(f"  {'':<16} expected temporaries <= "
                             f"{size(sum(self.expected.values()))}: {parts}")
        if self.device_memory is None:
            total = f"device memory unknown ({self.device_source}): pass --device-memory-gb"
        else:
            total = (f"of {size(self.device_memory)} ({self.device_source}), "
                     f"{100 * self.peak / self.device_memory:.0f}%")
        lines.append(f"  {'peak':<16} {size(self.peak)} in {self.peak_program.name}, {total}")
        if self.local_devices > 1:
            lines.append(f"  {'this host':<16} {self.local_devices} devices x {size(self.peak)} "
                         f"= {size(self.local_devices * self.peak)} at most")
        lines += [f"  {'auto':<16} {c}" for c in self.chosen]
        return "\n".join(lines)

    def biggest(self, n: int = 4) -> list[tuple[str, int]]:
        """The largest named buffers at the peak (held ones and the train step's expected)."""
        named = dict(self.held)
        named["KV cache"] = max(self.caches.values(), default=0)
        named["rollout's copy of the weights"] = self.settings["rollout_copy"]
        if self.peak_program.name == "train_step":
            named.update({f"train step {k}": v for k, v in self.expected.items()})
        else:
            named[f"{self.peak_program.name} temporaries"] = self.peak_program.temporaries
        return sorted(named.items(), key=lambda kv: -kv[1])[:n]

    def hints(self) -> list[str]:
        """Settings that shrink the buffers that matter (>= 5% of the peak), in this order."""
        return plan_hints.hints(self)

    def _tp_hint(self, cache: int) -> str | None:
        return plan_hints.tp_hint(self, cache)

    def check(self) -> None:
        """Raise MemoryPlanError, naming the biggest buffers and the settings that shrink
        them, when the peak exceeds the device's memory."""
        if self.fits:
            return
        g = size
        biggest = ", ".join(f"{k} {g(v)}" for k, v in self.biggest())
        hints = "\n  ".join(self.hints())
        tried = "".join(f"\n(auto: {c})" for c in self.chosen) + "".join(
            f"\n(XLA refused to compile {p.name}: {p.refused})" for p in self.refused)
        available = ("the device's memory" if self.device_memory is None else
                     f"the {g(self.device_memory)} available")
        what = (f"XLA refused to compile {self.refused[0].name} for want of device memory "
                f"(it needs >= {g(self.peak_of(self.refused[0]))} per device"
                if self.refused and self.peak <= (self.device_memory or 0) else
                f"this run needs {g(self.peak)} per device at its peak "
                f"({self.peak_program.name}")
        raise MemoryPlanError(
            f"{what}), more than {available} ({self.device_source}); nothing "
            f"was run. Biggest buffers: {biggest}. Settings that shrink them:\n  {hints}"
            f"{tried}\n"
            "(`--plan-only` prints the whole plan; `--device-memory-gb` overrides the detected size.)")


@dataclasses.dataclass(frozen=True)
class EngineShape:
    """One generate call of the run: B prompts of P tokens, G samples each."""

    name: str  # "rollout" or "eval"
    prompts: int
    prompt_len: int
    num_samples: int
    sampling: SamplingConfig


def plan(model_cfg: ModelConfig, learner: LearnerConfig, state, batch, ref_params, mesh, engine,
         engine_shapes: list[EngineShape], precision: str = "f32",
         device_memory_gb: float = 0.0, auto_remat: bool = False,
         rollout_layout=None, offload: str = "off", auto_waves: bool = False) -> MemoryPlan:
    """Compile the run's programs at its shapes (without running them) and plan its memory.

    state, batch, ref_params: arrays or ShapeDtypeStructs placed as the run's will be
    (`train_state.abstract`, `batch.abstract`); ref_params None when β = 0. engine: the
    run's `Engine`; engine_shapes: its generate calls; rollout_layout: where the reshard
    writes the weights (`wiring.reshard_target`; None: the engine's own layout). A run
    that does not fit keeps the reference (and moments) in host memory when `offload` is
    "auto" ("host": always), generates in waves when a rollout alone does not fit
    (`auto_waves`; it sets `engine.waves`), then raises remat (`auto_remat`) and
    micro-batches (AUTO_ACCUM) until it fits (`plan_fit`); `MemoryPlan.learner`, `.offloaded`
    and `.chosen` say what it chose.
    """
    held, model_weights = _held(state, ref_params)
    memory, source = detect_device_memory(device_memory_gb)
    rows, columns = batch.tokens.shape
    settings = _layout_settings(model_cfg, learner, mesh, engine, precision)
    devices = settings["devices"]

    def expected_of(resolved: LearnerConfig) -> dict[str, int]:
        """`expected_train_temporaries` of this run's batch, under `resolved` settings."""
        return expected_train_temporaries(model_cfg, resolved, rows, columns, devices,
                                          prefix=batch.shared_prefix, param_bytes=held["params"])

    def train_program(learner: LearnerConfig) -> tuple[Program, dict, dict]:
        program = _compiled("train_step", "train", memory, device_bytes((state, ref_params)),
                            lambda: train_step_lib.compile_update(state, batch, model_cfg,
                                                                  learner, ref_params, mesh))
        resolved = micro_batches.resolve(learner, batch, model_cfg.vocab_size, mesh)  # as the step
        chunk = decoder.logprob_chunk_size(rows // resolved.rows_multiple,
                                           logit_positions(columns, batch.shared_prefix),
                                           model_cfg.vocab_size, resolved.logprob_chunk)
        shards = micro_batches.batch_shards(mesh, learner.rules, rows)
        return program, {
            "remat": resolved.remat, "grad_accum": resolved.grad_accum,
            "logits": f"chunks of {chunk} positions" if chunk else "one piece",
            "rows_per_micro": max(1, rows // resolved.rows_multiple // shards),
            "rows_per_device": rows // learner.algo.num_minibatches // shards,
        }, expected_of(resolved)

    train, train_settings, expected = train_program(learner)
    reference = _reference_program(batch, ref_params, model_cfg, learner, mesh)
    rollout_args = (engine, engine_shapes, model_weights, settings, rollout_layout)
    rollout = {engine.waves: _rollout_programs(*rollout_args)}  # by the waves tried

    def with_learner(learner, train=None, train_settings=None, expected=None) -> MemoryPlan:
        ref = reference
        if train is None:
            train, train_settings, expected = train_program(learner)
            ref = _reference_program(batch, ref_params, model_cfg, learner, mesh)
        programs, caches = rollout[engine.waves]
        return MemoryPlan(held, caches, [*ref, train, *programs], expected,
                          {**settings, **train_settings, "waves": engine.waves}, memory, source,
                          jax.local_device_count(), learner)

    def with_waves(k: int) -> MemoryPlan:
        engine.waves = k  # the run's engine: it generates in the waves its plan compiled
        rollout[k] = rollout.get(k) or _rollout_programs(*rollout_args)  # once per k
        return with_learner(learner, train, train_settings, expected)

    first = with_learner(learner, train, train_settings, expected)
    if offload == "host":
        plan_fit.keep_on_host(first)
    if auto_waves and not first.fits:
        first = plan_fit.in_waves(first, with_waves, engine, engine_shapes, offload)
    if first.fits:  # a CPU host's RAM is shared: remat beyond a share of it (`cpu_budget`)
        return plan_fit.cpu_budget(first, with_learner, auto_remat)
    xla_per_expected = train.temporaries / max(1, sum(expected.values()))

    def estimate(learner: LearnerConfig) -> int:
        """The peak `with_learner(learner)` would plan, without compiling: the train step's
        temporaries its expectation times XLA's ratio to it in the first plan."""
        e = expected_of(micro_batches.resolve(learner, batch, model_cfg.vocab_size, mesh))
        guess = dataclasses.replace(train, temporaries=int(xla_per_expected * sum(e.values())))
        return max(first.peak_of(p) for p in [*reference, guess, *rollout[engine.waves][0]])

    return plan_fit.fit(first, with_learner, estimate, auto_remat, offload)


def _layout_settings(model_cfg: ModelConfig, learner: LearnerConfig, mesh, engine,
                     precision: str) -> dict:
    """The plan's settings that the layouts fix: devices, FSDP and rollout TP ways."""
    devices = int(np.prod(list(mesh.shape.values()))) if mesh is not None else 1
    fsdp = mesh.shape.get("fsdp", 1) if mesh is not None and learner.rules == "train_fsdp" else 1
    engine_mesh = engine.layout.mesh if engine.layout is not None else None
    tp = engine_mesh.shape.get("tensor", 1) if engine_mesh is not None else 1
    return {"precision": precision, "cache_dtype": engine.cache_dtype.name,
            "logprob_chunk": learner.logprob_chunk, "devices": devices, "fsdp": fsdp,
            "rollout_tp": tp, "rollout_devices": engine_mesh.size if engine_mesh else 1,
            "kv_heads": model_cfg.num_key_value_heads, "rollout_copy": 0}


def _held(state, ref_params) -> tuple[dict[str, int], object]:
    """(Bytes held all run, the model's weights); LoRA: the base is `frozen`, the reference too."""
    held = {"params": state.params, "optimizer": state.opt_state, "frozen": state.frozen,
            "reference": None if ref_params is state.frozen else ref_params}  # None: 0 bytes
    return {k: device_bytes(v) for k, v in held.items()}, state.frozen or state.params


def _reference_program(batch, ref_params, model_cfg: ModelConfig, learner: LearnerConfig,
                       mesh) -> list[Program]:
    """β > 0: the reference logprobs, a program of their own before the step
    (`train_step.with_reference`), reading the held reference copy; `compile_update` has just
    compiled it, so this compile is the jit cache's. With β = 0 there is none: []."""
    program = _compiled("ref_logprobs", "train", None, device_bytes(ref_params),
                        lambda: train_step_lib.compile_reference(batch, ref_params, model_cfg,
                                                                 learner, mesh))
    return [] if program is None else [program]


def _compiled(name: str, phase: str, memory: int | None, held: int, compile_it) -> Program | None:
    """`compile_it()` as a `Program` (None if it compiles nothing), or, when XLA refuses it
    for want of device memory (XLA:TPU raises at compile), the refusal as the plan counts it
    (`out_of_memory.refused`): the plan then tries its next setting or names what it tried."""
    t0 = time.perf_counter()
    try:
        compiled = compile_it()
    except jax.errors.JaxRuntimeError as e:
        if not out_of_memory.is_out_of_memory(e):
            raise
        return out_of_memory.refused(name, phase, e, memory, held, time.perf_counter() - t0)
    if compiled is None:
        return None
    return Program.of(name, phase, compiled, held, time.perf_counter() - t0)


def _rollout_programs(engine, engine_shapes, params, settings: dict, rollout_layout):
    """`_engine_programs`, after the reshard into the engine's layout when it has another."""
    programs, caches = _engine_programs(engine, engine_shapes, params, settings)
    if settings["rollout_copy"]:
        programs.insert(0, _reshard(params, rollout_layout or engine.weight_shardings))
    return programs, caches


def _engine_programs(engine, engine_shapes: list[EngineShape], params,
                     settings: dict) -> tuple[list[Program], dict[str, int]]:
    """The prefill and decode of each generate call, compiled as the run compiles them
    (`Engine.compile`), and the KV cache live in each phase. Sets `settings["rollout_copy"]`
    when the engine reads the weights in another layout than training's (its copy is live
    while the engine runs, not held)."""
    programs, caches = [], {}
    for shape in engine_shapes:
        t0 = time.perf_counter()
        prompts = shape.prompts // (engine.waves if waves.split(engine, shape.prompts) else 1)
        try:
            prefill, decode = engine.compile(prompts, shape.prompt_len, shape.sampling,
                                             shape.num_samples)
        except jax.errors.JaxRuntimeError as e:
            if not out_of_memory.is_out_of_memory(e):
                raise
            programs.append(out_of_memory.refused(f"generate {shape.name}", shape.name, e, None,
                                                  0, time.perf_counter() - t0))
            continue
        seconds = time.perf_counter() - t0
        weights, cache = argument_bytes(prefill, 0), argument_bytes(prefill, 5)
        caches[shape.name] = max(caches.get(shape.name, 0), cache)
        if meshes.another_layout(prefill.input_shardings[0][0], params):
            settings["rollout_copy"] = weights
            weights = 0
        # The two compile together; the pair's time is reported once, on prefill.
        programs.append(Program.of(f"prefill {shape.name}", shape.name, prefill,
                                   weights + cache, seconds))
        programs.append(Program.of(f"decode {shape.name}", shape.name, decode,
                                   weights + cache, 0.0))
    return programs, caches


def _reshard(params, layout) -> Program:
    """The move of the weights from the training layout to `layout`, the rollout's, before
    each rollout (`meshes.to_layout`), compiled as the run compiles it: its output is
    rollout's copy, its temporaries what XLA stages the shards through on their way (about
    a device's share of the params, never a whole replica: `to_layout`)."""
    leaves = jax.tree.leaves(params)
    t0 = time.perf_counter()
    moving, program = meshes.layout_program(params, layout)
    compiled = program.lower([leaves[i] for i in moving]).compile()
    return Program.of("reshard", "train", compiled, device_bytes([leaves[i] for i in moving]),
                      time.perf_counter() - t0)
