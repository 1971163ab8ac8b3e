"""Rollout workers and the reward/verifier pool: the producers of the Ray modes.

A `RolloutWorker` is one host, like a colocated host without the training half: its own
engine on its own local devices, the same `Producer` (admission → generate → score →
advantages → rows), fed leases by the dispatcher. What it owns is small: the one weight
version it holds (pulled whole from the parameter server, checksum verified, so a sample
never mixes two versions) and its compiled engine. Everything else arrives with a lease
(step, prompt slots, the version to use), so Ray can kill and restart it at any point:
the restarted actor warms up, then pulls the version the next lease names.

Rewards are scored by a pool of `Verifier` actors (RLAX's verifier pool): the worker's
producer is handed a `VerifierPool` in place of a local `RewardRunner`, which splits each
batch over the verifiers, each guarding its calls with its own `RewardRunner` (timeouts,
errors). Scoring is idempotent, so a verifier restarted by Ray is simply asked again.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import ray

from locojax.envs.rewards import RewardConfig, RewardRunner, Scores
from locojax.train.leases import Lease
from locojax.train.modes.faults import FaultPlan, FaultyTimer
from locojax.train.modes.roles import setup_logging
from locojax.train.modes.transport import ObjectStoreTransport

log = logging.getLogger(__name__)


@ray.remote
class Verifier:
    """Scores completions with its own guarded `RewardRunner`."""

    def __init__(self, index: int, config: RewardConfig):
        setup_logging()
        self.index, self.runner = index, RewardRunner(config)

    def __repr__(self) -> str:
        return f"verifier {self.index}"

    def score(self, fn, completions: list[str], examples: list) -> tuple[Scores, dict]:
        scores = self.runner.score_batch(fn, completions, examples)
        return scores, self.runner.metrics()


class VerifierPool:
    """The `RewardRunner` interface the producer uses, served by `Verifier` actors."""

    def __init__(self, verifiers: list):
        self.verifiers = verifiers
        self._counts: dict[str, float] = {}

    def score_batch(self, fn, completions, examples) -> Scores:
        n = len(completions)
        bounds = np.linspace(0, n, min(len(self.verifiers), max(n, 1)) + 1).astype(int)
        refs = [v.score.remote(fn, list(completions[a:b]), list(examples[a:b]))
                for v, a, b in zip(self.verifiers, bounds[:-1], bounds[1:])]
        results = ray.get(refs)
        for _, counts in results:
            for k, v in counts.items():
                if not k.endswith("/mean"):  # part means are recomputed from the rows
                    self._counts[k] = self._counts.get(k, 0.0) + v
        parts = {k: np.concatenate([s.parts[k] for s, _ in results]) for k in results[0][0].parts}
        return Scores(np.concatenate([s.total for s, _ in results]), parts)

    def metrics(self, reset: bool = True) -> dict[str, float]:
        out = dict(self._counts)
        if reset:
            self._counts = {}
        return out

    def close(self) -> None:
        pass


@ray.remote
class RolloutWorker:
    """One rollout host: an engine on its local devices, generating leased units."""

    def __init__(self, index: int, cfg, devices: int, server, verifiers: list,
                 faults: FaultPlan):
        setup_logging()
        from locojax import distributed

        distributed.set_cpu_devices(devices)  # before anything touches the backend
        import jax

        from locojax import models
        from locojax.engine.engine import Engine
        from locojax.model.sharding import ROLLOUT_REPLICATED, make_mesh, weight_shardings
        from locojax.train.config import COMPUTE_DTYPES
        from locojax.train.loop import build_producer, build_task

        self.index, self.cfg, self.faults = index, cfg, faults
        mesh = make_mesh({"data": jax.local_device_count()}, jax.local_devices())
        task = build_task(cfg.task, cfg.seed, cfg.multiturn.max_turns)
        # The starting weights, on this host's devices: only to compile before any lease.
        # Computing in the run's precision, as the learner's engine does.
        model = models.load(cfg.model, seed=cfg.seed, param_dtype="float32",
                            compute_dtype=COMPUTE_DTYPES[cfg.precision],
                            shardings=lambda c: weight_shardings(c, mesh, ROLLOUT_REPLICATED))
        self.engine = Engine(model.cfg, mesh=mesh, rules=ROLLOUT_REPLICATED)
        self.producer = build_producer(cfg, self.engine, model.tokenizer, task,
                                       VerifierPool(verifiers), jax.random.key(cfg.seed))
        self._warm_weights = model.weights
        self.transport = ObjectStoreTransport(server)
        self.version, self.weights = None, None

    def __repr__(self) -> str:
        return f"worker {self.index}"

    def ready(self, prompts_per_lease: int) -> int:
        """Compile for the lease shape (one throw-away unit, with the starting weights, and its
        logprob check), so no lease's deadline pays for compiling; returns the pid."""
        if self._warm_weights is not None:
            from locojax.profiler import StepTimer

            t = time.perf_counter()
            self.weights = self._warm_weights  # the check below runs on `self.weights`
            self._logprob_gap(self.producer.produce(0, self.weights, 0, prompts_per_lease,
                                                    StepTimer()))
            self.weights = self._warm_weights = None
            log.info("ready (warm-up %.1fs)", time.perf_counter() - t)
        return os.getpid()

    def produce(self, lease: Lease):
        """Generate `lease`'s unit with exactly the version it names; (record, info)."""
        pull = {"bytes": 0, "seconds": 0.0}
        if self.version != lease.version:
            # Never keep two versions: the old one is gone before the new arrives. If the pull
            # fails (server down), the worker holds no version, not a stale label on None.
            self.weights, self.version = None, None
            tree, stats = self.transport.pull(lease.version)
            self.weights = self.engine.place_weights(tree)
            self.version = lease.version
            pull = {"bytes": stats.bytes, "seconds": stats.seconds}
        timer = FaultyTimer(self.faults, self.cfg.run_dir, self.index, lease.step)
        record = self.producer.produce(lease.step, self.weights, lease.start, lease.stop, timer,
                                       version=self.version)
        with timer.phase("logprob_check"):
            record.sums.update(self._logprob_gap(record))
        info = {"worker": self.index, "version": self.version, "pull": pull,
                "perf": timer.finish_step()}
        return record, info

    def _logprob_gap(self, record) -> dict[str, float]:
        """Σ |sampler − trainer| logprob over the unit's response tokens, the trainer's forward
        run here on the same version: `rollout/logprob_mismatch` for every row, where the
        learner can only check rows of its own version (none, with the one-step overlap)."""
        from locojax.rl.train_step import compute_logprobs

        b = record.batch
        trainer, _ = compute_logprobs(self.weights, b.tokens, b.positions, b.attn_mask,
                                      model_cfg=self.engine.model_cfg,
                                      temperature=self.cfg.rollout.temperature)
        mask = np.asarray(b.loss_mask)
        gap = np.where(mask, np.abs(np.asarray(trainer) - np.asarray(b.old_logprobs)), 0.0)
        return {"logprob_gap": float(gap.sum()), "logprob_tokens": float(mask.sum())}
