"""Dynamic sampling and overlong shaping without a model: the producer runs on a fake
rollout whose rewards are a seeded function of (prompt, sampling key, global row), as the
engine's are, so what a slot ends up with can be compared across host splits. The rows a
step kept are read back from the producer's dump, as a user reads them."""

import dataclasses
import types

import jax
import numpy as np
import pytest

from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import Example, Task
from locojax.profiler import StepTimer
from locojax.rl.config import AlgoConfig
from locojax.rollout.single_turn import Rollouts
from locojax.train import dynamic_sampling as ds
from locojax.train.curation import CurationConfig, Curator
from locojax.train.data import PromptStream
from locojax.train.producer import Producer

G, N, P, STOP, B = 4, 6, 3, 99, 8


def fake_rollout(engine, weights, tokenizer, task, runner, examples, first_group, key,
                 sampling, group_size, max_prompt_tokens, timer):
    """Row r of prompt e: correct with probability e.meta['p'], from a generator seeded by
    the key and the global row, like the engine's per-row keys."""
    kd = [int(x) for x in np.asarray(jax.random.key_data(key))]
    rows = len(examples) * group_size
    tokens = np.zeros((rows, N), np.int32)
    mask = np.zeros((rows, N), bool)
    rewards = np.zeros(rows, np.float32)
    for r in range(rows):
        ex = examples[r // group_size]
        rng = np.random.default_rng([*kd, first_group * group_size + r, int(ex.id)])
        length = int(rng.integers(1, N + 1))
        tokens[r, :length] = rng.integers(1, 50, length)
        if rng.random() < 0.7:  # most rows stop; the others are cut off at N
            tokens[r, length - 1] = STOP
        mask[r, :length] = True
        rewards[r] = float(rng.random() < ex.meta["p"])
    b = len(examples)
    return Rollouts(list(examples), np.tile(np.arange(P, dtype=np.int32), (b, 1)),
                    np.ones((b, P), bool), tokens, mask, np.where(mask, -0.5, 0.0).astype(
                        np.float32), [f"{ex.id}" for ex in examples for _ in range(group_size)],
                    rewards, {}, np.repeat(np.arange(first_group, first_group + b),
                                           group_size).astype(np.int32))


class NoCounters:
    def metrics(self):
        return {}


def make_producer(dynamic, dump_dir, curation=CurationConfig()):
    # Pass probabilities 0 and 1 (always zero variance) and in between.
    ps = [0.0, 1.0, 0.5, 0.3, 0.0, 0.8, 1.0, 0.6] * 8
    train = [Example(str(i), f"q{i}", "1", meta={"p": p}) for i, p in enumerate(ps)]
    task = Task("fake", train, train[:4], reward=lambda c, e: 0.0)
    curator = Curator(curation, PromptStream(train, 0), B, 0)
    sampling = SamplingConfig(max_new_tokens=N, stop_token_ids=(STOP,), pad_token_id=0)
    return Producer(None, None, task, NoCounters(), curator, AlgoConfig(group_size=G),
                    sampling, B, P, jax.random.key(0), dynamic, dump_dir=str(dump_dir),
                    rollout_fn=fake_rollout)


def produce(producer, step, start=0, stop=B):
    """The record, the curator's feedback, and the rows the producer dumped."""
    record, feedback = producer.produce(step, None, start, stop, StepTimer())
    path = f"{producer.dump_dir}/step{step + 1:05d}.slots{start}-{stop}.npz"
    with np.load(path) as f:
        rows = dict(f)
    assert int(rows["version"]) == record.version == step
    return types.SimpleNamespace(record=record, batch=record.batch, stats=record.stats,
                                 feedback=feedback, rows=rows)


def split_equals_whole(producer, step):
    whole = produce(producer, step)
    parts = [produce(producer, step, s, s + B // 2) for s in (0, B // 2)]
    for name in ("tokens", "loss_mask", "advantages", "old_logprobs", "group_id"):
        joined = np.concatenate([getattr(p.batch, name) for p in parts])
        np.testing.assert_array_equal(getattr(whole.batch, name), joined, err_msg=name)
    np.testing.assert_array_equal(whole.rows["rewards"],
                                  np.concatenate([p.rows["rewards"] for p in parts]))
    real = lambda o: o[o[:, 0] >= 0]  # noqa: E731
    key = lambda o: o[np.lexsort((o[:, 1], o[:, 0]))]  # noqa: E731
    np.testing.assert_array_equal(
        key(real(whole.feedback.observations)),
        key(real(np.concatenate([p.feedback.observations for p in parts]))))
    # The halves' stats add up to the whole's, field by field (sums of small integers, exact
    # in floats), but for the refill rounds' cost: a half regenerates its whole share in
    # any round that one of its slots needs.
    def no_cost(s):
        return s if s.refill is None else dataclasses.replace(
            s, refill=dataclasses.replace(s.refill, generated_groups=0.0))

    assert no_cost(parts[0].stats + parts[1].stats) == no_cost(whole.stats)
    return whole


def test_refill_replaces_zero_variance_groups_per_slot_on_any_split(tmp_path):
    plain = make_producer(ds.DynamicSamplingConfig(), tmp_path / "plain")
    dyn = make_producer(ds.DynamicSamplingConfig(max_rounds=3), tmp_path / "dyn")
    for step in range(3):
        a, b = produce(plain, step), split_equals_whole(dyn, step)
        assert b.batch.tokens.shape == a.batch.tokens.shape  # the batch size stays B·G
        np.testing.assert_array_equal(b.batch.group_id, a.batch.group_id)
        za = ds.zero_variance(a.rows["rewards"], G)
        zb = ds.zero_variance(b.rows["rewards"], G)
        assert za.sum() >= 2 and zb.sum() < za.sum()  # something to refill, and it was
        assert b.stats.refill.zero_std_round0 == za.sum()
        assert b.stats.refill.replaced >= za.sum() - zb.sum()
        # A slot that kept its round-0 group is unchanged, rows and all.
        keep = np.repeat(~za, G)
        np.testing.assert_array_equal(b.batch.tokens[keep], a.batch.tokens[keep])
        # Every slot reports its round 0, plus one row per refill it took.
        obs = b.feedback.observations
        real = obs[obs[:, 0] >= 0]
        assert np.sum(real[:, 1] == 0) == B
        assert len(real) - B >= b.stats.refill.replaced


def test_without_dynamic_sampling_the_record_is_the_plain_stream(tmp_path):
    prod = make_producer(ds.DynamicSamplingConfig(), tmp_path)
    out = produce(prod, 2)
    train = prod.task.train
    assert [train[i] for i in out.feedback.admission.indices] == \
        prod.curator.stream.take(2, B, 0, B)
    assert out.rows["texts"].tolist() == [e.id for e in prod.curator.stream.take(2, B, 0, B)
                                          for _ in range(G)]
    assert out.stats.refill is None


def test_curated_admission_splits_like_the_whole(tmp_path):
    """With curation on, both halves read one admission: the step's slots are its B indices."""
    prod = make_producer(ds.DynamicSamplingConfig(max_rounds=2), tmp_path,
                         CurationConfig(enabled=True, readmit_after=5))
    for step in range(4):
        out = split_equals_whole(prod, step)
        prod.curator.update(out.feedback.admission, out.feedback.observations)
    assert prod.curator.held  # the 0 and 1 pass-rate prompts were held back


def test_overlong_filter_masks_cut_off_rows(tmp_path):
    prod = make_producer(ds.DynamicSamplingConfig(overlong_filter=True), tmp_path)
    out = produce(prod, 0)
    cut = ds.truncated(out.rows["tokens"], out.rows["mask"], (STOP,))
    assert 0 < cut.sum() < len(cut)
    assert not out.batch.loss_mask[cut].any()
    np.testing.assert_array_equal(out.batch.loss_mask[~cut].sum(1),
                                  out.rows["mask"][~cut].sum(1))
    assert out.stats.truncated == cut.sum()


def test_soft_overlong_punishment_values(tmp_path):
    # N = 12, L_cache = 4: no penalty up to 8 tokens, then -1/4 per token, -1 at 12.
    pen = ds.overlong_penalty(np.array([1, 8, 9, 10, 12]), 12, 4)
    np.testing.assert_array_equal(pen, np.array([0, 0, -0.25, -0.5, -1], np.float32))
    np.testing.assert_array_equal(ds.overlong_penalty(np.array([12]), 12, 0), [0.0])
    prod = make_producer(ds.DynamicSamplingConfig(overlong_buffer=2, overlong_penalty=0.5),
                         tmp_path)
    out = produce(prod, 0)
    lengths = out.rows["mask"].sum(1)
    raw = out.rows["correct"].astype(np.float32)  # the fake's reward is its correctness
    pen = ds.overlong_penalty(lengths, N, 2, 0.5)
    np.testing.assert_array_equal(out.rows["rewards"], raw + pen)
    np.testing.assert_array_equal(out.rows["part_overlong"], pen)
    assert out.stats.reward_parts["overlong"] == pen.sum() < 0
    assert out.stats.correct == raw.sum()


def test_helpers():
    r = np.array([1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0], np.float32)
    np.testing.assert_array_equal(ds.zero_variance(r, 4), [True, False, True])
    tokens = np.array([[5, STOP, 0], [5, 6, 7], [STOP, 0, 0]])
    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
    np.testing.assert_array_equal(ds.truncated(tokens, mask, (STOP,)), [False, True, False])
    with pytest.raises(ValueError, match="max_rounds"):
        ds.DynamicSamplingConfig(max_rounds=-1)


def test_select_groups_takes_each_slot_from_its_round(tmp_path):
    prod = make_producer(ds.DynamicSamplingConfig(), tmp_path)
    rounds = [prod._generate(None, prod.task.train[8 * r:8 * r + 2], 0, 0, r, StepTimer())
              for r in range(3)]
    out = ds.select_groups(rounds, np.array([2, 0]))
    np.testing.assert_array_equal(out.tokens[:G], rounds[2].tokens[:G])
    np.testing.assert_array_equal(out.tokens[G:], rounds[0].tokens[G:])
    assert out.examples == [rounds[2].examples[0], rounds[0].examples[1]]
    assert out.texts[:G] == rounds[2].texts[:G]
    np.testing.assert_array_equal(out.group_ids, rounds[0].group_ids)
