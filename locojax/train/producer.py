"""The producer half of an RL step: one host's prompts become its share of the train batch.

`Producer.produce(step, weights, start, stop)` admits global prompt slots [start, stop) of
`step` (the curator's admission, `curation.py`), generates G completions each on the host's
engine, scores them, refills groups without signal (dynamic sampling, `dynamic_sampling.py`),
computes the group-relative advantages and assembles the host-local rows of the training
batch. What it returns is the `RolloutRecord` that crosses from producer to consumer
(`record.py`: the rows, the sums behind the metrics, the version that generated them) and
the curator's `Feedback` (the step's admission and the pass counts of its groups), which
stays with the host that produced it. With `dump_dir` it writes the raw rows (tokens,
texts, rewards) there, where they were made: `step<s>.slots<start>-<stop>.npz`.

Every coordination mode runs this same code. `single` and `colocated` call it inline, on the
learner's own params, right before the update (the producer inline, depth 0); modes with
separate rollout workers run it there and hand the record over.

Everything a record holds is a function of (seed, step, slots, weights, curation table), so
a record made twice, on any host or layout, is the same record (and its dump the same file).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import Task
from locojax.envs.pool import EnvPool, env_deadline_s
from locojax.envs.rewards import RewardRunner
from locojax.profiler import StepTimer
from locojax.rl import algorithms
from locojax.rl import batch as batch_lib
from locojax.rl.config import AlgoConfig
from locojax.rollout import multi_turn
from locojax.rollout.lengths import tail_limits
from locojax.rollout.limits import Limits, MultiTurnConfig
from locojax.rollout.single_turn import Rollouts, rollout
from locojax.tokenizer import Tokenizer
from locojax.train import dynamic_sampling as ds
from locojax.train.curation import OBS_COLUMNS, Curator, Feedback
from locojax.train.record import RolloutRecord, RolloutStats

CORRECT = "_correct"
"""A hidden reward part: each row's correctness (reward ≥ 1) before any shaping. It rides in
`Rollouts.reward_parts` so that picking groups across refill rounds keeps it aligned."""

REFILL_KEY = 2**32 - 1
"""fold_in data of the branch of the root key that refill rounds sample from (steps, the
data of the other branch, never reach it)."""


class Producer:
    """Owns a host's engine, reward runner (multi-turn: env pool) and view of the data; holds
    no per-step state (the curator it reads is advanced once per step, on every host, by
    the rollout source that feeds it the step's `Feedback`: `source.InlineSource`)."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, task: Task, runner: RewardRunner,
                 curator: Curator, algo: AlgoConfig, sampling: SamplingConfig,
                 prompts_per_step: int, max_prompt_tokens: int, root_key: jax.Array,
                 dynamic: ds.DynamicSamplingConfig = ds.DynamicSamplingConfig(),
                 multi: MultiTurnConfig | None = None, limits: Limits | None = None,
                 dump_dir: str | None = None, rollout_fn=rollout,
                 tail: tuple[int, float] = (0, 1.0)):
        self.engine, self.tokenizer, self.task, self.runner = engine, tokenizer, task, runner
        self.curator, self.algo, self.sampling, self.dynamic = curator, algo, sampling, dynamic
        self.prompts_per_step, self.max_prompt_tokens = prompts_per_step, max_prompt_tokens
        self.root_key, self.dump_dir = root_key, dump_dir
        self.rollout_fn = rollout_fn  # tests swap in a model-free rollout
        self.tail = tail  # --rollout.tail-median, -sigma: per-row caps (`rollout/lengths.py`)
        # Set by the trainer (`train/early.py`): `dispatch`, given a step's train rows before
        # they are scored (advantages 0), starts the device work that needs no reward;
        # `wait` waits for it, in a phase of its own, once the rows are scored.
        self.early = None
        self.multi, self.limits, self.envs = multi, limits, None
        if task.multi_turn:  # this host's environments run here, on its own worker pool
            if tail[0]:
                raise ValueError("--rollout.tail-median caps single-turn rows only")
            if multi is None or limits is None:
                raise ValueError(f"task {task.name!r} is multi-turn: pass its MultiTurnConfig "
                                 "and resolved Limits")
            if dynamic.max_rounds or dynamic.overlong_filter or dynamic.overlong_buffer:
                # Refill rounds and overlong shaping are built on single-turn rows (a whole
                # response, cut at a stop token); trajectories carry env masks and counters.
                raise ValueError(f"task {task.name!r} is multi-turn: dynamic sampling and "
                                 "overlong shaping (--dynamic.*) are single-turn only so far")
            self.envs = EnvPool(multi.env_workers, env_deadline_s(multi.env_timeout_s, task))

    def produce(self, step: int, weights, start: int, stop: int, timer: StepTimer,
                version: int | None = None, dump: bool = True) -> tuple[RolloutRecord, Feedback]:
        """Slots [start, stop) of step `step`, generated with `weights` (version `version`,
        default `step`: the lock-step schedule); `dump=False` skips the dump (warm-ups)."""
        g, train = self.algo.group_size, self.task.train
        with timer.phase("admission"):
            admission = self.curator.admit(step)
            indices = np.asarray(admission.indices[start:stop])
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
        if self.early is not None:  # before the batch phase: its advantages (jnp ops)
            self.early.wait(timer)  # queue behind that work, and would hold the wait
        with timer.phase("batch"):
            out, local, stats = self.assemble(rounds, choice, zero_round0)
        version = step if version is None else version
        if self.dump_dir and dump:
            _dump(self.dump_dir, step, start, stop, version, out)
        return (RolloutRecord(step, version, local, stats),
                Feedback(admission, self._pad(observations, stop - start)))

    def assemble(self, rounds: list[Rollouts], choice: np.ndarray, zero_round0: int
                 ) -> tuple[Rollouts, batch_lib.TrainBatch, RolloutStats]:
        """The producer's `batch` phase: each slot's kept group (`choice`: its round), the
        group-relative advantages, the host-local train rows and the step's sums."""
        out = ds.select_groups(rounds, choice)
        adv, _ = algorithms.compute_advantages(self.algo, out.rewards, out.group_ids)
        return out, self.train_rows(out, np.asarray(adv)), \
            self._stats(out, rounds, choice, zero_round0)

    def train_rows(self, out: Rollouts, advantages: np.ndarray) -> batch_lib.TrainBatch:
        """The host-local train rows of `out` with these advantages; what `early` gets too
        (advantages 0), so every array but the advantages is the batch's own."""
        local = batch_lib.from_rollout(
            out.rows(out.prompt_tokens), out.rows(out.prompt_mask), out.tokens, out.mask,
            out.logprobs, advantages, out.group_ids, group_size=self.algo.group_size,
            context_mask=out.env_mask)
        if self.dynamic.overlong_filter:  # cut-off responses train nothing (DAPO)
            cut = ds.truncated(out.tokens, out.mask, self.sampling.stop_token_ids)
            local = dataclasses.replace(local, loss_mask=local.loss_mask & ~cut[:, None])
        return local

    def shaped(self, out: Rollouts) -> Rollouts:
        """A round's rows with their correctness kept apart (`CORRECT`) and the rewards
        shaped (`dynamic_sampling.shape_rewards`): the end of every rollout."""
        correct = (out.rewards >= 1.0 - 1e-6).astype(np.float32)  # before any shaping
        out = ds.shape_rewards(out, self.dynamic, self.sampling.max_new_tokens)
        return dataclasses.replace(out, reward_parts={**out.reward_parts, CORRECT: correct})

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
            # Early device work only where round 0's rows are surely the batch's: without
            # refill rounds, whose choice of groups needs the rewards.
            early = {} if self.early is None or self.dynamic.max_rounds else {
                "generated": lambda rows: self._early(rows, timer)}
            if self.tail[0]:
                early["limits"] = tail_limits(first_group, len(examples), g, *self.tail,
                                              self.sampling.max_new_tokens)
            out = self.rollout_fn(self.engine, weights, self.tokenizer, self.task, self.runner,
                                  examples, first_group=first_group, key=key,
                                  sampling=self.sampling, group_size=g,
                                  max_prompt_tokens=self.max_prompt_tokens, timer=timer, **early)
        return self.shaped(out)

    def _early(self, rows: Rollouts, timer: StepTimer) -> None:
        """Hand the step's rows, before scoring, to the trainer's early device work. The
        engine's cache goes first, as the rollout source drops it before the update: the
        memory plan has no program running beside it."""
        self.engine.release_cache()
        self.early.dispatch(self.train_rows(rows, np.zeros(len(rows.rewards), np.float32)),
                            timer)

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

    def _stats(self, out: Rollouts, rounds: list[Rollouts], choice: np.ndarray,
               zero_round0: int) -> RolloutStats:
        grouped = out.rewards.reshape(-1, self.algo.group_size)
        counters = self.runner.metrics()  # read-and-reset: this step's reward errors
        refill = None if not self.dynamic.max_rounds else ds.RefillStats(
            zero_std_round0=float(zero_round0), replaced=float(np.sum(choice > 0)),
            generated_groups=float(len(choice) * (len(rounds) - 1)))
        return RolloutStats(
            rows=float(len(out.rewards)), groups=float(grouped.shape[0]),
            reward=float(out.rewards.sum()), correct=float(out.reward_parts[CORRECT].sum()),
            response_tokens=float(out.mask.sum()),
            zero_std_groups=float(np.sum(grouped.max(1) == grouped.min(1))),
            truncated=float(ds.truncated(out.tokens, out.mask,
                                         self.sampling.stop_token_ids).sum()),
            reward_parts={k: float(v.sum()) for k, v in out.reward_parts.items() if k != CORRECT},
            reward_errors=float(counters.get("reward/errors", 0.0)),
            reward_timeouts=float(counters.get("reward/timeouts", 0.0)),
            decode_iterations=float(sum(r.decode_steps for r in rounds)),
            env=out.env, refill=refill)


def _dump(directory: str, step: int, start: int, stop: int, version: int, out: Rollouts) -> None:
    """The raw rows of slots [start, stop) of `step` (tokens, texts, rewards, each reward part
    as `part_<name>`, correctness before shaping), written atomically: a unit generated
    again (its worker died) writes the same name, so the file holds what was trained."""
    path = os.path.join(directory, f"step{step + 1:05d}.slots{start}-{stop}.npz")
    os.makedirs(directory, exist_ok=True)
    extra = {f"part_{k}": v for k, v in out.reward_parts.items() if k != CORRECT}
    if out.env_mask is not None:
        extra["env_mask"] = out.env_mask
    with open(path + ".tmp", "wb") as f:
        np.savez(f, group_ids=out.group_ids, tokens=out.tokens, mask=out.mask,
                 logprobs=out.logprobs, rewards=out.rewards, texts=np.asarray(out.texts),
                 correct=out.reward_parts[CORRECT] > 0, version=np.int64(version), **extra)
    os.replace(path + ".tmp", path)
