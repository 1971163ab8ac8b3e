"""The RL loop: sample prompts → generate → score → advantages → train → log, per step.

The whole step reads top to bottom in `Trainer.step`: take the step's rollouts from the
rollout source (`source.py`: the producer half, `producer.py`, run inline or by remote
workers into a versioned buffer), run the global update, publish the new weights as the
next version. What differs between coordination modes lives in the wiring (`wiring.py`;
the Ray modes' in `modes/`); everything else is shared.

Randomness: step s samples with `fold_in(key(seed), s)`, and the engine draws row r with a
key folded from its global row index, so tokens do not depend on which host or device
generated them. With the data cursor also a function of the step (`data.py`), a run resumed
from a checkpoint continues bitwise like one that never stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from locojax import distributed, models
from locojax.checkpoint import Checkpointer
from locojax.engine.sampling import SamplingConfig
from locojax.envs.registry import make_task
from locojax.envs.rewards import RewardRunner
from locojax.evaluate import batch_rows, derived, evaluate, greedy_sampling
from locojax.metrics import MetricsLogger
from locojax.model.sharding import TRAIN_DP, weight_shardings
from locojax.profiler import StepTimer, TraceWindow
from locojax.rl import batch as batch_lib
from locojax.rl import train_state
from locojax.rl.train_step import update
from locojax.rollout import limits as limits_lib
from locojax.train import memory_plan
from locojax.train import wiring as wiring_lib
from locojax.train.comm_probe import AllReduceProbe
from locojax.train.config import COMPUTE_DTYPES, RunConfig, TaskConfig, check
from locojax.train.curation import Curator
from locojax.train.data import PromptStream
from locojax.train.producer import Producer, rollout_metrics
from locojax.train.progress import Progress
from locojax.train.source import RolloutSource

log = logging.getLogger(__name__)

FINAL_MODEL = "final_model"
"""run_dir/final_model: the trained params as an HF checkpoint (`--model` can load it)."""


def build_task(cfg: TaskConfig, seed: int, max_turns: int = 0):
    if cfg.name in ("arith", "calc"):
        return make_task(cfg.name, level=cfg.level, seed=seed, train_size=cfg.train_size)
    if cfg.name == "swe":  # the env's own turn limit follows --multiturn.max-turns
        return make_task("swe", level=cfg.level, seed=seed, train_dir=cfg.data or None,
                         test_dir=cfg.test_data or None, autosubmit=cfg.autosubmit,
                         **({"max_turns": max_turns} if max_turns else {}))
    if cfg.name == "gsm8k":
        return make_task("gsm8k", train_path=cfg.data, test_path=cfg.test_data or cfg.data,
                         template=cfg.template, skip_invalid=cfg.skip_invalid)
    return make_task(cfg.name, train_path=cfg.data, test_path=cfg.test_data or cfg.data,
                     skip_invalid=cfg.skip_invalid)


def sampling_config(cfg: RunConfig, tokenizer) -> SamplingConfig:
    """How the run's rollouts are sampled (the learner's plan and every producer use it)."""
    return SamplingConfig(
        max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
        top_k=cfg.rollout.top_k, top_p=cfg.rollout.top_p, ignore_eos=cfg.rollout.ignore_eos,
        stop_token_ids=tuple(tokenizer.stop_ids), pad_token_id=tokenizer.pad_id)


def multi_turn_limits(cfg: RunConfig, task, model_cfg) -> limits_lib.Limits | None:
    """A multi-turn task's resolved limits (refused here if they cannot fit the engine's cache
    or the model's positions); None for a single-turn task."""
    if not task.multi_turn:
        return None
    return limits_lib.resolve(cfg.multiturn, task.max_turns, cfg.rollout.max_new_tokens,
                              cfg.rollout.max_prompt_tokens, model_cfg.max_position_embeddings)


def build_curator(cfg: RunConfig, task) -> Curator:
    """The run's admission state (pass-rate table, re-admission queue, data cursor)."""
    return Curator(cfg.curation, PromptStream(task.train, cfg.seed), cfg.rollout.prompts_per_step,
                   cfg.seed)


def build_producer(cfg: RunConfig, engine, tokenizer, task, runner, root_key,
                   curator: Curator | None = None) -> Producer:
    """The producer half of a step on `engine`; the same on the learner and on rollout workers.
    `curator`: the learner's, which it advances once per step; a rollout worker's own (curation
    off: step s's plan is a function of s alone) by default."""
    return Producer(engine, tokenizer, task, runner, curator or build_curator(cfg, task),
                    cfg.learner_config().algo, sampling_config(cfg, tokenizer),
                    cfg.rollout.prompts_per_step, cfg.rollout.max_prompt_tokens, root_key,
                    cfg.dynamic, cfg.multiturn, multi_turn_limits(cfg, task, engine.model_cfg))


class Trainer:
    """Owns the run's state; `run()` executes the remaining steps.

    Before reading any weight it compiles the step's programs at the run's shapes and plans
    their memory (`memory_plan.py`), refusing a run that cannot fit; the run reuses them.
    `make_wiring` builds the mode's wiring once this process has joined its hosts (the Ray
    modes pass theirs; default: `wiring.make(cfg.mode)`).
    """

    def __init__(self, cfg: RunConfig, make_wiring=None):
        self.started = time.monotonic()
        self.cfg = cfg
        self.host = distributed.initialize(devices_per_host=cfg.devices_per_host or None)
        check(cfg, self.host.num_processes, jax.device_count())
        self.is_main = self.host.process_id == 0
        self.task = build_task(cfg.task, cfg.seed, cfg.multiturn.max_turns)
        self.learner_cfg = cfg.learner_config()
        self.wiring = make_wiring() if make_wiring else wiring_lib.make(cfg.mode)
        # f32 master weights whatever the checkpoint's dtype; `precision` sets the compute.
        overrides = dict(param_dtype="float32", compute_dtype=COMPUTE_DTYPES[cfg.precision])
        self.model_cfg = models.load_config(cfg.model, **overrides)
        self.tokenizer = models.load_tokenizer_of(cfg.model)
        self.engine = self.wiring.make_engine(self.model_cfg)
        self.sampling = sampling_config(cfg, self.tokenizer)
        # Multi-turn limits must fit the engine's cache and the model's positions: checked
        # here, before any compile or step.
        self.limits = multi_turn_limits(cfg, self.task, self.model_cfg)
        # Before any weight is read: compile the step's programs and check they fit.
        self.memory = self._plan_memory()
        if self.is_main:
            print(self.memory.format(), flush=True)
        if cfg.plan:  # `locojax train --plan`: print the plan, load nothing, run nothing
            return
        self.memory.check()
        # Loaded straight into the training layout (replicated over every host's devices).
        model = models.load(
            cfg.model, seed=cfg.seed, **overrides,
            shardings=lambda c: weight_shardings(c, self.wiring.train_mesh, TRAIN_DP))
        params = model.weights
        # The reference policy is the starting point; copied because train_step donates state.
        self.ref_params = jax.tree.map(jnp.copy, params) if cfg.algo.beta > 0 else None
        self.state = train_state.init(params, self.learner_cfg.optim, self.model_cfg)
        self.runner = RewardRunner(cfg.reward)
        self.root_key = jax.random.key(cfg.seed)
        self.logger = MetricsLogger(cfg.run_dir, enabled=self.is_main, tensorboard=cfg.tensorboard)
        self.ckpt = Checkpointer(os.path.join(os.path.abspath(cfg.run_dir), "checkpoints"),
                                 keep=cfg.checkpoint.keep)
        # Admission state (pass-rate table, re-admission queue, data cursor): the same on
        # every host, advanced once per step, saved with the checkpoint.
        self.curator = build_curator(cfg, self.task)
        self.start_step, self.saved_rollouts = self._maybe_resume()
        self.last_step = cfg.steps  # moved earlier when time_limit_s runs out
        self.producer = build_producer(cfg, self.engine, self.tokenizer, self.task, self.runner,
                                       self.root_key, self.curator)
        self.rollouts: RolloutSource = self.wiring.rollout_source(self.producer)

    def _plan_memory(self) -> memory_plan.MemoryPlan:
        """The run's memory plan, from its programs compiled at its exact shapes (the run then
        reuses those compiles)."""
        cfg, mesh = self.cfg, self.wiring.train_mesh
        state = train_state.abstract(self.model_cfg, self.learner_cfg.optim, mesh,
                                     self.learner_cfg.rules)
        ref = state.params if cfg.algo.beta > 0 else None
        rows = cfg.rollout.prompts_per_step * cfg.group_size
        p, sampling = cfg.rollout.max_prompt_tokens, self.sampling
        columns = p + cfg.rollout.max_new_tokens
        if self.limits is not None:
            # Multi-turn: the batch holds whole trajectories, and the rollout's cache has the
            # limits' slots; planned as one generate call with a cache of that size.
            columns = p + self.limits.max_trajectory_tokens
            sampling = dataclasses.replace(sampling, max_new_tokens=self.limits.slots - p + 1)
        prefix = batch_lib.SharedPrefix(p, cfg.group_size)
        start, stop = self.wiring.host_slice(cfg.rollout.prompts_per_step)
        # Remote rollouts (the Ray modes): the workers generate, this engine never does, and
        # every batch carries its rows' staleness (a different train_step program).
        remote = self.wiring.remote_rollouts
        shapes = [] if remote else [
            memory_plan.EngineShape("rollout", stop - start, p, cfg.group_size, sampling)]
        eval_prompts = batch_rows(len(self._eval_examples()),
                                  cfg.eval.batch_size // self.host.num_processes)
        if cfg.eval.every and eval_prompts:
            shapes.append(memory_plan.EngineShape(
                "eval", eval_prompts, cfg.rollout.max_prompt_tokens, 1,
                greedy_sampling(self.tokenizer, cfg.rollout.max_new_tokens)))
        return memory_plan.plan(self.model_cfg, self.learner_cfg, state,
                                batch_lib.abstract(rows, columns, mesh, TRAIN_DP, prefix,
                                                   staleness=remote), ref,
                                mesh, self.engine, shapes, cfg.precision, cfg.device_memory_gb)

    # --- checkpoints -------------------------------------------------------------------------

    def _maybe_resume(self) -> tuple[int, tuple | None]:
        """(first step, the rollout source's checkpointed (arrays, JSON) or None)."""
        if self.ckpt.latest_step() is None:
            self.logger.truncate_after(-1)  # a fresh run owns its logs
            return 0, None
        if not self.cfg.checkpoint.resume:
            raise ValueError(f"{self.ckpt.directory} holds checkpoints of an earlier run; pass "
                             "--checkpoint.resume to continue it, or choose another --run-dir")
        self.state, meta = self.ckpt.restore(None, self.state)
        # The key is tiny and host-side: it travels in the JSON meta, identical on every host.
        self.root_key = jax.random.wrap_key_data(np.asarray(meta["rng"], np.uint32))
        step = int(meta["next_step"])
        if "curation" in meta:
            self.curator.load_state(meta["curation"])
        else:  # a checkpoint from before curation: the cursor was always step x B
            self.curator.step, self.curator.cursor = step, int(meta["data_cursor"])
        self.logger.truncate_after(step)  # lines are labelled 1..step for steps done
        log.info("resumed from %s at step %d", self.ckpt.directory, step)
        saved = (self.ckpt.restore_rollout(step), meta["rollouts"]) if "rollouts" in meta \
            else None
        return step, saved

    def _save(self, step: int) -> None:
        meta = {"next_step": step + 1, "data_cursor": self.curator.cursor,
                "curation": self.curator.state(),
                "rng": np.asarray(jax.random.key_data(self.root_key)).tolist(),
                "config": dataclasses.asdict(self.cfg), "mode": self.cfg.mode}
        arrays, meta["rollouts"] = self.rollouts.state(step + 1)  # buffer, leases, versions
        self.ckpt.save(step + 1, self.state, meta, arrays)

    # --- one step ----------------------------------------------------------------------------

    def step(self, step: int, timer: StepTimer) -> dict[str, float]:
        """Rollout, update and (when due) evaluation of one step; returns its metrics."""
        cfg = self.cfg
        record = self.rollouts.take(step, self.state.params, timer)  # generated by version ≤ step
        with timer.phase("batch") as ph:
            batch = self.wiring.global_batch(record.batch)
            ph.sync(batch)
        with timer.phase("train") as ph:
            self.state, metrics = update(self.state, batch, self.model_cfg, self.learner_cfg,
                                         self.ref_params, mesh=self.wiring.train_mesh)
            ph.sync(self.state.params)
        metrics.update(self.rollouts.publish(step + 1, self.state.params, timer))
        metrics.update(rollout_metrics(self.wiring.sum_over_hosts(record.sums)))
        with timer.phase("admission"):  # every host folds in every host's pass counts
            observations = record.observations if not cfg.curation.enabled \
                else self.wiring.gather_over_hosts(record.observations)
            metrics.update(self.curator.update(record.plan, observations))
        if cfg.dump_rollouts:
            self._dump(step, record.rollouts)
        if cfg.time_limit_s and self._out_of_time():
            self.last_step = step + 1  # this step is the run's last: evaluate and save it
        if cfg.eval.every and ((step + 1) % cfg.eval.every == 0 or step + 1 == self.last_step):
            with timer.phase("eval"):
                metrics.update(self.evaluate())
        return metrics

    def _out_of_time(self) -> bool:
        """Past time_limit_s on any host: decided together, so every host stops at one step."""
        late = float(time.monotonic() - self.started >= self.cfg.time_limit_s)
        return bool(self.wiring.sum_over_hosts({"late": np.float32(late)})["late"] > 0)

    def _checkpoint_due(self, step: int) -> bool:
        every = self.cfg.checkpoint.every
        return (every and (step + 1) % every == 0) or step + 1 == self.last_step

    def _dump(self, step: int, out) -> None:
        path = os.path.join(self.cfg.run_dir, "rollouts",
                            f"step{step + 1:05d}.host{self.host.process_id}.npz")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        extra = {} if out.env_mask is None else {"env_mask": out.env_mask}
        np.savez(path, group_ids=out.group_ids, tokens=out.tokens, mask=out.mask,
                 logprobs=out.logprobs, rewards=out.rewards, texts=np.asarray(out.texts), **extra)

    def _eval_examples(self) -> list:
        """This host's share of the held-out examples (equal shares on every host)."""
        n = min(self.cfg.eval.num_examples, len(self.task.test))
        n -= n % self.host.num_processes
        start, stop = self.wiring.host_slice(n)
        return [self.task.test[i] for i in range(start, stop)]

    def evaluate(self) -> dict[str, float]:
        cfg = self.cfg.eval
        examples = self._eval_examples()
        n = len(examples) * self.host.num_processes
        per_host = cfg.batch_size // self.host.num_processes
        local = evaluate(self.engine, self.wiring.rollout_weights(self.state.params),
                         self.tokenizer, self.task, self.runner, examples,
                         self.cfg.rollout.max_new_tokens, self.cfg.rollout.max_prompt_tokens,
                         batch_size=per_host, pool=self.producer.envs, limits=self.limits)
        self.runner.metrics()  # eval scoring is not rollout scoring: keep counters per step
        sums = self.wiring.sum_over_hosts({k: v * len(examples) for k, v in local.items()})
        out = {k: float(v) / n for k, v in sums.items()}
        return {**out, **derived(out)}

    # --- the run -----------------------------------------------------------------------------

    def run(self) -> dict[str, float]:
        cfg = self.cfg
        if cfg.plan:
            raise RuntimeError("a Trainer made with plan=True only plans; it has nothing to run")
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
                timer = StepTimer()
                last = self.step(step, timer)
                timings = {k: last.pop(k) for k in list(last) if k.startswith("perf/")}
                # Metrics are logged before the checkpoint that covers them, so a run killed
                # right after a save has already logged every step that save contains.
                self.logger.log(step + 1, last)
                if self._checkpoint_due(step):
                    with timer.phase("checkpoint"):
                        self._save(step)
                perf = {**timings, **timer.finish_step()}
                generated = last["rollout/response_length/mean"] * cfg.rollout.prompts_per_step \
                    * cfg.group_size
                perf["perf/tokens_per_s"] = generated / max(perf["perf/step_time"], 1e-9)
                perf["perf/elapsed_s"] = time.monotonic() - self.started
                if probe is not None:
                    perf.update(probe.measure())
                self.logger.log(step + 1, perf)
                trace.after_step(step)
                last.update(perf)
                progress.update(step + 1, last)
                if step + 1 == self.last_step:
                    break
        trace.close()
        self.rollouts.close()
        if self.is_main and self.start_step < cfg.steps:
            models.save(os.path.join(cfg.run_dir, FINAL_MODEL), self.model_cfg, self.state.params,
                        cfg.model, {"made_by": "locojax train", "steps": self.last_step})
        self.ckpt.close()
        self.runner.close()
        if self.producer.envs is not None:
            self.producer.envs.close()
        self.logger.close()
        return {**{f"before/{k}": v for k, v in before.items()}, **last}

