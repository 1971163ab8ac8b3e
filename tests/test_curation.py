"""Pass-rate curation without a model: the table, holding back and re-admission, the cursor,
exact JSON round trips, and host-order independence of the update."""

import json

import numpy as np
import pytest

from locojax.envs.base import Example
from locojax.train.curation import (
    HIST_NAMES, MAX_SKIPS_PER_SLOT, CurationConfig, Curator, histogram,
)
from locojax.train.data import PromptStream

B = 4


def make(n=40, seed=3, **cfg):
    examples = [Example(f"e{i}", f"p{i}", str(i)) for i in range(n)]
    return Curator(CurationConfig(enabled=bool(cfg.pop("enabled", True)), **cfg),
                   PromptStream(examples, seed), B, seed)


def obs(admission, solved, g=8, round_=0):
    """Observation rows for every slot of an admission, `solved[j]` right of `g` at slot j."""
    return np.array([[j, round_, i, s, g] for j, (i, s) in
                     enumerate(zip(admission.indices, solved))], np.int32)


def test_off_is_the_plain_stream_in_any_order():
    cur = make(enabled=False)
    stream = cur.stream
    for step in (5, 0, 11, 10):  # admission needs no order and changes nothing
        admission = cur.admit(step)
        assert [stream.examples[i] for i in admission.indices] == stream.take(step, B, 0, B)
        assert (admission.cursor, admission.end, admission.skipped) == (step * B, (step + 1) * B, 0)
    cur.update(cur.admit(0), np.zeros((0, 5), np.int32))
    assert cur.cursor == B and cur.state()["table"]["index"] == []


def test_extreme_prompts_are_held_then_readmitted():
    cur = make(n=8, readmit_after=3)
    p0 = cur.admit(0)
    assert cur.admit(0) == p0  # pure: admitting twice gives the same admission
    # Slot 0 never solved, slot 1 always, slots 2 and 3 in between.
    m = cur.update(p0, obs(p0, [0, 8, 3, 5]))
    easy, hard = p0.indices[1], p0.indices[0]
    assert cur.held == {hard: 3, easy: 3}  # held at steps 1..3
    assert m["curation/held"] == 2.0 and m["curation/frac_filtered"] == 0.0
    assert m["curation/pass_rate_hist/0"] == m["curation/pass_rate_hist/1"] == 0.25
    assert cur.pass_rate(p0.indices[2]) == 3 / 8
    # 8 prompts, 4 a step: steps 2 and 3 walk epoch 1, which holds both held prompts once.
    skipped = 0
    for step in range(1, 4):
        admission = cur.admit(step)
        assert hard not in admission.indices and easy not in admission.indices
        skipped += admission.skipped
        cur.update(admission, obs(admission, [4] * B))
    assert skipped >= 2
    assert cur.held == {}  # released after step 3: admissible again, and drawn again
    admitted = []
    for step in range(4, 8):
        admission = cur.admit(step)
        admitted += admission.indices
        cur.update(admission, obs(admission, [4] * B))
    assert hard in admitted and easy in admitted


def test_skipped_draws_advance_the_cursor_past_held_prompts():
    cur = make(n=8, readmit_after=100)
    p0 = cur.admit(0)
    cur.update(p0, obs(p0, [8, 8, 0, 0]))  # all four held for 100 steps
    p1 = cur.admit(1)
    cur.update(p1, obs(p1, [4] * B))
    # Epoch 2 (draws 8..15) holds the four held prompts again: step 2 must skip all of them.
    p2 = cur.admit(2)
    assert p2.cursor == 8 and p2.skipped == 4 and p2.end == 16
    assert set(p2.indices) == set(p1.indices)
    m = cur.update(p2, obs(p2, [4] * B))
    assert m["curation/frac_filtered"] == 4 / (4 + B) and cur.cursor == 16


def test_all_held_still_admits_within_the_skip_budget():
    cur = make(n=4, readmit_after=1000)
    p0 = cur.admit(0)
    cur.update(p0, obs(p0, [0] * B))
    admission = cur.admit(1)  # every prompt held: skip the budget, then admit what comes
    assert admission.skipped == MAX_SKIPS_PER_SLOT * B and admission.forced == B
    assert admission.end - admission.cursor == admission.skipped + B


def test_keep_prob_down_weights_held_draws_deterministically():
    def skipped(keep):
        cur = make(n=4, readmit_after=1000, keep_prob=keep)
        p0 = cur.admit(0)
        cur.update(p0, obs(p0, [0] * B))
        a, b = cur.admit(1), cur.admit(1)
        assert a == b
        return a.skipped
    assert skipped(1.0) == 0
    # A uniform draw per held draw: with p = 0.5 the admitted count over the budget is binomial.
    assert 0 < skipped(0.5) < MAX_SKIPS_PER_SLOT * B
    assert skipped(0.0) == MAX_SKIPS_PER_SLOT * B


def test_running_pass_rate_decays_by_memory():
    cur = make(memory=0.5, too_easy=1.1, too_hard=-0.1)  # hold nothing, just track
    p0 = cur.admit(0)
    cur.update(p0, obs(p0, [8, 0, 0, 0]))
    i = p0.indices[0]
    p1 = cur.admit(1)
    rows = np.array([[0, 0, i, 2, 8]], np.int32)  # the same prompt seen again: 2/8
    cur.update(p1, rows)
    # samples 0.5·8 + 8 = 12, solved 0.5·8 + 2 = 6 (exact in binary floating point)
    assert cur.samples[i] == 12.0 and cur.solved[i] == 6.0 and cur.pass_rate(i) == 0.5


def test_update_ignores_host_order_and_padding():
    rng = np.random.default_rng(0)
    a, b = make(memory=0.3), make(memory=0.3)
    for step in range(6):
        admission = a.admit(step)
        assert b.admit(step) == admission
        rows = obs(admission, rng.integers(0, 9, B))
        # A refill round that reuses slot 0's prompt: one prompt twice in one step.
        rows = np.concatenate([rows, [[0, 1, admission.indices[1], 8, 8]]]).astype(np.int32)
        pad = np.full((3, 5), -1, np.int32)
        a.update(admission, np.concatenate([rows, pad]))
        b.update(admission, np.concatenate([pad, rows[::-1]]))  # another host order
    assert json.dumps(a.state()) == json.dumps(b.state())


def test_state_round_trips_through_json_exactly():
    rng = np.random.default_rng(1)
    cur = make(memory=0.3, readmit_after=2)
    for step in range(5):
        admission = cur.admit(step)
        cur.update(admission, obs(admission, rng.integers(0, 9, B)))
    back = make(memory=0.3, readmit_after=2)
    back.load_state(json.loads(json.dumps(cur.state())))
    assert back.state() == cur.state()
    assert back.samples == cur.samples and back.solved == cur.solved  # floats bitwise
    for step in range(5, 9):  # and they go on identically
        admission = cur.admit(step)
        assert back.admit(step) == admission
        rows = obs(admission, rng.integers(0, 9, B))
        assert back.update(admission, rows) == cur.update(admission, rows)


def test_admissions_must_follow_updates_when_curation_is_on():
    cur = make()
    with pytest.raises(ValueError, match="step by step"):
        cur.admit(1)


def test_refill_candidates_are_pure_and_avoid_held_prompts():
    cur = make(n=10, readmit_after=1000)
    p0 = cur.admit(0)
    cur.update(p0, obs(p0, [0, 0, 8, 8]))
    picks = [cur.refill_index(1, slot, r) for slot in range(8) for r in (1, 2, 3)]
    assert picks == [cur.refill_index(1, slot, r) for slot in range(8) for r in (1, 2, 3)]
    assert not set(picks) & set(p0.indices)
    assert len(set(picks)) > 1  # seeded by (step, slot, round): not one prompt for all


def test_histogram_bins():
    h = histogram(np.array([0, 0.125, 0.25, 0.375, 0.5, 0.875, 1, 1]))
    assert list(h) == list(HIST_NAMES)
    assert [h[k] * 8 for k in HIST_NAMES] == [1, 2, 2, 0, 1, 2]
    assert sum(histogram(np.array([])).values()) == 0


def test_bad_config():
    with pytest.raises(ValueError, match="too_hard < too_easy"):
        CurationConfig(too_easy=0.2, too_hard=0.5)
    with pytest.raises(ValueError, match="readmit_after"):
        CurationConfig(readmit_after=0)
