"""The dispatcher: leases units to rollout workers and keeps the versioned buffer.

The queue between producers and the consumer (STYLE.md 13). It owns a `LeaseTable` (who
holds which unit, until when), a `RolloutBuffer` (finished units, tagged with their
version) and the newest published version (the admission gate). One thread runs the
dispatch loop; learner hosts call `take` from others (a threaded actor):

    loop: expire leases past their deadline (the hung worker is restarted)
          → hand each idle worker the oldest admitted unit, naming its version's checksum
          → wait for any result: a record goes to the buffer if its lease is still held
            (else it is late and dropped); a dead worker's lease goes back to the queue
            and Ray restarts the worker; a parameter server that is down makes the lease
            go back and the worker wait a moment; anything else stops the run.

Retries are bounded (`leases.UnitFailed`): a unit's `max_attempts`-th failure stops the run
with an error naming the step, the unit, the worker and the last error, and so does a
worker that cannot start at all, or whose warm-up (which no lease's deadline covers) missed
`start_timeout_s` that many times in a row. The learner asks `waiting_for(step)` when it has waited
long for a step, and logs the answer.

Learner host p's `take(step)` blocks until every unit of `step` is in and returns its rows
(host 0 also gets the queue's own figures, `DispatchStats`); once every host has taken a
step, it is retired. `snapshot` gives the state a checkpoint
holds and `begin` restores it (or starts afresh), with `pause` in between while a learner
group restarts, so no host takes from a buffer that is about to be rewound.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import numpy as np
import ray

from locojax.fleet.actors import setup_process
from locojax.fleet.buffer import RolloutBuffer
from locojax.fleet.leases import Lease, LeaseTable, UnitFailed
from locojax.fleet.placement import PlacementPlan
from locojax.fleet.versions import VersionUnavailable, WeightMismatch
from locojax.train.record import RolloutRecord

log = logging.getLogger(__name__)

_DEAD = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
RETRY_S = 0.5
"""Pause before a worker retries after a transient failure (server down, restarting)."""
READY_ATTEMPTS = 120
"""How many times (RETRY_S apart, after its first failure) a restarting worker is asked
whether it is up before the run gives up on it."""


@dataclasses.dataclass(frozen=True)
class DispatchStats:
    """The queue's own figures when a step is taken (wall-clock: they go to perf.jsonl)."""

    redispatched: int  # units put back after a dispatch (died, hung, failed), so far
    late: int  # results dropped because their lease was no longer held, so far
    worker_lag_mean: float  # newest version minus the version each worker last used
    worker_lag_max: float
    restarted: int = 0  # partial rollouts: finished units too stale for the cut, so far

    def metrics(self) -> dict[str, float]:
        return {"perf/rollout/redispatched_leases": float(self.redispatched),
                "perf/rollout/restarted_units": float(self.restarted),
                "perf/rollout/late_results": float(self.late),
                "perf/sync/worker_version_lag/mean": self.worker_lag_mean,
                "perf/sync/worker_version_lag/max": self.worker_lag_max}


class WorkerFailed(RuntimeError):
    """A worker's warm-up missed its deadline `max_attempts` times in a row."""


def check_generated_with(worker: int, lease: Lease, digest: str) -> None:
    """Raise `WeightMismatch` unless `digest`, the checksum a worker computed from the bytes
    it generated `lease` with (`rollout_worker.pull_for`), is the one the lease named."""
    if digest != lease.digest:
        raise WeightMismatch(f"worker {worker} generated lease {lease.id} (step {lease.step} "
                             f"unit {lease.unit}) with weights of checksum {digest}, but the "
                             f"lease named version {lease.version} with checksum {lease.digest}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}"


class _Slot:
    """The dispatcher's view of one worker: starting (not known to be up), idle, or holding
    one lease. `ref` is the call in flight: `ready` while starting, else `produce`."""

    def __init__(self, index: int, handle, prompts_per_lease: int):
        self.index, self.handle, self.prompts_per_lease = index, handle, prompts_per_lease
        self.lease: Lease | None = None
        self.ref = None
        self.starting = True
        self.not_before = 0.0  # wait until then before the next call (after a failure)
        self.failures = 0
        self.version: int | None = None  # the version it last generated with
        self.asked = 0.0  # when the `ready` call in flight was made
        self.scoring_s = 0.0  # its leases' extra time: their rows' reward deadlines (`ready`)
        self.slow_starts = 0  # warm-ups in a row that missed their deadline

    def restart(self, delay: float = 0.0) -> None:
        """Forget any call in flight; ask whether it is up again once `delay` has passed."""
        self.lease, self.ref, self.starting = None, None, True
        self.not_before = time.monotonic() + delay

    def poll_ready(self) -> None:
        if self.starting and self.ref is None and time.monotonic() >= self.not_before:
            self.ref = self.handle.ready.remote(self.prompts_per_lease)
            self.asked = time.monotonic()

    @property
    def idle(self) -> bool:
        return not self.starting and self.ref is None and time.monotonic() >= self.not_before


@ray.remote(max_concurrency=16)
class Dispatcher:
    def __init__(self, plan: PlacementPlan, prompts_per_step: int, steps: int, workers: list):
        setup_process()
        self.plan = plan
        self.table = LeaseTable(prompts_per_step, plan.prompts_per_lease, plan.schedule, steps,
                                max_attempts=plan.max_attempts)
        self.buffer = RolloutBuffer(self.table.units_per_step, plan.schedule.max_staleness,
                                    plan.schedule.partial)
        self.newest: int | None = None  # no version published yet: nothing is admitted
        self.digests: dict[int, str] = {}  # checksum of each published version
        self.open = False  # learners may take (False while a learner group (re)starts)
        self.error: str | None = None
        self.cv = threading.Condition()
        self.slots = [_Slot(i, w, plan.prompts_per_lease) for i, w in enumerate(workers)]
        for slot in self.slots:
            slot.poll_ready()
        self._taken: dict[int, set[int]] = {}
        self._snapshot: tuple[int, tuple] | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="dispatch", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return "dispatcher"

    # --- the learner's side -----------------------------------------------------------------

    def pause(self) -> None:
        with self.cv:
            self.open = False

    def begin(self, step: int, state: dict | None, arrays: dict | None) -> None:
        """Continue from checkpoint `state` (JSON) + `arrays`, or start afresh at `step`."""
        with self.cv:
            if state:
                self.table.restore(state["leases"])
                self.buffer.restore(arrays or {}, state["buffer"])
            else:
                self.table.restore({"next_step": step, "opened": step, "done": [],
                                    "attempts": [], "failures": [], "redispatched": 0,
                                    "late": 0})
                self.buffer.restore({}, {"records": []})
            if self.table.next_step != step:
                raise RuntimeError(f"checkpoint of step {step} holds a lease table at step "
                                   f"{self.table.next_step}")
            self.newest, self.digests, self._taken, self._snapshot = None, {}, {}, None
            # Not `error`: one set before this (re)start stops the run all the same (the
            # dispatch loop has ended), and the learners' `take` raises it.
            self.open = True
            self.cv.notify_all()
        log.info("begin at step %d (%d buffered unit(s))", step,
                 sum(1 for _ in self.buffer.steps()))

    def published(self, version: int, digest: str) -> None:
        with self.cv:
            self.digests[version] = digest
            self.newest = version if self.newest is None else max(self.newest, version)
            self.cv.notify_all()

    def waiting_for(self, step: int) -> str:
        """Where the units of `step` are, and the workers' state (the learner's stall
        warning)."""
        with self.cv:
            if self.error is not None:
                return f"the run is stopping: {self.error}"
            if not self.open:
                return "paused while the learner group (re)starts"
            starting = [s.index for s in self.slots if s.starting]
            return (f"step {step}: {self.table.describe(step, self.newest, time.monotonic())}"
                    f"; newest version {self.newest}"
                    + (f"; worker(s) {starting} (re)starting or warming up" if starting else ""))

    def failure(self) -> str | None:
        """The error that stopped the run, if any (the driver reports it as the cause)."""
        with self.cv:
            return self.error

    def take(self, step: int, host: int, num_hosts: int,
             timeout_s: float) -> tuple[RolloutRecord, DispatchStats | None] | None:
        """Learner host `host`'s rows of `step` (and, for host 0, the queue's figures), or None
        after timeout_s."""
        deadline = time.monotonic() + timeout_s
        with self.cv:
            while self.error is None and not (self.open and self._ready(step)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)
            if self.error is not None:
                raise RuntimeError(self.error)
            partial = self.plan.schedule.partial
            record = (self.buffer.take_units if partial else self.buffer.take)(step, host,
                                                                                num_hosts)
            stats = self._stats() if host == 0 else None
            taken = self._taken.setdefault(step, set())
            taken.add(host)
            if len(taken) == num_hosts:
                if partial:
                    self.table.consume_units(step, self.buffer.retire(step))
                else:
                    self.buffer.drop(step)
                    self.table.consume(step)
                self._taken.pop(step)
            return record, stats

    def _ready(self, step: int) -> bool:
        """Whether `step` can be taken (called holding `cv`). Partial rollouts: once it is
        cut (`buffer.assign`); finished units too stale for it go back to the queue."""
        if not self.plan.schedule.partial:
            return self.buffer.ready(step)
        cut, stale = self.buffer.assign(step)
        for key in stale:
            self.table.requeue(key)
            log.info("unit %s finished too stale for step %d: generated again", key, step)
        return cut

    def snapshot(self, next_step: int) -> tuple[dict, dict]:
        """(arrays, JSON) of the buffer and leases, the same for every host that asks."""
        with self.cv:
            if self._snapshot is None or self._snapshot[0] != next_step:
                if self.table.next_step != next_step:
                    raise RuntimeError(f"snapshot for step {next_step}, but the learner has "
                                       f"not taken step {self.table.next_step} everywhere")
                arrays, meta = self.buffer.state()
                self._snapshot = (next_step, (arrays, {"buffer": meta,
                                                       "leases": self.table.state()}))
            return self._snapshot[1]

    def stop(self) -> None:
        self._stopping = True
        self._thread.join(timeout=5)

    def _stats(self) -> DispatchStats:
        newest = self.newest or 0
        lags = [newest - s.version for s in self.slots if s.version is not None]
        return DispatchStats(self.table.redispatched, self.table.late,
                             float(np.mean(lags)) if lags else 0.0,
                             float(max(lags)) if lags else 0.0, self.table.restarted)

    # --- the dispatch loop ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            try:
                self._dispatch()
                refs = [s.ref for s in self.slots if s.ref is not None]
                if not refs:
                    time.sleep(0.02)
                    continue
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.05)
                for ref in ready:
                    self._finish(next(s for s in self.slots if s.ref == ref))
            except (UnitFailed, WorkerFailed, WeightMismatch) as e:  # a unit that fails every
                self._stop(str(e))  # worker, one that never starts, a result of other bytes
                return
            except Exception as e:  # noqa: BLE001 - a bug here must stop the run, loudly
                log.exception("dispatch loop failed")
                self._stop(f"dispatcher failed: {type(e).__name__}: {e}")
                return

    def _stop(self, error: str) -> None:
        log.error("stopping the run: %s", error)
        with self.cv:
            self.error = error
            self.cv.notify_all()

    def _dispatch(self) -> None:
        with self.cv:
            now = time.monotonic()
            for slot in self.slots:  # holders of expired leases, hung, are restarted...
                lease = slot.lease
                if lease is not None and slot.ref is not None and lease.deadline <= now:
                    log.warning("worker %d held lease %d (step %d unit %d) past its deadline: "
                                "lease expired, unit redispatched, worker restarted",
                                slot.index, lease.id, lease.step, lease.unit)
                    ray.kill(slot.handle, no_restart=False)
                    slot.restart(RETRY_S)
            self.table.expire(now)  # ...and the units go back (UnitFailed at the last try)
            for slot in self.slots:  # a warm-up that hangs (no lease holds it) is bounded too
                if slot.starting and slot.ref is not None and \
                        now - slot.asked > self.plan.start_timeout_s:
                    slot.slow_starts += 1
                    if slot.slow_starts >= self.plan.max_attempts:
                        raise WorkerFailed(
                            f"worker {slot.index} did not warm up (compile and produce one "
                            f"throw-away unit) within --start-timeout-s "
                            f"{self.plan.start_timeout_s:g}, {slot.slow_starts} time(s) in a "
                            "row; stopping the run (--max-attempts)")
                    log.warning("worker %d did not warm up within %.0f s: killed, Ray "
                                "restarts it", slot.index, self.plan.start_timeout_s)
                    ray.kill(slot.handle, no_restart=False)
                    slot.restart(RETRY_S)
            for slot in self.slots:
                slot.poll_ready()
            if self.newest is None or self.error is not None or not self.open:
                return
            for slot in self.slots:
                if not slot.idle:
                    continue
                # A lease covers its unit's worst-case scoring too (`VerifierPool.lease_extra_s`)
                lease = self.table.acquire(slot.index, self.newest, now,
                                           self.plan.lease_timeout_s + slot.scoring_s,
                                           self.digests)
                if lease is None:
                    break  # the gate admits nothing more until the next version
                slot.lease, slot.ref = lease, slot.handle.produce.remote(lease)

    def _check_taken(self, worker: int, lease: Lease, taken: dict[int, str],
                     wait_s: float = 10.0) -> None:
        """`WeightMismatch` unless every version a worker took in flight has the checksum the
        learner published for it (called holding `cv`). The server holds a version a moment
        before the learner announces it here, so an unknown one is waited for briefly."""
        deadline = time.monotonic() + wait_s
        for version, digest in sorted(taken.items()):
            while version not in self.digests and time.monotonic() < deadline:
                self.cv.wait(deadline - time.monotonic())
            if self.digests.get(version) != digest:
                raise WeightMismatch(
                    f"worker {worker} took weight version {version} (checksum {digest}) in "
                    f"flight for lease {lease.id} (step {lease.step} unit {lease.unit}), but "
                    f"the learner published it with checksum {self.digests.get(version)}")

    def _finish(self, slot: _Slot) -> None:
        ref, lease = slot.ref, slot.lease
        slot.ref = None
        try:
            out = ray.get(ref)
        except _DEAD as e:
            if getattr(e, "actor_init_failed", False):  # its __init__ raised: it never will
                self._stop(f"worker {slot.index} cannot start: {_first_line(e)}")
                return
            with self.cv:
                slot.failures += 1
                if slot.failures > READY_ATTEMPTS:
                    self.error = f"worker {slot.index} did not come back: {_first_line(e)}"
                    self.cv.notify_all()
                    return
                slot.restart(RETRY_S)
                if lease is not None and self.table.release(
                        lease.id, f"worker {slot.index} died ({type(e).__name__})") is not None:
                    log.warning("worker %d died holding lease %d (step %d unit %d): unit "
                                "redispatched; Ray restarts the worker", slot.index, lease.id,
                                lease.step, lease.unit)
            return
        except VersionUnavailable as e:
            with self.cv:
                self.table.release(lease.id)
                slot.lease, slot.not_before = None, time.monotonic() + RETRY_S
                log.info("lease %d: %s; retrying", lease.id, e)
            return
        except Exception as e:  # noqa: BLE001 - a bad version, a bug in the producer, ...
            what = "starting" if lease is None else (
                f"step {lease.step} unit {lease.unit} (lease {lease.id}, weight version "
                f"{lease.version})")
            self._stop(f"worker {slot.index} failed on {what}: {type(e).__name__}: {e}")
            return
        with self.cv:
            slot.failures = 0
            if slot.starting:  # a `ready` call: the worker is up
                slot.starting, slot.slow_starts = False, 0
                slot.scoring_s = out[1] if isinstance(out, tuple) else 0.0
                return
            slot.lease, (record, digest, taken) = None, out
            slot.version = max([record.version, *taken])
            check_generated_with(slot.index, lease, digest)
            if self.table.complete(lease.id) is None:
                log.info("late result of lease %d (step %d unit %d) dropped", lease.id,
                         lease.step, lease.unit)
                return
            self._check_taken(slot.index, lease, taken)
            self.buffer.add(lease, record)
            self.cv.notify_all()
