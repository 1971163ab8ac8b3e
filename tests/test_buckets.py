"""The train batch cut to its bucket (`locojax/rl/buckets.py`) trains as the uncut batch.

The invariance is checked with the layout harness (`test_layout_invariance.py`): its bound,
its comparison, and one update of its TINY model in float64, on a GRPO batch with a shared
prompt (4 groups of 4) padded far past its real length, cut against uncut. The cut drops
columns that only ever add exact zeros, so the harness's bound (which counts nonzero terms)
covers it as it covers its own padding layout.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

import layout_worker as lw
from locojax.rl import batch as batch_lib
from locojax.rl import buckets
from tests.test_layout_invariance import QUICK_MODE, compare, run

B, G = lw.B, 4


def grpo_batch(prompt_cap: int = 40, new_cap: int = 24) -> batch_lib.TrainBatch:
    """16 rows in 4 groups sharing their prompt (2..6 tokens, left-padded to `prompt_cap`),
    responses of 1..10 tokens right-padded to `new_cap`; half the rows stale, β's reference
    logprobs given (the harness's problem, with a shared prefix)."""
    rng = np.random.default_rng(99)
    prompt_len = np.repeat(rng.integers(2, lw.P + 1, B // G), G)
    resp_len = rng.integers(1, lw.R + 1, B)
    resp_len[3] = lw.R
    pm = np.arange(prompt_cap)[None] >= (prompt_cap - prompt_len)[:, None]
    rm = np.arange(new_cap)[None] < resp_len[:, None]
    pt = np.where(pm, np.repeat(rng.integers(1, lw.VOCAB, (B // G, prompt_cap)), G, 0), 0)
    rt = np.where(rm, rng.integers(1, lw.VOCAB, (B, new_cap)), 0)
    behav = rng.uniform(-7.2, -5.4, (B, new_cap))
    ref = np.concatenate([np.zeros((B, prompt_cap)), rng.uniform(-7.0, -5.5, (B, new_cap))], 1)
    adv = rng.normal(size=B).astype(np.float32)
    return batch_lib.from_rollout(pt, pm, rt, rm, behav, adv, np.repeat(np.arange(B // G), G),
                                  staleness=np.arange(B) % 2, ref_logprobs=ref, group_size=G)


def test_bucket_widths():
    assert [buckets.bucket(n, 256) for n in (0, 1, 16, 17, 115, 129, 256)] == \
        [16, 16, 16, 32, 128, 256, 256]
    assert buckets.bucket(100, 40) == 40  # never wider than the uncut batch


def test_bucket_refuses_a_negative_need():
    with pytest.raises(ValueError, match="need ≥ 0"):
        buckets.bucket(-1, 16)


def test_fit_cuts_padding_only():
    batch = grpo_batch()
    out, sizes = buckets.fit(batch)
    assert out.tokens.shape == (B, 32) and out.shared_prefix == batch_lib.SharedPrefix(16, G)
    # Every real token and target survives, in order, with its position and logprobs.
    for name in ("tokens", "positions", "old_logprobs", "ref_logprobs"):
        a, b = np.asarray(getattr(batch, name)), np.asarray(getattr(out, name))
        mask_a, mask_b = np.asarray(batch.attn_mask), np.asarray(out.attn_mask)
        assert all((a[r][mask_a[r]] == b[r][mask_b[r]]).all() for r in range(B)), name
    assert np.asarray(out.loss_mask).sum() == np.asarray(batch.loss_mask).sum()
    assert sizes == {"perf/train_columns": 32.0, "perf/train_tokens": 32.0 * B,
                     "perf/train_real_tokens": float(np.asarray(batch.attn_mask).sum())}
    batch_lib.validate(out)  # still a batch with a true shared prefix


def test_fit_takes_the_widest_host():
    """Hosts agree: another host's longer prompt widens this host's cut, and the counts are
    every host's."""
    batch = grpo_batch()
    other = np.asarray([[33, 3, 100]])  # a host with a 33-token prompt
    out, sizes = buckets.fit(batch, lambda mine: np.concatenate([mine, other]))
    assert out.shared_prefix.columns == 40  # bucket(33) = 64, capped at the uncut 40
    assert sizes["perf/train_tokens"] == 2 * B * out.tokens.shape[1]
    assert sizes["perf/train_real_tokens"] == np.asarray(batch.attn_mask).sum() + 100


def test_fit_without_prefix_recovers_the_harness_batch():
    """The harness's own batch (no shared prefix) padded 3 columns left and 20 right: the cut
    gives back exactly the unpadded batch (16 columns, its real span), bitwise."""
    want = lw.make_batch()
    out, _ = buckets.fit(lw.make_batch(3, 20))
    for name in batch_lib.PER_TOKEN:
        np.testing.assert_array_equal(np.asarray(getattr(out, name)),
                                      np.asarray(getattr(want, name)), err_msg=name)


def test_cut_refuses_to_drop_real_tokens():
    batch = grpo_batch()
    with pytest.raises(ValueError, match="would drop real tokens"):
        buckets.cut(batch, 2, 24)  # prompts have up to 6 tokens


def test_cut_batch_trains_as_the_uncut_one():
    """One f64 update on the cut batch matches the uncut batch's within the harness bound
    (the cut is 32 of 64 columns, the prompt's forward once per group in both)."""
    full = grpo_batch()
    cut, _ = buckets.fit(full)
    assert cut.tokens.shape[1] < full.tokens.shape[1]
    with mock.patch.object(lw, "make_batch", lambda *_: full):  # also pg_loss_scale's batch
        want = run({"data": 1}, QUICK_MODE)
        with mock.patch.object(lw, "make_batch", lambda *_: cut):
            got = run({"data": 1}, QUICK_MODE)
        compare(got, want, "cut to its bucket", QUICK_MODE, "float64")
