"""The versioned rollout buffer (plain Python): slot order, host shares, staleness, checkpoint."""

import dataclasses

import numpy as np
import pytest

from locojax.envs.base import Example
from locojax.rl import batch as batch_lib
from locojax.rollout.single_turn import Rollouts
from locojax.train.buffer import RolloutBuffer, staleness_sums
from locojax.train.curation import Plan
from locojax.train.leases import LeaseTable, Schedule
from locojax.train.producer import RolloutRecord

G, P, N = 2, 3, 4  # group size, prompt and response columns


def record(step, start, stop, version):
    """A unit's record whose every value encodes (step, slot), so misplaced rows show."""
    b = stop - start
    slots = np.arange(start, stop)
    rows = np.repeat(slots, G)
    tokens = (step * 1000 + rows[:, None] * 10 + np.arange(N)).astype(np.int32)
    ro = Rollouts(
        examples=[Example(id=f"s{step}/{i}", prompt=f"q{i}", answer=str(i), meta={"i": int(i)})
                  for i in slots],
        prompt_tokens=np.tile(slots[:, None], (1, P)).astype(np.int32),
        prompt_mask=np.ones((b, P), bool), tokens=tokens, mask=np.ones((b * G, N), bool),
        logprobs=-rows[:, None].astype(np.float32) * np.ones((1, N), np.float32),
        texts=[f"t{r}" for r in rows], rewards=rows.astype(np.float32),
        reward_parts={"correct": (rows % 2).astype(np.float32)},
        group_ids=(step * 100 + rows).astype(np.int32))
    batch = batch_lib.from_rollout(ro.rows(ro.prompt_tokens), ro.rows(ro.prompt_mask),
                                   ro.tokens, ro.mask, ro.logprobs,
                                   np.float32(0.5) * rows, ro.group_ids, group_size=G)
    sums = {"rows": float(b * G), "reward": float(ro.rewards.sum())}
    # The step's plan (every unit carries all 8 slots') and one pass-count row per slot:
    # (slot, round 0, prompt index 100·step + slot, solved = slot % 3, samples G).
    plan = Plan(step, tuple(100 * step + np.arange(8)), 8 * step, 8 * step + 8, 0, 0)
    obs = np.stack([slots, 0 * slots, 100 * step + slots, slots % 3, 0 * slots + G], 1)
    return RolloutRecord(step=step, version=version, batch=batch, sums=sums, rollouts=ro,
                         plan=plan, observations=obs.astype(np.int32))


def filled(k=2, step=3, versions=(1, 2)):
    """A buffer holding both units (4 prompts each) of `step`, made by `versions`."""
    t = LeaseTable(8, 4, Schedule(k, k + 1, newest=True), 10, first_step=step)
    buf = RolloutBuffer(t.units_per_step, k)
    leases = [t.acquire(0, step, 0.0, 9.0) for _ in range(2)]
    for lease, v in zip(leases[::-1], versions[::-1]):  # finish out of order
        lease = dataclasses.replace(lease, version=v)
        buf.add(lease, record(step, lease.start, lease.stop, v))
    return buf


def test_take_is_slot_ordered_and_carries_per_row_staleness():
    buf = filled(step=3, versions=(1, 2))
    r = buf.take(3)
    np.testing.assert_array_equal(r.batch.group_id, 300 + np.repeat(np.arange(8), G))
    np.testing.assert_array_equal(r.batch.staleness, [2] * 8 + [1] * 8)  # 3 - version
    assert r.version == 1  # the oldest version in the step
    assert r.sums["rows"] == 16 and r.sums["stale/1"] == 8 and r.sums["stale/2"] == 8
    assert r.sums["stale/0"] == 0  # every bucket 0..k present
    assert r.rollouts.texts == [f"t{x}" for x in np.repeat(np.arange(8), G)]
    assert r.plan.step == 3 and r.plan.indices == tuple(300 + np.arange(8))
    np.testing.assert_array_equal(r.observations[:, 0], np.arange(8))  # every slot, in order
    assert r.batch.shared_prefix == batch_lib.SharedPrefix(columns=P, group=G)
    batch_lib.validate(r.batch)


def test_host_shares_tile_the_step_and_sums_count_once():
    buf = filled()
    whole = buf.take(3)
    shares = [buf.take(3, host=h, num_hosts=4) for h in range(4)]
    for name in ("tokens", "group_id", "staleness", "advantages", "old_logprobs", "loss_mask"):
        np.testing.assert_array_equal(
            np.concatenate([getattr(s.batch, name) for s in shares]), getattr(whole.batch, name))
    for s in shares:  # whole groups per host
        assert len(s.rollouts.examples) * G == len(s.rollouts.texts) == len(s.batch.tokens)
    for key, value in whole.sums.items():  # summing over hosts, as the loop does, is exact
        assert sum(s.sums[key] for s in shares) == value
    assert all(v == 0 for s in shares[1:] for v in s.sums.values())
    for h, s in enumerate(shares):  # each host: the pass counts of its own 2 slots, once
        np.testing.assert_array_equal(s.observations, whole.observations[2 * h:2 * h + 2])
        assert s.plan == whole.plan and s.batch.shared_prefix == whole.batch.shared_prefix
    with pytest.raises(ValueError, match="whole groups"):
        buf.take(3, host=0, num_hosts=16)


def test_add_refuses_a_wrong_version_and_a_second_copy():
    t = LeaseTable(8, 4, Schedule(1, 2, newest=False), 10)
    buf = RolloutBuffer(2, 1)
    lease = t.acquire(0, 0, 0.0, 9.0)
    with pytest.raises(ValueError, match="version 0, but its record is step 0 at version 1"):
        buf.add(lease, record(0, 0, 4, version=1))
    buf.add(lease, record(0, 0, 4, version=0))
    with pytest.raises(RuntimeError, match="train twice"):
        buf.add(lease, record(0, 0, 4, version=0))
    assert not buf.ready(0)
    with pytest.raises(RuntimeError, match="not complete"):
        buf.take(0)


def test_staleness_beyond_the_bound_is_an_error():
    assert staleness_sums(np.array([0, 1, 1]), 2) == {"stale/0": 1.0, "stale/1": 2.0,
                                                      "stale/2": 0.0}
    with pytest.raises(RuntimeError, match="more than the bound k=1"):
        staleness_sums(np.array([0, 2]), 1)


def test_state_round_trip_gives_the_same_records():
    buf = filled()
    arrays, meta = buf.state()
    again = RolloutBuffer(2, 2)
    again.restore(arrays, meta)
    a, b = buf.take(3, 1, 2), again.take(3, 1, 2)
    for name in ("tokens", "positions", "attn_mask", "loss_mask", "advantages", "old_logprobs",
                 "group_id", "staleness"):
        x, y = getattr(a.batch, name), getattr(b.batch, name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name
    assert a.sums == b.sums and a.rollouts.texts == b.rollouts.texts
    assert a.rollouts.examples == b.rollouts.examples
    assert a.plan == b.plan and a.batch.shared_prefix == b.batch.shared_prefix
    np.testing.assert_array_equal(a.observations, b.observations)
    np.testing.assert_array_equal(a.rollouts.reward_parts["correct"],
                                  b.rollouts.reward_parts["correct"])


def test_units_that_disagree_on_the_plan_are_refused():
    """Workers plan a step on their own: units whose plans differ would train prompts that
    the learner's curator never admitted, so the take fails rather than mix them."""
    t = LeaseTable(8, 4, Schedule(0, 1, newest=False), 10)
    buf = RolloutBuffer(2, 0)
    for lease in (t.acquire(0, 0, 0.0, 9.0), t.acquire(0, 0, 0.0, 9.0)):
        r = record(0, lease.start, lease.stop, 0)
        if lease.unit:
            r = dataclasses.replace(r, plan=dataclasses.replace(r.plan, end=9))
        buf.add(lease, r)
    with pytest.raises(RuntimeError, match="disagree on the step's plan"):
        buf.take(0)
