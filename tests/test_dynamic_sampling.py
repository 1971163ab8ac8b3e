"""Dynamic sampling and overlong shaping without a model: the producer runs on a fake
rollout whose rewards are a seeded function of (prompt, sampling key, global row), as the
engine's are, so what a slot ends up with can be compared across host splits."""

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


def make_producer(dynamic, curation=CurationConfig()):
    # Pass probabilities 0 and 1 (always zero variance) and in between.
    ps = [0.0, 1.0, 0.5, 0.3, 0.0, 0.8, 1.0, 0.6] * 8
    train = [Example(str(i), f"q{i}", "1", meta={"p": p}) for i, p in enumerate(ps)]
    task = Task("fake", train, train[:4], reward=lambda c, e: 0.0)
    curator = Curator(curation, PromptStream(train, 0), B, 0)
    sampling = SamplingConfig(max_new_tokens=N, stop_token_ids=(STOP,), pad_token_id=0)
    return Producer(None, None, task, NoCounters(), curator, AlgoConfig(group_size=G),
                    sampling, B, P, jax.random.key(0), dynamic, rollout_fn=fake_rollout)


def split_equals_whole(producer, step):
    whole = producer.produce(step, None, 0, B, StepTimer())
    parts = [producer.produce(step, None, s, s + B // 2, StepTimer()) for s in (0, B // 2)]
    for name in ("tokens", "loss_mask", "advantages", "old_logprobs", "group_id"):
        joined = np.concatenate([getattr(p.batch, name) for p in parts])
        np.testing.assert_array_equal(getattr(whole.batch, name), joined, err_msg=name)
    np.testing.assert_array_equal(whole.rollouts.rewards,
                                  np.concatenate([p.rollouts.rewards for p in parts]))
    real = lambda o: o[o[:, 0] >= 0]  # noqa: E731
    key = lambda o: o[np.lexsort((o[:, 1], o[:, 0]))]  # noqa: E731
    np.testing.assert_array_equal(
        key(real(whole.observations)),
        key(real(np.concatenate([p.observations for p in parts]))))
    for name in ("refill/replaced", "zero_std", "correct", "rows"):
        if name in whole.sums:
            assert whole.sums[name] == sum(p.sums[name] for p in parts), name
    return whole


def test_refill_replaces_zero_variance_groups_per_slot_on_any_split():
    plain = make_producer(ds.DynamicSamplingConfig())
    dyn = make_producer(ds.DynamicSamplingConfig(max_rounds=3))
    for step in range(3):
        a, b = plain.produce(step, None, 0, B, StepTimer()), split_equals_whole(dyn, step)
        assert b.batch.tokens.shape == a.batch.tokens.shape  # the batch size stays B·G
        np.testing.assert_array_equal(b.batch.group_id, a.batch.group_id)
        za = ds.zero_variance(a.rollouts.rewards, G)
        zb = ds.zero_variance(b.rollouts.rewards, G)
        assert za.sum() >= 2 and zb.sum() < za.sum()  # something to refill, and it was
        assert b.sums["refill/zero_std_round0"] == za.sum()
        assert b.sums["refill/replaced"] >= za.sum() - zb.sum()
        # A slot that kept its round-0 group is unchanged, rows and all.
        keep = np.repeat(~za, G)
        np.testing.assert_array_equal(b.batch.tokens[keep], a.batch.tokens[keep])
        # Every slot reports its round 0, plus one row per refill it took.
        real = b.observations[b.observations[:, 0] >= 0]
        assert np.sum(real[:, 1] == 0) == B
        assert len(real) - B >= b.sums["refill/replaced"]


def test_without_dynamic_sampling_the_record_is_the_plain_stream():
    prod = make_producer(ds.DynamicSamplingConfig())
    rec = prod.produce(2, None, 0, B, StepTimer())
    assert rec.rollouts.examples == prod.curator.stream.take(2, B, 0, B)
    assert "refill/replaced" not in rec.sums


def test_curated_admission_splits_like_the_whole():
    """With curation on, both halves read one plan: the step's slots are its B indices."""
    prod = make_producer(ds.DynamicSamplingConfig(max_rounds=2),
                         CurationConfig(enabled=True, readmit_after=5))
    for step in range(4):
        rec = split_equals_whole(prod, step)
        prod.curator.update(rec.plan, rec.observations)
    assert prod.curator.held  # the 0 and 1 pass-rate prompts were held back


def test_overlong_filter_masks_cut_off_rows():
    prod = make_producer(ds.DynamicSamplingConfig(overlong_filter=True))
    rec = prod.produce(0, None, 0, B, StepTimer())
    cut = ds.truncated(rec.rollouts.tokens, rec.rollouts.mask, (STOP,))
    assert 0 < cut.sum() < len(cut)
    assert not rec.batch.loss_mask[cut].any()
    np.testing.assert_array_equal(rec.batch.loss_mask[~cut].sum(1),
                                  rec.rollouts.mask[~cut].sum(1))
    assert rec.sums["truncated"] == cut.sum()


def test_soft_overlong_punishment_values():
    # N = 12, L_cache = 4: no penalty up to 8 tokens, then -1/4 per token, -1 at 12.
    pen = ds.overlong_penalty(np.array([1, 8, 9, 10, 12]), 12, 4)
    np.testing.assert_array_equal(pen, np.array([0, 0, -0.25, -0.5, -1], np.float32))
    np.testing.assert_array_equal(ds.overlong_penalty(np.array([12]), 12, 0), [0.0])
    prod = make_producer(ds.DynamicSamplingConfig(overlong_buffer=2, overlong_penalty=0.5))
    rec = prod.produce(0, None, 0, B, StepTimer())
    lengths = rec.rollouts.mask.sum(1)
    raw = rec.rollouts.reward_parts["_correct"]  # the fake's reward is its correctness
    np.testing.assert_array_equal(rec.rollouts.rewards, raw + ds.overlong_penalty(lengths, N, 2,
                                                                                 0.5))
    assert rec.sums["part/overlong"] < 0 and rec.sums["correct"] == raw.sum()


def test_helpers():
    r = np.array([1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0], np.float32)
    np.testing.assert_array_equal(ds.zero_variance(r, 4), [True, False, True])
    tokens = np.array([[5, STOP, 0], [5, 6, 7], [STOP, 0, 0]])
    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
    np.testing.assert_array_equal(ds.truncated(tokens, mask, (STOP,)), [False, True, False])
    with pytest.raises(ValueError, match="max_rounds"):
        ds.DynamicSamplingConfig(max_rounds=-1)


def test_select_groups_takes_each_slot_from_its_round():
    prod = make_producer(ds.DynamicSamplingConfig())
    rounds = [prod._generate(None, prod.task.train[8 * r:8 * r + 2], 0, 0, r, StepTimer())
              for r in range(3)]
    out = ds.select_groups(rounds, np.array([2, 0]))
    np.testing.assert_array_equal(out.tokens[:G], rounds[2].tokens[:G])
    np.testing.assert_array_equal(out.tokens[G:], rounds[0].tokens[G:])
    assert out.examples == [rounds[2].examples[0], rounds[0].examples[1]]
    assert out.texts[:G] == rounds[2].texts[:G]
    np.testing.assert_array_equal(out.group_ids, rounds[0].group_ids)
