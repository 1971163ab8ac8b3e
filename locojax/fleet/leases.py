"""Leased units of rollout work, and the admission gate that bounds staleness.

The asynchronous modes (docs/design.md, "Asynchrony") hand rollout work to workers as leases. A
lease is a fixed unit: `prompts_per_lease` consecutive prompt slots of one step, i.e. whole
groups, always generated as one batch of the same shape. A row's tokens depend on its
sampling key and, through matmul blocking, on the shape of the batch it was generated in,
so a lease that is redispatched after its worker died or hung regenerates exactly the same
rows. A lease belongs to one worker until it completes or its deadline passes; a result
that arrives for a lease that is no longer held is dropped, so no prompt is trained twice,
and an expired or failed lease goes back to the queue, so no prompt is lost.

Retries are bounded: a unit whose worker died, hung past the lease or failed counts a
failed attempt, and its `max_attempts`-th failure raises `UnitFailed`, naming the step, the
unit, the worker and the error, which stops the run (a unit that kills or hangs every worker
that decodes it would otherwise be leased forever). A lease put back for a reason that is
not the unit's (the parameter server is restarting) does not count.

A lease names its version by number and by checksum (`digest`): after a learner restart a
version number can stand for other bytes, and a worker reuses its cached copy only if both
match.

Three settings describe every mode (`placement.Schedule`):
- max staleness k: step s may be dispatched once the newest weight version v satisfies
  s - v <= k. Admission is paced by this gate (workers wait); nothing is ever dropped for
  being stale, so long completions are not filtered out (no length bias).
- the version a lease names: `max(0, s - k)` under the deterministic schedule (LoCoJAX-DA:
  k = 1 overlaps the rollout of step s + 1 with training step s), or the newest version at
  dispatch (RLAX-style async). With k = 0 both are `s`: lock-step, as colocated.
- versions kept: the schedule may still need versions s - k .. s, so at least k + 1.

Partial rollouts (`Schedule.partial`, async): the learner's step t is cut once
`units_per_step` units are in; it trains the ones that finished first (`buffer.assign`),
whichever step's prompts they hold, and a unit still decoding goes on and trains in a later
step, its rows keeping their versions. Accounting is per unit: `consume_units` records which
step trained each (`trained`), a unit is trained at most once (a second time raises), and
one whose oldest token would be more than k versions stale at the step it would train in
goes back to the queue (`requeue`: regenerated, counted in `restarted`), so none is lost.

This module is plain Python (no Ray, no JAX): the mode modules drive it, tests drive it
directly. Its state is JSON and goes into the checkpoint. References: RLAX (leased,
preemptible inference workers), PipelineRL / AReaL (staleness bound by admission control).
"""

from __future__ import annotations

import dataclasses
import heapq

from locojax.fleet.placement import Schedule


@dataclasses.dataclass(frozen=True)
class Lease:
    """One unit of work, held by one worker until `deadline` (monotonic seconds)."""

    id: int
    step: int
    unit: int
    start: int  # global prompt slots [start, stop) of `step`
    stop: int
    version: int  # the weight version the worker must generate with
    worker: int
    deadline: float
    attempt: int  # 0 the first time this unit is dispatched, +1 per redispatch
    digest: str = ""  # checksum of that version's bytes (`versions.checksum`)


class UnitFailed(RuntimeError):
    """A unit failed `max_attempts` times: the run stops (its message says where and why)."""


class LeaseTable:
    """The units of steps [first_step, last_step) and who holds them.

    `acquire` hands out the oldest admitted unit; `complete` accepts a result only from the
    lease's current holder; `release` (worker died, transient error) and `expire` (deadline
    passed) put a unit back, at the front because the queue is ordered by (step, unit).
    `consume(step)` retires a step once the learner has taken it.
    """

    def __init__(self, prompts_per_step: int, prompts_per_lease: int, schedule: Schedule,
                 last_step: int, first_step: int = 0, max_attempts: int = 3):
        if prompts_per_lease < 1 or prompts_per_step % prompts_per_lease:
            raise ValueError(f"prompts_per_lease={prompts_per_lease} does not divide "
                             f"prompts_per_step={prompts_per_step}")
        self.prompts_per_lease = prompts_per_lease
        self.units_per_step = prompts_per_step // prompts_per_lease
        self.schedule, self.last_step = schedule, last_step
        self.next_step = first_step  # the learner's next step: older steps are retired
        self._opened = first_step  # steps [next_step, _opened) have their units queued
        self._pending: list[tuple[int, int]] = []  # heap of (step, unit)
        self._active: dict[int, Lease] = {}
        self._done: set[tuple[int, int]] = set()
        self._attempts: dict[tuple[int, int], int] = {}
        self._failures: dict[tuple[int, int], int] = {}
        self.max_attempts = max_attempts
        self._next_id = 0
        self.redispatched = 0  # units put back after a dispatch (died, hung, failed)
        self.late = 0  # results dropped because their lease was no longer held
        self.restarted = 0  # partial: finished units put back, too stale for the cut step
        self.trained: dict[tuple[int, int], int] = {}  # partial: unit -> the step it trained

    # --- dispatch ---------------------------------------------------------------------------

    def _open(self, newest_version: int) -> None:
        while self._opened < self.last_step and self.schedule.admits(self._opened, newest_version):
            for u in range(self.units_per_step):
                heapq.heappush(self._pending, (self._opened, u))
            self._opened += 1

    def acquire(self, worker: int, newest_version: int, now: float, timeout_s: float,
                digests: dict[int, str] | None = None) -> Lease | None:
        """The oldest admitted unit, leased to `worker` until now + timeout_s; None if the
        gate admits nothing more yet (admission is paced, not dropped). `digests`: the
        checksum of every published version, which the lease names with its version."""
        self._open(newest_version)
        if not self._pending:
            return None
        version = self.schedule.version_for(self._pending[0][0], newest_version)
        if digests is not None and version not in digests:
            raise RuntimeError(f"no checksum for weight version {version} (published: "
                               f"{sorted(digests)})")
        step, unit = heapq.heappop(self._pending)
        attempt = self._attempts.get((step, unit), 0)
        self._attempts[(step, unit)] = attempt + 1
        start = unit * self.prompts_per_lease
        lease = Lease(self._next_id, step, unit, start, start + self.prompts_per_lease,
                      version, worker, now + timeout_s, attempt,
                      "" if digests is None else digests[version])
        self._next_id += 1
        self._active[lease.id] = lease
        return lease

    def complete(self, lease_id: int) -> Lease | None:
        """Mark a lease's unit done; None (and counted as late) if it is no longer held."""
        lease = self._active.pop(lease_id, None)
        if lease is None:
            self.late += 1
            return None
        key = (lease.step, lease.unit)
        if key in self._done:  # cannot happen while each unit has one holder; guard anyway
            raise RuntimeError(f"unit {key} completed twice")
        self._done.add(key)
        return lease

    def release(self, lease_id: int, error: str | None = None) -> Lease | None:
        """Put a held lease's unit back in the queue. `error`: why its attempt failed (the
        worker died, hung, failed), which counts against the unit's `max_attempts` and
        raises `UnitFailed` at the last; None: put back for a reason that is not the unit's
        (the parameter server is restarting), not counted."""
        lease = self._active.pop(lease_id, None)
        if lease is None:
            return None
        key = (lease.step, lease.unit)
        if error is not None:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            if failures >= self.max_attempts:
                raise UnitFailed(
                    f"step {lease.step} unit {lease.unit} (prompts {lease.start}-{lease.stop - 1}) "
                    f"failed {failures} time(s), the last on worker {lease.worker} (lease "
                    f"{lease.id}, weight version {lease.version}): {error}. Stopping the run "
                    f"(--max-attempts {self.max_attempts}): this unit fails every worker it "
                    "is given to")
        heapq.heappush(self._pending, key)
        self.redispatched += 1
        return lease

    def expire(self, now: float) -> list[Lease]:
        """Release every lease whose deadline has passed (a failed attempt each); returns
        them. `UnitFailed` if that was a unit's last attempt."""
        gone = [x for x in self._active.values() if x.deadline <= now]
        for x in gone:
            self.release(x.id, f"held past its deadline by worker {x.worker} (hung, or "
                               "slower than --lease-timeout-s)")
        return gone

    def describe(self, step: int, newest_version: int | None, now: float) -> str:
        """Where each unit of `step` not done yet is: held (by whom, until when), queued,
        admitted but no worker has asked for work yet, or not admitted yet (the learner's
        stall warning)."""
        held = {(x.step, x.unit): x for x in self._active.values()}
        parts = []
        for u in range(self.units_per_step):
            key = (step, u)
            if key in self._done:
                continue
            failed = self._failures.get(key, 0)
            tried = f", {failed} failed attempt(s) of {self.max_attempts}" if failed else ""
            if key in held:
                x = held[key]
                parts.append(f"unit {u} held by worker {x.worker} (lease {x.id}, version "
                             f"{x.version}, deadline in {x.deadline - now:.0f} s{tried})")
            elif key in self._pending:
                parts.append(f"unit {u} queued{tried}")
            elif newest_version is not None and self.schedule.admits(step, newest_version):
                parts.append(f"unit {u} admitted, no idle worker yet")
            else:
                parts.append(f"unit {u} not admitted yet (step {step} opens at weight version "
                             f"{max(0, step - self.schedule.max_staleness)})")
        done = self.units_per_step - len(parts)
        return f"{done} of {self.units_per_step} unit(s) in; " + "; ".join(parts)

    def active(self) -> list[Lease]:
        return list(self._active.values())

    # --- consumption ------------------------------------------------------------------------

    def step_done(self, step: int) -> bool:
        return all((step, u) in self._done for u in range(self.units_per_step))

    def consume(self, step: int) -> None:
        """Retire `step` (the learner took it). Steps are consumed in order, each once."""
        if step != self.next_step:
            raise RuntimeError(f"consuming step {step}, but the next step is {self.next_step}")
        if not self.step_done(step):
            raise RuntimeError(f"step {step} is not complete")
        for u in range(self.units_per_step):
            self._done.discard((step, u))
            self._attempts.pop((step, u), None)
            self._failures.pop((step, u), None)
        self.next_step += 1

    def requeue(self, key: tuple[int, int]) -> None:
        """partial: put a finished unit back (too stale for any step it can still train in);
        it is generated again, with a newer version. Not a failed attempt."""
        if key not in self._done or key in self.trained:
            raise RuntimeError(f"unit {key} is not finished and untrained: cannot requeue it")
        self._done.discard(key)
        heapq.heappush(self._pending, key)
        self.restarted += 1

    def consume_units(self, step: int, keys: list[tuple[int, int]]) -> None:
        """partial: learner step `step` trained these finished units (whichever steps' prompts
        they hold). Steps are consumed in order; a unit is trained once, never twice."""
        if step != self.next_step:
            raise RuntimeError(f"consuming step {step}, but the next step is {self.next_step}")
        for key in keys:
            if key in self.trained:
                raise RuntimeError(f"unit {key} trained at step {self.trained[key]} and again "
                                   f"at step {step}")
            if key not in self._done:
                raise RuntimeError(f"unit {key} is not finished: step {step} cannot train it")
        for key in keys:
            self.trained[key] = step
            self._done.discard(key)
            self._attempts.pop(key, None)
            self._failures.pop(key, None)
        self.next_step += 1

    # --- checkpoint -------------------------------------------------------------------------

    def state(self) -> dict:
        """JSON. Held leases are saved as not done: after a restore they are dispatched again
        (their old holders' results are then late and dropped)."""
        return {"next_step": self.next_step, "opened": self._opened,
                "done": sorted([list(k) for k in self._done]),
                "attempts": sorted([[s, u, n] for (s, u), n in self._attempts.items()]),
                "failures": sorted([[s, u, n] for (s, u), n in self._failures.items()]),
                "redispatched": self.redispatched, "late": self.late,
                "restarted": self.restarted,
                "trained": sorted([[s, u, t] for (s, u), t in self.trained.items()])}

    def restore(self, state: dict) -> None:
        """Replace everything by `state`. Lease ids keep counting up, so a result for a lease
        handed out before the restore can never match a lease handed out after it."""
        self.next_step, self._opened = int(state["next_step"]), int(state["opened"])
        self._done = {(int(s), int(u)) for s, u in state["done"]}
        self._attempts = {(int(s), int(u)): int(n) for s, u, n in state["attempts"]}
        self._failures = {(int(s), int(u)): int(n) for s, u, n in state.get("failures", [])}
        self.redispatched, self.late = int(state["redispatched"]), int(state["late"])
        self.restarted = int(state.get("restarted", 0))
        self.trained = {(int(s), int(u)): int(t) for s, u, t in state.get("trained", [])}
        self._active = {}
        # partial: a step's units may train in any later step, so every opened one counts
        first = 0 if self.schedule.partial else self.next_step
        self._pending = [(s, u) for s in range(first, self._opened)
                         for u in range(self.units_per_step)
                         if (s, u) not in self._done and (s, u) not in self.trained]
        heapq.heapify(self._pending)
