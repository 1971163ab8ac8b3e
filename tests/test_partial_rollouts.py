"""Partial rollouts (issue 59 item 2) without Ray: the lease table and the buffer as the
dispatcher drives them (`Schedule.partial`).

The learner's step t is cut once `units_per_step` units are in, taking those that
finished first, whichever step's prompts they hold; a unit still decoding goes on and
trains in a later step, keeping its versions. Exactly-once accounting per unit: a worker
killed mid-unit loses its lease, the unit is generated again, and the dead worker's result,
if it still arrives, is dropped; a unit finished too stale for the step it would train in
goes back to the queue. Every unit of the run trains exactly once.
"""

import numpy as np
import pytest

from locojax.fleet.buffer import RolloutBuffer
from locojax.fleet.leases import LeaseTable
from locojax.fleet.placement import Schedule
from locojax.rl.batch import from_rollout
from locojax.train.record import RolloutRecord, RolloutStats

K = 1
PER_STEP, PER_LEASE, STEPS = 4, 2, 4  # 2 units a step


def _record(lease, versions=None):
    rows, p, n = 2, 2, 3
    batch = from_rollout(np.ones((rows, p), np.int32), np.ones((rows, p), bool),
                         np.ones((rows, n), np.int32), np.ones((rows, n), bool),
                         np.zeros((rows, n), np.float32), np.zeros(rows, np.float32),
                         np.full(rows, lease.step * 10 + lease.unit), group_size=2)
    return RolloutRecord(lease.step, lease.version, batch,
                         RolloutStats(rows=float(rows), groups=1.0), versions)


class Run:
    """The dispatcher's bookkeeping, driven by hand: `lease` hands a unit out, `finish`
    delivers its result, `take` is the learner's (cut, train, retire)."""

    def __init__(self, partial=True):
        schedule = Schedule(K, K + 1, newest=True, partial=partial)
        self.table = LeaseTable(PER_STEP, PER_LEASE, schedule, STEPS)
        self.buffer = RolloutBuffer(self.table.units_per_step, K, partial)
        self.newest, self.trained_rows = 0, []

    def lease(self, worker=0):
        return self.table.acquire(worker, self.newest, 0.0, 60.0)

    def finish(self, lease):
        if self.table.complete(lease.id) is not None:  # else late: dropped
            self.buffer.add(lease, _record(lease))

    def take(self, step):
        cut, stale = self.buffer.assign(step)
        for key in stale:
            self.table.requeue(key)
        if not cut:
            return None
        record = self.buffer.take_units(step)
        self.table.consume_units(step, self.buffer.retire(step))
        self.trained_rows.extend(np.asarray(record.batch.group_id).tolist())
        self.newest = step + 1  # the learner publishes the version after step
        return record


def test_a_step_is_cut_without_waiting_for_a_long_unit():
    run = Run()
    a, b = run.lease(), run.lease()  # step 0's two units
    c, d = run.lease(), run.lease()  # step 1's (k = 1 admits it at version 0)
    assert [(x.step, x.unit) for x in (a, b, c, d)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    run.finish(a)
    run.finish(c)  # b (step 0's) is long: still decoding
    record = run.take(0)
    assert record is not None and record.step == 0
    assert run.table.trained == {(0, 0): 0, (1, 0): 0}
    np.testing.assert_array_equal(record.batch.staleness, [0, 0, 0, 0])
    run.finish(b)
    run.finish(d)
    record = run.take(1)  # b goes on into step 1, with its version 0: staleness 1
    assert run.table.trained[(0, 1)] == 1 and run.table.trained[(1, 1)] == 1
    np.testing.assert_array_equal(record.batch.staleness, [1, 1, 1, 1])


def test_every_unit_trains_exactly_once_when_a_worker_is_killed_mid_unit():
    """Worker 1 is killed holding a unit: its lease is released (a failed attempt), the unit
    is generated again by another worker, and the dead worker's result, arriving late, is
    dropped. A unit that finishes too stale for the cut goes back and is made again. Every
    unit of the run's 4 steps trains once, in some step."""
    run = Run()
    held = {0: run.lease(0), 1: run.lease(1)}
    killed = held[1]
    run.table.release(killed.id, "worker 1 died (RayActorError)")
    step, rounds = 0, 0
    while step < STEPS:
        rounds += 1
        assert rounds < 100
        for w in (0, 2):
            if held.get(w) is None:
                held[w] = run.lease(w)
        # Worker 2's units are slow: they finish only every other round.
        for w in (0, 2):
            if held.get(w) is not None and (w == 0 or rounds % 2 == 0):
                run.finish(held.pop(w))
        if rounds == 3:
            run.finish(killed)  # the dead worker's result: late, dropped
        if run.take(step) is not None:
            step += 1
    assert run.table.late == 1
    expected = sorted((s, u) for s in range(STEPS) for u in range(2))
    assert sorted(run.table.trained) == expected
    assert sorted(run.trained_rows) == sorted(np.repeat([s * 10 + u for s, u in expected],
                                                        2).tolist())


def test_a_unit_too_stale_for_the_cut_is_generated_again():
    run = Run()
    a, b = run.lease(), run.lease()
    c, d = run.lease(), run.lease()
    run.finish(a), run.finish(c)
    run.take(0)
    run.finish(d)
    e, f = run.lease(), run.lease()  # step 2, at version 1
    run.finish(e)
    run.take(1)  # d and e: b (version 0) still decoding
    run.finish(b)  # too stale for step 2 (2 - 0 > k = 1)
    run.finish(f)
    assert run.take(2) is None  # b went back, f alone is not a step
    assert run.table.restarted == 1
    again = run.lease()
    assert (again.step, again.unit, again.version) == (0, 1, 2)
    run.finish(again)
    assert run.take(2) is not None
    assert run.table.trained[(0, 1)] == 2


def test_a_unit_cannot_train_twice():
    run = Run()
    a, b = run.lease(), run.lease()
    run.finish(a), run.finish(b)
    run.take(0)
    with pytest.raises(RuntimeError, match=r"unit \(0, 0\) trained at step 0 and again"):
        run.table.consume_units(1, [(0, 0)])


def test_the_ledger_survives_a_checkpoint():
    run = Run()
    a, b, c = run.lease(), run.lease(), run.lease()
    run.finish(c), run.finish(a)
    run.take(0)
    state, (arrays, meta) = run.table.state(), run.buffer.state()
    again = Run()
    again.table.restore(state)
    again.buffer.restore(arrays, meta)
    assert again.table.trained == {(1, 0): 0, (0, 0): 0}
    # b (held when saved) and step 1's unit 1 are queued again; nothing trained is.
    assert sorted((x.step, x.unit) for x in (again.lease(), again.lease())) == [(0, 1), (1, 1)]
