"""The RL loop: sample prompts → generate → score → advantages → train → log, per step.

The whole step reads top to bottom in `Trainer.step`: take the step's rollouts from the
rollout source (`source.py`: the producer half, `producer.py`, run inline or by remote
workers into a versioned buffer), run the global update, publish the new weights as the
next version. What differs between coordination modes lives in the wiring (`wiring.py`;
the Ray modes' in `fleet/`); everything else is shared. `start(cfg, wiring)` is the one
entry for every mode: it takes the run directory's lock (`run_lock.py`, process 0 only),
builds the run's parts (`build.py`), plans its memory, and makes the `Trainer` whose `run()`
trains.

Randomness: step s samples with `fold_in(key(seed), s)`, and the engine draws row r with a
key folded from its global row index, so tokens do not depend on which host or device
generated them. With the data cursor also a function of the step (`data.py`), a run resumed
from a checkpoint continues bitwise like one that never stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time

import jax
import jax.numpy as jnp

from locojax import distributed, float_context, profiler
from locojax.checkpoint import Checkpointer
from locojax.engine.engine import rollout_copy
from locojax.envs.rewards import RewardRunner
from locojax.evaluate import batch_rows, derived, evaluate, greedy_sampling
from locojax.metrics import MetricsLogger
from locojax.model import loader, lora, lora_io
from locojax.profiler import StepTimer, TraceWindow
from locojax.rl import batch as batch_lib
from locojax.rl import buckets
from locojax.rl import host_memory, logprob_gap, split_step, train_state
from locojax.rl import train_step as train_step_lib
from locojax.train import memory_plan, meshes, resume, run_lock
from locojax.train.build import RunParts
from locojax.train.comm_probe import AllReduceProbe
from locojax.train.config import COMPUTE_DTYPES, RunConfig, check_run
from locojax.train.early import EarlyReference
from locojax.train.progress import Progress
from locojax.train.source import InlineSource, RolloutSource

log = logging.getLogger(__name__)

FINAL_MODEL = "final_model"
"""run_dir/final_model: the trained params as an HF checkpoint (`--model` can load it); under
LoRA the base with the adapters merged."""
FINAL_ADAPTER = "final_adapter"
"""run_dir/final_adapter (LoRA runs): the adapters alone in PEFT's format (`lora_io.py`),
which `peft` loads onto the base and `--model` reads as the base with them merged."""


def start(cfg: RunConfig, wiring) -> Trainer | None:
    """The trainer of `cfg` on `wiring` (this process has joined its hosts); None under
    `--plan-only`, which prints the plan and loads nothing.

    Before reading any weight it compiles the step's programs at the run's shapes and plans
    their memory (`memory_plan.py`), refusing a run that cannot fit; the run reuses them."""
    check_run(cfg, wiring.host.num_processes, jax.device_count())
    # Process 0 writes the run dir's logs and export: a second run on it is refused here,
    # before it reads, truncates or compiles anything. Held until `Trainer.run` ends.
    lock = run_lock.acquire(cfg.run_dir) \
        if wiring.host.process_id == 0 and not cfg.plan_only else None
    try:
        return _start(cfg, wiring, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _start(cfg: RunConfig, wiring, lock: run_lock.RunLock | None) -> Trainer | None:
    resume.check(cfg)  # a checkpoint of another run is refused before any compile
    parts = RunParts.of(cfg)
    meshes.check_tp_model(cfg.rollout.tp, parts.model_cfg)
    engine = parts.engine(wiring.rollout_mesh, wiring.rollout_rules)
    memory = plan_memory(parts, wiring, engine)
    if wiring.host.process_id == 0:
        print(memory.format(), flush=True)
        if lora.enabled(parts.model_cfg):
            print(lora.describe(parts.model_cfg, engine.weights_dtype), flush=True)
        print(f"prompts: {parts.prompts.describe(cfg.rollout.max_prompt_tokens)}", flush=True)
    if cfg.plan_only:  # print the plan, load nothing, run nothing
        return None
    memory.check()
    distributed.meet("locojax: programs compiled")  # hosts compile at different speeds
    parts = dataclasses.replace(parts, learner=memory.learner)  # what the plan chose (auto)
    return Trainer(parts, wiring, engine, memory, lock)


def eval_share(parts: RunParts, wiring) -> list:
    """This host's share of the held-out examples (equal shares on every host)."""
    n = min(parts.cfg.eval.num_examples, len(parts.task.test))
    n -= n % wiring.host.num_processes
    start, stop = wiring.host_slice(n)
    return [parts.task.test[i] for i in range(start, stop)]


def plan_memory(parts: RunParts, wiring, engine) -> memory_plan.MemoryPlan:
    """The run's memory plan, from its programs compiled at its exact shapes (the run then
    reuses those compiles)."""
    cfg, mesh, learner = parts.cfg, wiring.train_mesh, parts.learner
    state = train_state.abstract(parts.model_cfg, learner.optim, mesh, learner.rules)
    ref = reference_of(state, cfg.algo.beta)
    rows = cfg.rollout.prompts_per_step * cfg.group_size
    p, sampling = cfg.rollout.max_prompt_tokens, parts.sampling
    columns = p + cfg.rollout.max_new_tokens
    if parts.limits is not None:
        # Multi-turn: the batch holds whole trajectories, and the rollout's cache has the
        # limits' slots; planned as one generate call with a cache of that size.
        columns = p + parts.limits.max_trajectory_tokens
        sampling = dataclasses.replace(sampling, max_new_tokens=parts.limits.slots - p + 1)
    prefix = batch_lib.SharedPrefix(p, cfg.group_size)
    start, stop = wiring.host_slice(cfg.rollout.prompts_per_step)
    # Remote rollouts (the Ray modes): the workers generate, this engine never does; with
    # k > 0 batches carry staleness (another train_step program: `fleet/buffer.merge`).
    remote = wiring.remote_rollouts
    shapes = [] if remote else [
        memory_plan.EngineShape("rollout", stop - start, p, cfg.group_size, sampling)]
    eval_prompts = batch_rows(len(eval_share(parts, wiring)),
                              cfg.eval.batch_size // wiring.host.num_processes)
    if cfg.eval.every and eval_prompts:
        greedy = greedy_sampling(parts.tokenizer, cfg.rollout.max_new_tokens)
        shapes.append(memory_plan.EngineShape("eval", eval_prompts, p, 1, greedy))
    batch = batch_lib.abstract(rows, columns, mesh, wiring.train_rules, prefix,
                               staleness=remote and cfg.placement.max_staleness > 0)
    return memory_plan.plan(parts.model_cfg, learner, state, batch, ref, mesh, engine, shapes,
                            cfg.precision, cfg.device_memory_gb, auto_remat=cfg.remat == "auto",
                            rollout_layout=wiring.reshard_target(engine.weight_shardings),
                            offload=cfg.offload if host_memory.supported() else "off",
                            auto_waves=waves_allowed(cfg, wiring, parts))


def waves_allowed(cfg, wiring, parts: RunParts) -> bool:
    """Whether the plan may generate in waves: a single-turn rollout that this trainer's own
    engine generates whole (not the Ray modes' workers, not the controller's chunked decode,
    not a refilling one), with `--rollout.waves 0`."""
    return (cfg.rollout.waves == 0 and not wiring.remote_rollouts and parts.limits is None
            and not cfg.rollout.refill_slots and wiring.name in ("single", "colocated"))


def reference_of(state: train_state.TrainState, beta: float, copy=None):
    """The reference policy's weights (None at β = 0): under LoRA the frozen base itself (the
    policy with its adapters off), no copy; else `copy`, the starting params (or, planning,
    their shapes: the state's own)."""
    if not beta:
        return None
    if state.frozen is not None:
        return state.frozen
    return state.params if copy is None else copy


def update(state: train_state.TrainState, batch, model_cfg, learner, ref_params, mesh,
           timer: StepTimer, split: bool = False):
    """The step's global update (`train_step.update`), timed as one `train` phase; with
    `split` (`--profile-split`), where the layout has a flat all-reduce to run apart, as
    `split_step`'s separate programs, each in its own phase. Only a profiled step reaches
    `split_step`."""
    if split and split_step.splits(mesh, learner):
        return train_step_lib.update(state, batch, model_cfg, learner, ref_params, mesh,
                                     programs=split_step.programs(timer))
    with timer.phase("train") as ph:
        state, metrics = train_step_lib.update(state, batch, model_cfg, learner, ref_params,
                                               mesh)
        ph.sync(state.params)
    return state, metrics


@functools.partial(jax.jit, static_argnames=("cfg", "dtype"))
def merged(frozen, adapters, cfg, dtype=None):
    """Base + adapters merged (`lora.merge`), straight into the engine's rollout copy where it
    decodes with one (`--rollout.weights-dtype`): one program, so the merged f32 matrices are
    never all live at once beside the copy (Qwen3-1.7B: 6.8 GB of f32 on a 16 GB chip)."""
    weights = lora.merge(frozen, adapters, cfg)
    return weights if dtype is None else rollout_copy(weights, dtype)


class Trainer:
    """Owns the run's state; `run()` executes the remaining steps. Made by `start`, which
    compiled `engine`'s programs and the train step for `memory`, the run's plan."""

    def __init__(self, parts: RunParts, wiring, engine, memory: memory_plan.MemoryPlan,
                 lock: run_lock.RunLock | None = None):
        self.started = time.monotonic()
        self.lock = lock  # the run dir's (process 0's), released when `run` ends
        cfg = self.cfg = parts.cfg
        self.parts, self.wiring, self.engine, self.memory = parts, wiring, engine, memory
        self.host = wiring.host
        self.is_main = self.host.process_id == 0
        float_context.record(cfg.run_dir, f"host{self.host.process_id}")
        # Loaded straight into the training layout (replicated over every host's devices, or
        # sharded over `fsdp`).
        params, frozen = parts.train_weights(wiring.train_mesh, wiring.train_rules)
        # The reference policy is the starting point; copied because train_step donates state,
        # into host memory where the plan needs the room (`MemoryPlan.offloaded`). Under LoRA
        # it is the frozen base, read from the state each step (`reference_of`).
        self.ref_params = None
        if cfg.algo.beta > 0 and frozen is None:
            self.ref_params = (host_memory.to_host(params) if "reference" in memory.offloaded
                               else jax.tree.map(jnp.copy, params))
        self.state = self._placed(train_state.init(params, parts.learner.optim, parts.model_cfg,
                                                   frozen))
        self.runner = RewardRunner(cfg.reward)
        self.logger = MetricsLogger(cfg.run_dir, enabled=self.is_main, tensorboard=cfg.tensorboard,
                                    report_to=cfg.report_to, config=resume.as_json(cfg))
        self.ckpt = Checkpointer(os.path.join(os.path.abspath(cfg.run_dir), "checkpoints"),
                                 keep=cfg.checkpoint.keep)
        dump_dir = os.path.join(cfg.run_dir, "rollouts") if cfg.dump_rollouts else None
        self.producer = parts.producer(engine, self.runner, dump_dir)
        self.rollouts: RolloutSource = wiring.rollout_source(self.producer)
        # The reference forward runs while the host scores the rows (`early.py`).
        self.early = None
        if cfg.algo.beta > 0 and isinstance(self.rollouts, InlineSource):
            self.early = EarlyReference(
                lambda: reference_of(self.state, cfg.algo.beta, self.ref_params), parts, wiring)
            self.producer.early = self.early
        self.start_step, self.saved_rollouts = self._maybe_resume()
        self.last_step = cfg.steps  # moved earlier when time_limit_s runs out
        mesh = wiring.train_mesh
        self.net_bytes = profiler.allreduce_bytes(
            sum(x.size for x in jax.tree.leaves(params)), 1 if mesh is None else mesh.size,
            parts.learner.updates_per_step)

    # --- checkpoints -------------------------------------------------------------------------

    def _maybe_resume(self) -> tuple[int, tuple | None]:
        """(first step, the rollout source's checkpointed (arrays, JSON) or None), from the
        newest checkpoint that restores; `start` has checked that it is of this run."""
        frozen = self.state.frozen  # LoRA's base: the run's --model, never checkpointed
        found = resume.restore(self.cfg, self.ckpt, dataclasses.replace(self.state, frozen=None),
                               self.is_main)
        if found is None:
            self.logger.truncate_after(-1)  # a fresh run owns its logs
            return 0, None
        self.state, step = self._placed(dataclasses.replace(found.state, frozen=frozen)), \
            found.step
        # Lines are labelled 1..step for steps done: later ones (a killed run's) and a cut
        # last line are dropped, and steps missing from the log are a warning.
        self.logger.truncate_after(step)
        log.info("resumed from %s at step %d", self.ckpt.directory, step)
        if step >= self.cfg.steps:  # it had ended: was its export whole?
            params, adapters = self._whole_params(), self._whole_adapters()
            if self.is_main:
                resume.export_if_missing(os.path.join(self.cfg.run_dir, FINAL_MODEL), self.cfg,
                                         self.parts.model_cfg, params, step)
                if adapters is not None:  # a few MB, rewritten whole, the same bytes
                    self._export_adapters(adapters)
        return step, (found.rollout, found.meta["rollouts"])

    def save(self, step: int) -> None:
        """The train state, and the rollout source's: the admission state (curation table,
        data cursor), or the buffer, leases and kept versions. Not the root key: it is
        always `key(seed)`, rebuilt by every producer."""
        arrays, rollouts = self.rollouts.state(step + 1)
        meta = {"next_step": step + 1, **resume.recorded(self.cfg), "rollouts": rollouts}
        # Under LoRA the adapters and their moments only: the base is the run's --model,
        # whose content the checkpoint's fingerprint pins (`resume.py`).
        self.ckpt.save(step + 1, dataclasses.replace(self.state, frozen=None), meta, arrays)

    # --- one step ----------------------------------------------------------------------------

    def step(self, step: int, timer: StepTimer) -> dict[str, float]:
        """Rollout, update and (when due) evaluation of one step; returns its metrics."""
        cfg, parts = self.cfg, self.parts
        sampler = self.state.params  # under LoRA: the adapters, which remote rollouts take
        if not self.wiring.remote_rollouts and self.state.frozen is not None:
            with timer.phase("lora_merge") as ph:  # this version's weights for the engine
                sampler = self.sampler_weights()
                ph.sync(sampler)
        record = self.rollouts.take(step, sampler, timer)  # generated by version ≤ step
        with timer.phase("batch") as ph:  # cut to the width every host agrees on (buckets.py)
            local, sizes = buckets.fit(record.batch, self.wiring.gather_over_hosts)
            batch = self.wiring.global_batch(local)
            ph.sync(batch)
        if self.early is not None:  # its reference logprobs, dispatched before scoring
            batch = self.early.attach(batch)
        self.state, metrics = update(self.state, batch, parts.model_cfg, parts.learner,
                                     reference_of(self.state, cfg.algo.beta, self.ref_params),
                                     self.wiring.train_mesh, timer, split=cfg.profile_split)
        parts.check_gap(metrics, batch.tokens.shape[1], record.version, step)  # issue 59
        self.state = self._placed(self.state)
        metrics.update(sizes)
        metrics.update(self.rollouts.publish(step + 1, self.state.params, timer))
        with timer.phase("metrics"):  # every host's sums, in one collective
            stats = self.wiring.sum_over_hosts(record.stats)
            metrics.update(stats.metrics())
        # The Ray modes' rows are checked by the workers that made them: every host stops here
        # alike if one's gap passed the bound (before the step's checkpoint), naming versions.
        logprob_gap.check_units(stats.logprob_gap_past, stats.logprob_gap_bounds, step)
        if cfg.time_limit_s and self._out_of_time():
            self.last_step = step + 1  # this step is the run's last: evaluate and save it
        if cfg.eval.every and ((step + 1) % cfg.eval.every == 0 or step + 1 == self.last_step):
            with timer.phase("eval"):
                metrics.update(self.evaluate())
        return metrics

    def _across_hosts(self, perf: dict[str, float]) -> dict[str, float]:
        """The step's shares, and every host's phases as the critical path and the spread
        (two small collectives after the step; their time is `perf/profiler_s`)."""
        start = time.perf_counter()
        out = {**profiler.shares(perf), **profiler.spread(self.wiring.every_host(perf)),
               "perf/timing": profiler.TIMING}
        out["perf/profiler_s"] = time.perf_counter() - start
        return out

    def _placed(self, state: train_state.TrainState) -> train_state.TrainState:
        """`state` with AdamW's moments in host memory where the plan keeps them there
        (`MemoryPlan.offloaded`): only the train step reads them, and `train_step.update`
        copies them back for it (`rl/host_memory.py`)."""
        if "optimizer" not in self.memory.offloaded:
            return state
        return dataclasses.replace(state, opt_state=host_memory.to_host(state.opt_state))

    def _whole_params(self):
        """The params whole in host memory, for export (every host joins: sharded over
        `fsdp` they are assembled from the shards, never replicated on a device, which at
        Qwen3-4B under FSDP 8 would put 16 GB of f32 params on every device)."""
        return meshes.host_copy(self.sampler_weights(engine_copy=False))

    def _whole_adapters(self):
        """A LoRA run's adapters whole in host memory (every host joins), else None."""
        return meshes.host_copy(self.state.params) if self.state.frozen is not None else None

    def _export_adapters(self, adapters) -> None:
        """run_dir/final_adapter in PEFT's format, naming the base's directory (host 0)."""
        base = loader.resolve_dir(self.cfg.model)
        lora_io.save(os.path.join(self.cfg.run_dir, FINAL_ADAPTER), self.parts.model_cfg,
                     adapters, str(base.resolve()) if base is not None else self.cfg.model)

    def sampler_weights(self, engine_copy: bool = True):
        """The weights the engine samples from at this version: the params, or under LoRA
        the base with this version's adapters merged into one copy (`lora.merge`). Only the
        adapters are published (`publish`): a rollout worker merges them into its own base."""
        if self.state.frozen is None:
            return self.state.params
        return merged(self.state.frozen, self.state.params, self.parts.model_cfg,
                      self.engine.weights_dtype if engine_copy else None)

    def _out_of_time(self) -> bool:
        """Past time_limit_s on any host: decided together, so every host stops at one step."""
        late = float(time.monotonic() - self.started >= self.cfg.time_limit_s)
        return self.wiring.sum_over_hosts(late) > 0

    def _checkpoint_due(self, step: int) -> bool:
        every = self.cfg.checkpoint.every
        return (every and (step + 1) % every == 0) or step + 1 == self.last_step

    def evaluate(self) -> dict[str, float]:
        cfg, parts = self.cfg.eval, self.parts
        examples = eval_share(parts, self.wiring)
        n = len(examples) * self.host.num_processes
        per_host = cfg.batch_size // self.host.num_processes
        weights = self.wiring.rollout_weights(self.sampler_weights(), self.engine.weight_shardings)
        local = evaluate(self.engine, weights, parts.tokenizer, parts.task, self.runner, examples,
                         self.cfg.rollout.max_new_tokens, self.cfg.rollout.max_prompt_tokens,
                         batch_size=per_host, pool=self.producer.envs, limits=parts.limits)
        self.engine.release_cache()  # as after a rollout: the train step runs without it
        self.runner.metrics()  # eval scoring is not rollout scoring: keep counters per step
        sums = self.wiring.sum_over_hosts({k: v * len(examples) for k, v in local.items()})
        out = {k: float(v) / n for k, v in sums.items()}
        return {**out, **derived(out)}

    # --- the run -----------------------------------------------------------------------------

    def run(self) -> dict[str, float]:
        try:
            return self._run()
        finally:
            if self.lock is not None:
                self.lock.release()

    def _run(self) -> dict[str, float]:
        cfg = self.cfg
        # First, so that remote workers can start generating while this host evaluates.
        self.rollouts.begin(self.start_step, self.state.params, self.saved_rollouts)
        trace = TraceWindow(cfg.profile_dir or None)
        probe = AllReduceProbe(self.state.params, self.wiring.train_mesh) \
            if cfg.probe_allreduce else None
        progress = Progress(cfg.steps, self.start_step, enabled=self.is_main and cfg.progress)
        before = {}
        if cfg.eval.every and self.start_step == 0:
            before = self.evaluate()
            self.logger.log(0, before)
            progress.note(f"held-out accuracy before: {before['eval/accuracy']:.3f}")
        last = {}
        with progress:
            for step in range(self.start_step, cfg.steps):
                trace.before_step(step)
                last = self.logged_step(step, probe)
                trace.after_step(step)
                progress.update(step + 1, last)
                if step + 1 == self.last_step:
                    break
        trace.close()
        self.rollouts.close()
        params = self._whole_params() if self.start_step < cfg.steps else None
        adapters = self._whole_adapters() if params is not None else None
        if self.is_main and params is not None:
            loader.save(os.path.join(cfg.run_dir, FINAL_MODEL), self.parts.model_cfg,
                        params, cfg.model,
                        {"made_by": "locojax train", "steps": self.last_step},
                        dtype=COMPUTE_DTYPES[cfg.checkpoint.export_dtype])
            if adapters is not None:
                self._export_adapters(adapters)
        self.close()
        return {**{f"before/{k}": v for k, v in before.items()}, **last}

    def logged_step(self, step: int, probe: AllReduceProbe | None = None) -> dict[str, float]:
        """`step` as the run takes it: timed (`StepTimer`), its metrics and `perf/*` logged
        (`metrics.jsonl`, `perf.jsonl`), checkpointed when due; returns both, as logged.
        `benchmarks/measure_child.py` times a run's step by these same lines."""
        cfg, timer = self.cfg, StepTimer()
        last = self.step(step, timer)
        timings = {k: last.pop(k) for k in list(last) if k.startswith("perf/")}
        # Metrics are logged before the checkpoint that covers them, so a run killed right
        # after a save has already logged every step that save contains.
        self.logger.log(step + 1, last)
        if self._checkpoint_due(step):
            with timer.phase("checkpoint"):
                self.save(step)
        perf = {**timings, **timer.finish_step(), **self.net_bytes, **profiler.device_memory()}
        perf.update(self._across_hosts(perf))
        generated = last["rollout/response_length/mean"] * cfg.rollout.prompts_per_step \
            * cfg.group_size
        perf["perf/tokens_per_s"] = generated / max(perf["perf/step_time"], 1e-9)
        perf.update(buckets.rates(perf))
        perf["perf/elapsed_s"] = time.monotonic() - self.started
        if probe is not None:
            perf.update(probe.measure())
        self.logger.log(step + 1, perf)
        return {**last, **perf}

    def close(self) -> None:
        """Close what the run opened (checkpointer, reward runner, env pool, logs, the run
        dir's lock); `run` ends with it, and so does a caller that took steps itself
        (`logged_step`)."""
        self.ckpt.close()
        self.runner.close()
        if self.producer.envs is not None:
            self.producer.envs.close()
        self.logger.close()
        if self.lock is not None:
            self.lock.release()
