"""The producer half of an RL step: one host's prompts become its share of the train batch.

`Producer.produce(step, weights, start, stop)` admits global prompt slots [start, stop) of
`step` (the curator's plan, `curation.py`), generates G completions each on the host's
engine, scores them, refills groups without signal (dynamic sampling, `dynamic_sampling.py`),
computes the group-relative advantages and assembles the host-local rows of the training
batch. What it returns, a `RolloutRecord`, is the small typed record that crosses from
producer to consumer (STYLE.md 13): numpy rows, per-step sums for the metrics, the pass
counts the curator learns from, and the weight version that generated them.

Every coordination mode runs this same code. `single` and `colocated` call it inline, on the
learner's own params, right before the update (the producer inline, depth 0); modes with
separate rollout workers run it there and hand the record over.

Everything a record holds is a function of (seed, step, slots, weights, curation table), so
a record made twice, on any host or layout, is the same record.
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
from locojax.train import dynamic_sampling as ds
from locojax.train.curation import OBS_COLUMNS, Curator, Plan

CORRECT = "_correct"
"""A hidden reward part: each row's correctness (reward ≥ 1) before any shaping. It rides in
`Rollouts.reward_parts` so that picking groups across refill rounds keeps it aligned."""

REFILL_KEY = 2**32 - 1
"""fold_in data of the branch of the root key that refill rounds sample from (steps, the
data of the other branch, never reach it)."""

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
    plan: Plan  # the step's admission (all B global slots; this host used [start, stop))
    observations: np.ndarray  # [B_host · (1 + max_rounds), 5] int32 pass counts, curation.py


class Producer:
    """Owns a host's engine, reward runner (multi-turn: env pool) and view of the data; holds
    no per-step state (the curator it reads is advanced by the trainer, once per step, on
    every host)."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, task: Task, runner: RewardRunner,
                 curator: Curator, algo: AlgoConfig, sampling: SamplingConfig,
                 prompts_per_step: int, max_prompt_tokens: int, root_key: jax.Array,
                 dynamic: ds.DynamicSamplingConfig = ds.DynamicSamplingConfig(),
                 multi: MultiTurnConfig | None = None, limits: Limits | None = None,
                 rollout_fn=rollout):
        self.engine, self.tokenizer, self.task, self.runner = engine, tokenizer, task, runner
        self.curator, self.algo, self.sampling, self.dynamic = curator, algo, sampling, dynamic
        self.prompts_per_step, self.max_prompt_tokens = prompts_per_step, max_prompt_tokens
        self.root_key = root_key
        self.rollout_fn = rollout_fn  # tests swap in a model-free rollout
        self.multi, self.limits, self.envs = multi, limits, None
        if task.multi_turn:  # this host's environments run here, on its own worker pool
            if multi is None or limits is None:
                raise ValueError(f"task {task.name!r} is multi-turn: pass its MultiTurnConfig "
                                 "and resolved Limits")
            if dynamic.max_rounds or dynamic.overlong_filter or dynamic.overlong_buffer:
                # Refill rounds and overlong shaping are built on single-turn rows (a whole
                # response, cut at a stop token); trajectories carry env masks and counters.
                raise ValueError(f"task {task.name!r} is multi-turn: dynamic sampling and "
                                 "overlong shaping (--dynamic.*) are single-turn only so far")
            self.envs = EnvPool(multi.env_workers, multi.env_timeout_s)

    def produce(self, step: int, weights, start: int, stop: int, timer: StepTimer,
                version: int | None = None) -> RolloutRecord:
        """Slots [start, stop) of step `step`, generated with `weights` (version `version`,
        default `step`: the lock-step schedule)."""
        g, train = self.algo.group_size, self.task.train
        with timer.phase("admission"):
            plan = self.curator.plan(step)
            indices = np.asarray(plan.indices[start:stop])
        rounds = [self._generate(weights, [train[i] for i in indices], step, start, 0, timer)]
        choice = np.zeros(stop - start, np.int64)  # the round whose group each slot keeps
        observations = [self._observe(rounds[0], start, 0, indices)]
        live = ds.zero_variance(rounds[0].rewards, g)  # slots still without signal
        zero_round0 = int(live.sum())
        for r in range(1, self.dynamic.max_rounds + 1):
            if not live.any():
                break
            with timer.phase("admission"):
                cand = np.asarray([self.curator.refill_index(step, start + j, r)
                                   for j in range(stop - start)])
            out = self._generate(weights, [train[i] for i in cand], step, start, r, timer)
            rounds.append(out)
            choice[live] = r
            observations.append(self._observe(out, start, r, cand, live))
            live = live & ds.zero_variance(out.rewards, g)
        with timer.phase("batch"):
            out = ds.select_groups(rounds, choice)
            adv, _ = algorithms.compute_advantages(self.algo, out.rewards, out.group_ids)
            local = batch_lib.from_rollout(
                out.rows(out.prompt_tokens), out.rows(out.prompt_mask), out.tokens, out.mask,
                out.logprobs, np.asarray(adv), out.group_ids, group_size=g,
                context_mask=out.env_mask)
            if self.dynamic.overlong_filter:  # cut-off responses train nothing (DAPO)
                cut = ds.truncated(out.tokens, out.mask, self.sampling.stop_token_ids)
                local = dataclasses.replace(local, loss_mask=local.loss_mask & ~cut[:, None])
            sums = self._sums(out, rounds, choice, zero_round0)
        return RolloutRecord(step=step, version=step if version is None else version,
                             batch=local, sums=sums, rollouts=out, plan=plan,
                             observations=self._pad(observations, stop - start))

    def _generate(self, weights, examples, step: int, start: int, round_: int,
                  timer: StepTimer) -> Rollouts:
        """One rollout of the host's slots; round 0 samples with `fold_in(key, step)` as
        before dynamic sampling existed, refill rounds on their own branch of the key."""
        key = jax.random.fold_in(self.root_key, step)
        if round_:
            key = jax.random.fold_in(jax.random.fold_in(
                jax.random.fold_in(self.root_key, REFILL_KEY), step), round_)
        first_group, g = step * self.prompts_per_step + start, self.algo.group_size
        if self.envs is not None:
            out = multi_turn.rollout(self.engine, weights, self.tokenizer, self.task, self.envs,
                                     examples, first_group=first_group, key=key,
                                     sampling=self.sampling, group_size=g, limits=self.limits,
                                     timer=timer, compact=self.multi.compact)
        else:
            out = self.rollout_fn(self.engine, weights, self.tokenizer, self.task, self.runner,
                                  examples, first_group=first_group, key=key,
                                  sampling=self.sampling, group_size=g,
                                  max_prompt_tokens=self.max_prompt_tokens, timer=timer)
        correct = (out.rewards >= 1.0 - 1e-6).astype(np.float32)  # before any shaping
        out = ds.shape_rewards(out, self.dynamic, self.sampling.max_new_tokens)
        return dataclasses.replace(out, reward_parts={**out.reward_parts, CORRECT: correct})

    def _observe(self, out: Rollouts, start: int, round_: int, indices: np.ndarray,
                 used: np.ndarray | None = None) -> np.ndarray:
        """Observation rows (curation.OBS_COLUMNS) of the slots that used this round."""
        g = self.algo.group_size
        solved = out.reward_parts[CORRECT].reshape(-1, g).sum(axis=1)
        slots = np.arange(start, start + len(indices))
        rows = np.stack([slots, np.full_like(slots, round_), indices, solved,
                         np.full_like(slots, g)], axis=1).astype(np.int32)
        return rows if used is None else rows[used]

    def _pad(self, observations: list[np.ndarray], slots: int) -> np.ndarray:
        """A fixed [slots · (1 + max_rounds), 5] array (slot -1 pads), so hosts can gather it."""
        rows = np.concatenate(observations, axis=0)
        pad = np.full((slots * (1 + self.dynamic.max_rounds) - len(rows), len(OBS_COLUMNS)), -1,
                      np.int32)
        return np.concatenate([rows, pad], axis=0)

    def _sums(self, out: Rollouts, rounds: list[Rollouts], choice: np.ndarray,
              zero_round0: int) -> dict[str, float]:
        grouped = out.rewards.reshape(-1, self.algo.group_size)
        counters = self.runner.metrics()  # read-and-reset: this step's reward errors
        parts = {k: v for k, v in out.reward_parts.items() if k != CORRECT}
        sums = {
            "rows": float(len(out.rewards)),
            "reward": float(out.rewards.sum()),
            "correct": float(out.reward_parts[CORRECT].sum()),
            "length": float(out.mask.sum()),
            "groups": float(grouped.shape[0]),
            "zero_std": float(np.sum(grouped.max(1) == grouped.min(1))),
            "truncated": float(ds.truncated(out.tokens, out.mask,
                                            self.sampling.stop_token_ids).sum()),
            **{f"part/{k}": float(v.sum()) for k, v in parts.items()},
            **{k: float(counters.get(k, 0.0)) for k in REWARD_COUNTERS},
            **out.stats,  # multi-turn: env counters and sums
        }
        if self.dynamic.max_rounds:
            sums.update({"refill/zero_std_round0": float(zero_round0),
                         "refill/replaced": float(np.sum(choice > 0)),
                         "refill/generated_groups": float(len(choice) * (len(rounds) - 1))})
        return sums


def rollout_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The logged rollout metrics from `RolloutRecord.sums` summed over every host."""
    n, groups = float(sums["rows"]), float(sums["groups"])
    m = {
        "reward/mean": float(sums["reward"]) / n,
        "rollout/accuracy": float(sums["correct"]) / n,
        "rollout/response_length/mean": float(sums["length"]) / n,
        "rollout/frac_zero_std": float(sums["zero_std"]) / groups,
        "rollout/frac_truncated": float(sums["truncated"]) / n,
        **{k: float(sums[k]) for k in REWARD_COUNTERS},
    }
    m.update({f"reward/{k[5:]}/mean": float(v) / n for k, v in sums.items()
              if k.startswith("part/")})
    m.update(multi_turn.env_metrics(sums))
    if "refill/replaced" in sums:
        # Zero-variance groups after round 0 and after the last round: the gap is what
        # dynamic sampling bought; generated_groups is what it cost.
        m.update({"rollout/refill/frac_zero_std_round0": float(sums["refill/zero_std_round0"])
                  / groups,
                  "rollout/refill/replaced": float(sums["refill/replaced"]),
                  "rollout/refill/generated_groups": float(sums["refill/generated_groups"])})
    return m
