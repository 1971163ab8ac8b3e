"""The versioned rollout buffer (plain Python): slot order, host shares, staleness, checkpoint."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import Example, Task
from locojax.envs.swe.generate import generate_examples
from locojax.fleet.buffer import RolloutBuffer, staleness_histogram
from locojax.fleet.leases import LeaseTable
from locojax.fleet.placement import Schedule
from locojax.profiler import StepTimer
from locojax.rl import batch as batch_lib
from locojax.rl.config import AlgoConfig
from locojax.rollout.multi_turn import EnvStats
from locojax.rollout.single_turn import Rollouts
from locojax.train.curation import CurationConfig, Curator
from locojax.train.data import PromptStream
from locojax.train.producer import Producer
from locojax.train.record import RolloutRecord, RolloutStats

G, P, N = 2, 3, 4  # group size, prompt and response columns


def record(step, start, stop, version):
    """A unit's record whose every value encodes (step, slot), so misplaced rows show."""
    b = stop - start
    slots = np.arange(start, stop)
    rows = np.repeat(slots, G)
    tokens = (step * 1000 + rows[:, None] * 10 + np.arange(N)).astype(np.int32)
    prompt = np.tile(slots[:, None], (1, P)).astype(np.int32)
    batch = batch_lib.from_rollout(np.repeat(prompt, G, 0), np.ones((b * G, P), bool), tokens,
                                   np.ones((b * G, N), bool),
                                   -rows[:, None].astype(np.float32) * np.ones((1, N), np.float32),
                                   np.float32(0.5) * rows, (step * 100 + rows).astype(np.int32),
                                   group_size=G)
    stats = RolloutStats(rows=float(b * G), groups=float(b), reward=float(rows.sum()),
                         reward_parts={"format": float(b)},
                         env=EnvStats(turns=float(b * G)), units=1.0,
                         worker_seconds={"phase/decode": 0.5})
    return RolloutRecord(step, version, batch, stats)


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
    assert r.stats.rows == 16 and r.stats.staleness == (0.0, 8.0, 8.0)  # every bucket 0..k
    assert r.stats.units == 2 and r.stats.env.turns == 16
    assert r.stats.reward_parts == {"format": 8.0}
    assert r.batch.shared_prefix == batch_lib.SharedPrefix(columns=P, group=G)
    batch_lib.validate(r.batch)
    m = r.stats.metrics()
    assert m["rollout/staleness/mean"] == 1.5 and m["rollout/staleness/max"] == 2
    assert m["rollout/staleness/frac_0"] == 0 and m["perf/rollout/phase/decode"] == 0.5


def test_at_k_0_the_batch_is_the_in_process_modes_batch():
    """Lock-step DA and async (k = 0): every row is fresh and the batch carries no staleness,
    so the learner compiles the in-process modes' very train step. A staleness input adds
    the IS weights' histogram: another program, which XLA:CPU's classic fusion emitters
    rounded otherwise in the last bit (the Makefile's note)."""
    inline = jax.tree.structure(record(3, 0, 8, 3).batch)  # a batch as the producer makes it
    r = filled(k=0, step=3, versions=(3, 3)).take(3)
    assert r.batch.staleness is None and r.stats.staleness == (16.0,)
    assert jax.tree.structure(r.batch) == inline
    stale = filled(k=1, step=3, versions=(3, 2)).take(3)  # k > 0: the rows' staleness
    np.testing.assert_array_equal(stale.batch.staleness, [0] * 8 + [1] * 8)
    assert jax.tree.structure(stale.batch) != inline


def test_host_shares_tile_the_step_and_stats_count_once():
    buf = filled()
    whole = buf.take(3)
    shares = [buf.take(3, host=h, num_hosts=4) for h in range(4)]
    for name in ("tokens", "group_id", "staleness", "advantages", "old_logprobs", "loss_mask"):
        np.testing.assert_array_equal(
            np.concatenate([getattr(s.batch, name) for s in shares]), getattr(whole.batch, name))
    # Summing over hosts, as the loop does, is exact: the stats ride on host 0, and the
    # others hold the same fields at 0 (hosts sum them leaf by leaf in one collective).
    total = shares[0].stats
    for s in shares[1:]:
        assert jax.tree.structure(s.stats) == jax.tree.structure(total)
        assert all(x == 0 for x in jax.tree.leaves(s.stats))
        total = total + s.stats
    assert total == whole.stats
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
    assert staleness_histogram(np.array([0, 1, 1]), 2) == (1.0, 2.0, 0.0)
    with pytest.raises(RuntimeError, match="more than the bound k=1"):
        staleness_histogram(np.array([0, 2]), 1)


def assert_same_records(a, b):
    for f in dataclasses.fields(a.batch):
        x, y = getattr(a.batch, f.name), getattr(b.batch, f.name)
        if f.name == "shared_prefix" or x is None:
            assert x == y, f.name
        else:
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f.name
    assert (a.step, a.version, a.stats) == (b.step, b.version, b.stats)


def round_trip(buf, units=2, k=2):
    """`buf`'s checkpoint, its JSON half through text as the checkpoint writes it."""
    arrays, meta = buf.state()
    again = RolloutBuffer(units, k)
    again.restore(arrays, json.loads(json.dumps(meta)))
    return again


def test_state_round_trip_gives_the_same_records():
    buf = filled()
    again = round_trip(buf)
    for host in (0, 1):
        assert_same_records(buf.take(3, host, 2), again.take(3, host, 2))


def fake_rollout(engine, weights, tokenizer, task, runner, examples, first_group, key,
                 sampling, group_size, max_prompt_tokens, timer):
    """Rows whose values follow the global row index; rewards 1 on even rows."""
    b, r = len(examples), len(examples) * group_size
    row = np.arange(first_group * group_size, first_group * group_size + r)
    return Rollouts(list(examples), np.ones((b, P), np.int32), np.ones((b, P), bool),
                    (row[:, None] + np.arange(N)).astype(np.int32), np.ones((r, N), bool),
                    np.full((r, N), -0.25, np.float32), [ex.id for ex in examples for _ in
                                                         range(group_size)],
                    (row % 2 == 0).astype(np.float32), {"format": np.ones(r, np.float32)},
                    np.repeat(np.arange(first_group, first_group + b),
                              group_size).astype(np.int32))


def test_records_of_any_examples_round_trip_through_json():
    """What crosses is the batch and the stats, never the examples: records produced from
    chat prompts, numeric answers and SWE tasks in the metadata (none of which JSON holds
    as it is) checkpoint and restore exactly."""
    examples = [Example("chat", [{"role": "user", "content": "2+2?"}], 4),
                Example("num", "1+1", 2.0, meta={"answer": 2}),
                generate_examples(1)[0], Example("plain", "q", "a", meta={"tags": ("x", 1)})]
    assert "swe_task" in examples[2].meta
    task = Task("mixed", examples, examples, reward=lambda c, e: 0.0)
    producer = Producer(None, None, task, type("R", (), {"metrics": lambda self: {}})(),
                        Curator(CurationConfig(), PromptStream(examples, 0), 4, 0),
                        AlgoConfig(group_size=G), SamplingConfig(max_new_tokens=N), 4, P,
                        jax.random.key(0), rollout_fn=fake_rollout)
    t = LeaseTable(4, 2, Schedule(1, 2, newest=False), 10)
    buf = RolloutBuffer(2, 1)
    for lease in (t.acquire(0, 0, 0.0, 9.0), t.acquire(1, 0, 0.0, 9.0)):
        unit, _ = producer.produce(0, None, lease.start, lease.stop, StepTimer())
        buf.add(lease, unit)
    again = round_trip(buf, units=2, k=1)
    assert_same_records(buf.take(0), again.take(0))
    assert buf.take(0).stats.reward_parts == {"format": 8.0}
