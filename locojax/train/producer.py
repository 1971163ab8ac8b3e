"""The producer half of an RL step: one host's prompts become its share of the train batch.

`Producer.produce(step, weights, start, stop)` admits global prompt slots [start, stop) of
`step`, generates G completions each on the host's engine, scores them, computes the
group-relative advantages and assembles the host-local rows of the training batch. What it
returns, a `RolloutRecord`, is the small typed record that crosses from producer to
consumer (STYLE.md 13): numpy rows, per-step sums for the metrics, and the weight version
that generated them.

Every coordination mode runs this same code. `single` and `colocated` call it inline, on the
learner's own params, right before the update (the producer inline, depth 0); modes with
separate rollout workers run it there and hand the record over.

Everything a record holds is a function of (seed, step, slots, weights), so a record made
twice, on any host or layout, is the same record.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import Task
from locojax.envs.pool import EnvPool
from locojax.envs.rewards import RewardRunner
from locojax.profiler import StepTimer
from locojax.rl import algorithms
from locojax.rl import batch as batch_lib
from locojax.rl.config import AlgoConfig
from locojax.rollout import multi_turn
from locojax.rollout.limits import Limits, MultiTurnConfig
from locojax.rollout.single_turn import Rollouts, rollout
from locojax.tokenizer import Tokenizer
from locojax.train.data import PromptStream

REWARD_COUNTERS = ("reward/errors", "reward/timeouts")
"""The reward runner's counters that are summed into a record (per step, per host)."""


@dataclasses.dataclass
class RolloutRecord:
    """One host's share of one step's rollouts, ready for the learner."""

    step: int  # the step whose prompts these are
    version: int  # the weight version (learner steps applied) that generated them
    batch: batch_lib.TrainBatch  # host-local numpy rows, prompt-major
    sums: dict[str, float]  # per-host sums behind the rollout metrics (`rollout_metrics`)
    rollouts: Rollouts  # the raw rows (texts, rewards), for dumps


class Producer:
    """Owns a host's engine, reward runner (multi-turn: env pool) and view of the data;
    holds no per-step state."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, task: Task, runner: RewardRunner,
                 stream: PromptStream, algo: AlgoConfig, sampling: SamplingConfig,
                 prompts_per_step: int, max_prompt_tokens: int, root_key: jax.Array,
                 multi: MultiTurnConfig | None = None, limits: Limits | None = None):
        self.engine, self.tokenizer, self.task, self.runner = engine, tokenizer, task, runner
        self.stream, self.algo, self.sampling = stream, algo, sampling
        self.prompts_per_step, self.max_prompt_tokens = prompts_per_step, max_prompt_tokens
        self.root_key = root_key
        self.multi, self.limits, self.envs = multi, limits, None
        if task.multi_turn:  # this host's environments run here, on its own worker pool
            if multi is None or limits is None:
                raise ValueError(f"task {task.name!r} is multi-turn: pass its MultiTurnConfig "
                                 "and resolved Limits")
            self.envs = EnvPool(multi.env_workers, multi.env_timeout_s)

    def produce(self, step: int, weights, start: int, stop: int, timer: StepTimer,
                version: int | None = None) -> RolloutRecord:
        """Slots [start, stop) of step `step`, generated with `weights` (version `version`,
        default `step`: the lock-step schedule)."""
        b, g = self.prompts_per_step, self.algo.group_size
        with timer.phase("admission"):
            examples = self.stream.take(step, b, start, stop)
        key = jax.random.fold_in(self.root_key, step)
        if self.envs is not None:
            out = multi_turn.rollout(self.engine, weights, self.tokenizer, self.task, self.envs,
                                     examples, first_group=step * b + start, key=key,
                                     sampling=self.sampling, group_size=g, limits=self.limits,
                                     timer=timer, compact=self.multi.compact)
        else:
            out = rollout(self.engine, weights, self.tokenizer, self.task, self.runner,
                          examples, first_group=step * b + start, key=key,
                          sampling=self.sampling, group_size=g,
                          max_prompt_tokens=self.max_prompt_tokens, timer=timer)
        with timer.phase("batch"):
            adv, _ = algorithms.compute_advantages(self.algo, out.rewards, out.group_ids)
            local = batch_lib.from_rollout(
                out.rows(out.prompt_tokens), out.rows(out.prompt_mask), out.tokens, out.mask,
                out.logprobs, np.asarray(adv), out.group_ids, group_size=g,
                context_mask=out.env_mask)
        return RolloutRecord(step=step, version=step if version is None else version,
                             batch=local, sums=self._sums(out), rollouts=out)

    def _sums(self, out: Rollouts) -> dict[str, float]:
        grouped = out.rewards.reshape(-1, self.algo.group_size)
        counters = self.runner.metrics()  # read-and-reset: this step's reward errors
        return {
            "rows": float(len(out.rewards)),
            "reward": float(out.rewards.sum()),
            "correct": float(np.sum(out.rewards >= 1.0 - 1e-6)),
            "length": float(out.mask.sum()),
            "groups": float(grouped.shape[0]),
            "zero_std": float(np.sum(grouped.max(1) == grouped.min(1))),
            **{f"part/{k}": float(v.sum()) for k, v in out.reward_parts.items()},
            **{k: float(counters.get(k, 0.0)) for k in REWARD_COUNTERS},
            **out.stats,  # multi-turn: env counters and sums
        }


def rollout_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The logged rollout metrics from `RolloutRecord.sums` summed over every host."""
    n = float(sums["rows"])
    m = {
        "reward/mean": float(sums["reward"]) / n,
        "rollout/accuracy": float(sums["correct"]) / n,
        "rollout/response_length/mean": float(sums["length"]) / n,
        "rollout/frac_zero_std": float(sums["zero_std"]) / float(sums["groups"]),
        **{k: float(sums[k]) for k in REWARD_COUNTERS},
    }
    m.update({f"reward/{k[5:]}/mean": float(v) / n for k, v in sums.items()
              if k.startswith("part/")})
    m.update(multi_turn.env_metrics(sums))
    return m
