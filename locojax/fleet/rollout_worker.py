"""A rollout worker of the Ray modes: one host producing leased units of rollout work.

Like a colocated host without the training half: its own engine on its own local devices,
built from the run's parts (`train/build.py`) as every role's is, running the same
`Producer` (admission → generate → score → advantages → rows), fed leases by the
dispatcher, scoring with the verifier pool (`verifier.py`). What it owns is small: the one
weight version it holds (pulled whole from the parameter server, checksum verified, so a
sample never mixes two versions) and its compiled engine. Everything else arrives with a
lease (step, prompt slots, the version to use), so Ray can kill and restart it at any
point: the restarted actor warms up, then pulls the version the next lease names.

A lease names its version by number and checksum, and the worker reuses the copy it holds
only if both match: after a learner restart, version v may be other bytes than the v this
worker pulled before. It returns the checksum it generated with, which the dispatcher
checks against the lease's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import numpy as np
import ray

from locojax.fleet.actors import setup_logging
from locojax.fleet.faults import Faults, FaultyTimer, hang
from locojax.fleet.leases import Lease
from locojax.fleet.parameter_server import ObjectStoreTransport
from locojax.fleet.verifier import VerifierPool
from locojax.fleet.versions import checksum

log = logging.getLogger(__name__)


def needs_pull(held: tuple[int | None, str | None], lease: Lease) -> bool:
    """Whether the (version, checksum) a worker holds is not the one `lease` names: the
    number alone is not enough, as a restarted learner may publish other bytes under it."""
    return held != (lease.version, lease.digest)


def pull_for(transport, lease: Lease):
    """(The tree of `lease`'s version, its `SyncStats`, the checksum of the bytes that
    arrived): computed from the bytes (the transport's own verification, else here), never
    copied from the lease, so the dispatcher's comparison can fire."""
    tree, sync = transport.pull(lease.version, lease.digest or None)
    return tree, sync, sync.digest or checksum(tree)


@ray.remote
class RolloutWorker:
    """One rollout host: an engine on its local devices, generating leased units."""

    def __init__(self, index: int, cfg, devices: int, server, verifiers: list, faults: Faults,
                 verifier_timeout_s: float = 150.0, attempts: int = 3):
        setup_logging()
        from locojax import distributed

        distributed.set_cpu_devices(devices)  # before anything touches the backend
        import jax

        from locojax import float_context
        from locojax.train import meshes
        from locojax.train.build import RunParts

        self.index, self.cfg, self.faults = index, cfg, faults
        float_context.record(cfg.run_dir, f"worker{index}")
        parts = RunParts.of(cfg)
        # `--rollout.tp`: data x tensor over this host's devices, as a colocated host's engine
        mesh, rules = meshes.rollout_mesh(cfg.rollout.tp, jax.local_devices())
        self.engine = parts.engine(mesh, rules)
        dump_dir = os.path.join(cfg.run_dir, "rollouts") if cfg.dump_rollouts else None
        pool = VerifierPool(verifiers, verifier_timeout_s, attempts, cfg.reward)
        self.producer = parts.producer(self.engine, pool, dump_dir)
        self.pool = pool
        # The starting weights, on this host's devices: only to compile before any lease.
        self._warm_weights = parts.weights(mesh, rules)
        self.transport = ObjectStoreTransport(server)
        self.version, self.digest, self.weights = None, None, None

    def __repr__(self) -> str:
        return f"worker {self.index}"

    def ready(self, prompts_per_lease: int) -> tuple[int, float]:
        """Compile for the lease shape (one throw-away unit, with the starting weights, and its
        logprob check), so no lease's deadline pays for compiling; returns (the pid, the time
        a lease needs beyond --lease-timeout-s for its rows' reward deadlines)."""
        if self.faults.hang_warmup:
            hang(f"worker {self.index} warming up")
        if self._warm_weights is not None:
            from locojax.profiler import StepTimer

            t = time.perf_counter()
            self.weights = self._warm_weights  # the check below runs on `self.weights`
            record, _ = self.producer.produce(0, self.weights, 0, prompts_per_lease, StepTimer(),
                                              dump=False)
            self._logprob_gap(record)
            self.weights = self._warm_weights = None
            log.info("ready (engine mesh %s, warm-up %.1fs)", dict(self.engine.layout.mesh.shape),
                     time.perf_counter() - t)
        rows = prompts_per_lease * self.cfg.algo.group_size
        return os.getpid(), self.pool.lease_extra_s(self.producer.task.reward, rows)

    def produce(self, lease: Lease):
        """Generate `lease`'s unit with exactly the version it names, bytes and all: (its
        `RolloutRecord`, whose stats carry this worker's figures (pull, phases, the logprob
        check), and the checksum of the weights it generated with)."""
        pull_bytes, pull_seconds = 0.0, 0.0
        if needs_pull((self.version, self.digest), lease):
            # Never keep two versions: the old one is gone before the new arrives. If the pull
            # fails (server down), the worker holds no version, not a stale label on None.
            self.weights, self.version, self.digest = None, None, None
            tree, sync, digest = pull_for(self.transport, lease)
            self.weights = self.engine.place_weights(tree)
            self.version, self.digest = lease.version, digest
            pull_bytes, pull_seconds = float(sync.bytes), sync.seconds
        timer = FaultyTimer(self.faults, self.cfg.run_dir, self.index, lease.step, lease.unit)
        record, _ = self.producer.produce(lease.step, self.weights, lease.start, lease.stop, timer,
                                          version=self.version)
        with timer.phase("logprob_check"):
            gap, tokens = self._logprob_gap(record)
        seconds = {k[len("perf/"):]: v for k, v in timer.finish_step().items()}
        stats = record.stats + type(record.stats)(
            logprob_gap=gap, logprob_tokens=tokens, units=1.0, pull_bytes=pull_bytes,
            pull_seconds=pull_seconds, worker_seconds=seconds)
        return dataclasses.replace(record, stats=stats), self.digest

    def _logprob_gap(self, record) -> tuple[float, float]:
        """(Σ |sampler − trainer| logprob, tokens) over the unit's response tokens, the
        trainer's forward run here on the same version: `rollout/logprob_mismatch` for every
        row, where the learner could only check rows of its own version (none, with the
        one-step overlap)."""
        from locojax.rl.logprobs import compute_logprobs

        b = record.batch
        trainer, _ = compute_logprobs(self.weights, b.tokens, b.positions, b.attn_mask,
                                      model_cfg=self.engine.model_cfg,
                                      temperature=self.cfg.rollout.temperature)
        mask = np.asarray(b.loss_mask)
        gap = np.where(mask, np.abs(np.asarray(trainer) - np.asarray(b.old_logprobs)), 0.0)
        return float(gap.sum()), float(mask.sum())
