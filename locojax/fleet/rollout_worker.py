"""A rollout worker of the Ray modes: one host producing leased units of rollout work.

Like a colocated host without the training half: its own engine on its own local devices,
built from the run's parts (`train/build.py`) as every role's is, running the same
`Producer` (admission → generate → score → advantages → rows), fed leases by the
dispatcher, scoring with the verifier pool (`verifier.py`). What it owns is small: the one
weight version it holds (pulled whole from the parameter server, checksum verified, so no
weight tensor ever mixes two versions; with in-flight updates a row's later tokens may be
a newer whole version's, each token naming its own) and its compiled engine. Everything
else arrives with a lease (step, prompt slots, the version to use), so Ray can kill and
restart it at any point: the restarted actor warms up, then pulls the version the next
lease names.

Under LoRA a version is the adapters alone (the learner's `state.params`): the worker keeps
the base it loaded at start and samples from base + adapters merged into one copy per
version (`lora.merge`), so the checksum it returns covers exactly what crossed.

A lease names its version by number and checksum, and the worker reuses the copy it holds
only if both match: after a learner restart, version v may be other bytes than the v this
worker pulled before. It returns the checksum it generated with, which the dispatcher
checks against the lease's.

With `--inflight-chunk K` (async) the producer's engine is an `inflight.InFlightEngine`:
between decode chunks the worker asks the server for the newest version and takes it
(`ServerSource`: pulled whole, checksum verified on arrival); the record then carries each
token's version, and the worker returns the checksum of every version it took, which the
dispatcher checks against the ones the learner published. After the unit, the newest it
took becomes the version it holds. The logprob check covers the tokens of the unit's own
version (sampled over a cache that version wrote, so the trainer's forward must match).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import numpy as np
import ray

from locojax.fleet.actors import setup_process
from locojax.fleet.faults import Faults, FaultyTimer, hang
from locojax.fleet.inflight import InFlightEngine, token_versions
from locojax.fleet.leases import Lease
from locojax.fleet.parameter_server import TRANSIENT, ObjectStoreTransport
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


class ServerSource:
    """`inflight.VersionSource` of a worker: the parameter server's newest version, pulled
    and verified by the worker's transport, placed for its engine."""

    def __init__(self, worker: "RolloutWorker"):
        self.worker = worker

    def newest(self) -> int | None:
        if self.worker.faults.slow_version_check_s:
            time.sleep(self.worker.faults.slow_version_check_s)
        try:
            held = ray.get(self.worker.transport.server.versions.remote(), timeout=30)
        except TRANSIENT:  # the server is down or restarting: keep the version held
            return None
        return max(held) if held else None

    def take(self, version: int):
        w = self.worker
        tree, sync = w.transport.pull(version)  # verified against the server's checksum
        w.pull_bytes += float(sync.bytes)
        w.pull_seconds += sync.seconds
        return w.engine.place_weights(w._sampler_weights(tree)), sync.digest or checksum(tree)


@ray.remote
class RolloutWorker:
    """One rollout host: an engine on its local devices, generating leased units."""

    def __init__(self, index: int, cfg, devices: int, server, verifiers: list, faults: Faults,
                 verifier_timeout_s: float = 150.0, attempts: int = 3):
        setup_process()
        from locojax import distributed

        distributed.set_cpu_devices(devices)  # before anything touches the backend
        import jax

        from locojax import float_context
        from locojax.model import lora
        from locojax.train import meshes
        from locojax.train.build import RunParts

        self.index, self.cfg, self.faults = index, cfg, faults
        float_context.record(cfg.run_dir, f"worker{index}")
        parts = RunParts.of(cfg)
        self.parts = parts  # the gap's bound, as the learner's (`RunParts.gap_bound`)
        # `--rollout.tp`: data x tensor over this host's devices, as a colocated host's engine
        mesh, rules = meshes.rollout_mesh(cfg.rollout.tp, jax.local_devices())
        self.engine = parts.engine(mesh, rules)
        dump_dir = os.path.join(cfg.run_dir, "rollouts") if cfg.dump_rollouts else None
        pool = VerifierPool(verifiers, verifier_timeout_s, attempts, cfg.reward)
        chunk = cfg.placement.inflight_chunk
        self.inflight = InFlightEngine(self.engine, chunk, ServerSource(self)) if chunk else None
        self.pull_bytes = self.pull_seconds = 0.0  # in-flight pulls of the unit in progress
        self.producer = parts.producer(self.inflight or self.engine, pool, dump_dir)
        self.pool = pool
        # The starting weights, on this host's devices: only to compile before any lease;
        # under LoRA also the frozen base every version's adapters are merged into.
        self._warm_weights = parts.weights(mesh, rules)
        self.model_cfg = parts.model_cfg
        self.base = lora.base_copy(parts.model_cfg, self._warm_weights) \
            if lora.enabled(parts.model_cfg) else None
        # Faults.stale_sampler_at_step: the starting weights, which the sampler keeps using
        self._stale = self._warm_weights if faults.stale_sampler_at_step is not None else None
        self.transport = ObjectStoreTransport(server)
        self.version, self.digest, self.weights = None, None, None
        self._terms: tuple[tuple, float] | None = None  # ((version, digest), logit terms)

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
            if self.inflight is not None:
                self.inflight.begin(0, "warm-up", swap=False)
            record, _ = self.producer.produce(0, self.weights, 0, prompts_per_lease, StepTimer(),
                                              dump=False)
            self._logprob_gap(record, (0, -1))
            self.weights = self._warm_weights = None
            log.info("ready (engine mesh %s, warm-up %.1fs)", dict(self.engine.layout.mesh.shape),
                     time.perf_counter() - t)
        rows = prompts_per_lease * self.cfg.algo.group_size
        return os.getpid(), self.pool.lease_extra_s(self.producer.task.reward, rows)

    def produce(self, lease: Lease):
        """Generate `lease`'s unit starting with exactly the version it names, bytes and all:
        (its `RolloutRecord`, whose stats carry this worker's figures (pull, phases, the
        logprob check), the checksum of the weights it started with, and {version: checksum}
        of every version it took in flight)."""
        pull_bytes, pull_seconds = 0.0, 0.0
        self.pull_bytes = self.pull_seconds = 0.0
        if needs_pull((self.version, self.digest), lease):
            # Never keep two versions: the old one is gone before the new arrives. If the pull
            # fails (server down), the worker holds no version, not a stale label on None.
            self.weights, self.version, self.digest = None, None, None
            tree, sync, digest = pull_for(self.transport, lease)
            self.weights = self.engine.place_weights(self._sampler_weights(tree))
            self.version, self.digest = lease.version, digest
            pull_bytes, pull_seconds = float(sync.bytes), sync.seconds
        timer = FaultyTimer(self.faults, self.cfg.run_dir, self.index, lease.step, lease.unit)
        if self.inflight is not None:
            self.inflight.begin(self.version, self.digest)
        record, _ = self.producer.produce(lease.step, self._sampler(lease), lease.start,
                                          lease.stop, timer, version=self.version)
        record, taken = self._versions_of(record)
        with timer.phase("logprob_check"):
            gap = self._logprob_gap(record, (lease.step, lease.unit))
        seconds = {k[len("perf/"):]: v for k, v in timer.finish_step().items()}
        stats = record.stats + dataclasses.replace(
            gap, units=1.0, pull_bytes=pull_bytes + self.pull_bytes,
            pull_seconds=pull_seconds + self.pull_seconds, worker_seconds=seconds)
        digest = self.digest
        if self.inflight is not None and self.inflight.latest is not None:
            # The newest version taken is the one held now (the next lease likely names it).
            self.version, self.weights, self.digest = self.inflight.latest
            self.inflight.latest = None
        return dataclasses.replace(record, stats=stats), digest, taken

    def _versions_of(self, record):
        """(`record` with each token's version, {version: checksum} of those taken in flight
        beyond the unit's own), from the in-flight engine's schedule of each generate."""
        if self.inflight is None or not self.inflight.schedules:  # multi-turn: one version
            return record, {}
        schedules = self.inflight.schedules
        if len(schedules) > 1:
            raise RuntimeError(f"{len(schedules)} generates in one unit: in-flight updates "
                               "map one generate's columns to versions (no refill rounds)")
        n = self.producer.sampling.max_new_tokens
        versions = token_versions(record.batch.loss_mask, n, schedules[0])
        taken = {v: d for v, d in schedules[0].versions().items() if v != self.version}
        return dataclasses.replace(record, token_versions=versions), taken

    def _sampler_weights(self, tree):
        """What the engine samples a version's `tree` with: the params, or under LoRA the
        adapters merged into this worker's base."""
        from locojax.model import lora

        if self.base is None:
            return tree
        return lora.merge_jit(self.base, tree, self.model_cfg)

    def _sampler(self, lease: Lease):
        """The weights the engine samples `lease`'s unit with: those held (`self.weights`, the
        version the lease names), but under `Faults.stale_sampler_at_step` the starting
        ones: a sampler that kept stale weights, which the logprob check must catch."""
        at = self.faults.stale_sampler_at_step
        if at is not None and lease.step >= at and self.version:
            log.warning("fault injection: worker %d samples step %d unit %d with version 0's "
                        "weights, naming version %d", self.index, lease.step, lease.unit,
                        self.version)
            return self._stale
        return self.weights

    def _logprob_gap(self, record, unit: tuple[int, int]):
        """`RolloutStats` of the logprob check over the unit's response tokens, the trainer's
        forward run here on the weights this worker holds and names (`self.weights`), so a
        sampler that ran other weights shows: Σ |sampler − trainer| logprob and the tokens
        (`rollout/logprob_mismatch`), their histogram, and, if the largest gap passed the
        bound rounding explains (`RunParts.gap_bound`), the unit's key (version, step, unit)
        with its largest gap and the bound, which the learner's check stops the run on
        (`logprob_gap.check_units`). Every row, where the learner could only check rows of
        its own version (none, with the one-step overlap)."""
        from locojax.rl import logprob_gap
        from locojax.rl.logprobs import compute_logprobs
        from locojax.train.record import RolloutStats

        b = record.batch
        trainer, _ = compute_logprobs(self.weights, b.tokens, b.positions, b.attn_mask,
                                      model_cfg=self.engine.model_cfg,
                                      temperature=self.cfg.rollout.temperature)
        mask = np.asarray(b.loss_mask)
        if record.token_versions is not None:  # a token after a swap is another policy's
            mask = mask & (np.asarray(record.token_versions) == record.version)
        gap = np.where(mask, np.abs(np.asarray(trainer) - np.asarray(b.old_logprobs)), 0.0)
        stats = RolloutStats(logprob_gap=float(gap.sum()), logprob_tokens=float(mask.sum()),
                             logprob_gap_hist=logprob_gap.counts(gap[mask]))
        worst = float(gap.max(initial=0.0))
        bound = self.parts.gap_bound(self._logit_terms(), b.tokens.shape[1])
        if not worst > bound:  # as `logprob_gap.check`
            return stats
        key = logprob_gap.unit_key(record.version, *unit)
        log.warning("logprob check: %s sampled logprobs off its forward by up to %.3g, past "
                    "the rounding bound %.3g", key, worst, bound)
        return dataclasses.replace(stats, logprob_gap_past={key: worst},
                                   logprob_gap_bounds={key: bound})

    def _logit_terms(self) -> float:
        """`logprob_gap.logit_terms` of the weights held, once per version and checksum held
        (a pass over the LM head, which every unit of that version would repeat otherwise)."""
        from locojax.rl import logprob_gap

        held = (self.version, self.digest)
        if self._terms is None or self._terms[0] != held:
            self._terms = held, float(logprob_gap.logit_terms(self.weights,
                                                              self.engine.model_cfg))
        return self._terms[1]
