"""Automatic micro-batching (`LearnerConfig.grad_accum = AUTO_ACCUM`) and the group-keeping
row split behind it.

What must hold: the split into parts is strided over blocks of whole groups, so every
device's rows split locally and each part still runs its prompts once per group; the
automatic count follows its rule (CPU only, logits per device within the budget, whole
groups preferred, no split when nothing fits); and an automatic step computes the same
update as one micro-batch (bounds: tests/test_shared_prefix.py's docstring, the same sums
in another order).
"""

from unittest import mock

import jax
import numpy as np
import pytest

from locojax.rl import batch as batch_lib
from locojax.rl import logprobs, micro_batches
from locojax.rl.config import AUTO_ACCUM, AlgoConfig, LearnerConfig
from tests.test_shared_prefix import MODEL, RTOL, B, G, grouped_batch, one_update


def test_split_keeps_whole_blocks_local_to_each_device_and_inverts():
    x = np.arange(16)
    parts = np.asarray(batch_lib.split_rows(x, 2, group=4))
    assert parts.tolist() == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    for part in parts:  # two devices holding rows 0-7 and 8-15: each gives every part half
        assert np.sum(part < 8) == np.sum(part >= 8) == 4
    assert np.asarray(batch_lib.unsplit_rows(parts, group=4)).tolist() == x.tolist()
    rows = np.asarray(batch_lib.split_rows(x, 2))  # group 1: single rows interleaved
    assert rows.tolist() == [list(range(0, 16, 2)), list(range(1, 16, 2))]
    assert np.asarray(batch_lib.unsplit_rows(rows)).tolist() == x.tolist()
    with pytest.raises(ValueError, match="does not split into 3 equal parts of whole 4-row"):
        batch_lib.split_rows(np.arange(20), 3, group=4)


AUTO = LearnerConfig(algo=AlgoConfig(group_size=8))


@pytest.mark.parametrize("case, expected", [
    # SMALL: 128 rows x 64 targets x V 4096 = 1 MiB of logits a row: 16 rows a micro-batch
    (dict(rows=128, targets_per_row=64, vocab=4096, group=8), 8),
    (dict(rows=128, targets_per_row=64, vocab=4096, group=8, devices=2), 4),  # per device
    (dict(rows=32, targets_per_row=32, vocab=512, group=4), 1),  # TINY fits whole
    (dict(rows=128, targets_per_row=512, vocab=151936, group=8), 1),  # nothing fits: no split
    (dict(rows=128, targets_per_row=64, vocab=4096, group=8, platform="gpu"), 1),
    # 4 MiB a row: only 4-row micro-batches fit, which would break the groups of 8: kept whole
    (dict(rows=16, targets_per_row=64, vocab=16384, group=8), 1),
    (dict(rows=16, targets_per_row=64, vocab=16384, group=1), 4),  # no groups: rows split
])
def test_automatic_count_follows_its_rule(case, expected):
    case = {"devices": 1, "platform": "cpu", **case}
    assert micro_batches.micro_batches(AUTO, **case) == expected


def test_an_explicit_count_is_kept():
    cfg = LearnerConfig(grad_accum=2)
    assert micro_batches.micro_batches(cfg, 128, 64, 4096, platform="cpu") == 2
    assert LearnerConfig().grad_accum == AUTO_ACCUM
    with pytest.raises(ValueError, match="grad_accum must be >= 1, or 0"):
        LearnerConfig(grad_accum=-1)


def test_automatic_split_keeps_the_update_and_the_prompt_sharing(monkeypatch):
    cfg = LearnerConfig(algo=AlgoConfig(name="grpo", beta=0.04))
    one = LearnerConfig(algo=cfg.algo, grad_accum=1)
    batch = grouped_batch()
    targets = batch.tokens.shape[1] - batch.shared_prefix.columns
    # a budget of one group's logits: the automatic step splits into B / G micro-batches
    monkeypatch.setattr(micro_batches, "CPU_MICRO_LOGITS_BYTES", G * targets * MODEL.vocab_size * 4)
    assert micro_batches.resolve(cfg, batch, MODEL.vocab_size).grad_accum == B // G
    with mock.patch.object(logprobs, "prefix_hidden", wraps=logprobs.prefix_hidden) as spy:
        metrics, grads = one_update(batch, cfg)
    assert spy.called  # the prompt ran once per group inside each micro-batch
    metrics_one, grads_one = one_update(batch, one)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_one)):
        np.testing.assert_allclose(got, want, rtol=0, atol=RTOL * np.abs(want).max())
    # the loss is the same f32 sum in another order (RTOL as above); atol only keeps a loss
    # that happens to lie near 0 from asking more than ulps of its ~1e-2-sized terms
    np.testing.assert_allclose(metrics["actor/pg_loss"], metrics_one["actor/pg_loss"],
                               rtol=RTOL, atol=1e-7)
