"""`locojax eval` groups rows by prompt length (locojax/commands/eval_groups.py).

Guards: the widths a run compiles are powers of two capped at P, so at most
log2(P / MIN_WIDTH) + 2 of them whatever the data; rows per call shrink past FULL_WIDTH;
the length order is undone exactly; and end to end, grouped evaluation writes the rows of
one-width evaluation (`--one-width`), in file order, while padding each group only to its
own width.
"""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from locojax.commands import eval_groups
from tests.test_eval import record_generates, run_eval


@pytest.mark.parametrize("cap", [16, 48, 64, 1024, 1000])
def test_widths_are_few_and_fit(cap):
    """Every prompt length 1..cap lands on a width that holds it, at most cap, and the
    distinct widths are the powers of two from MIN_WIDTH below cap, plus cap."""
    lengths = list(range(1, cap + 1))
    runs = eval_groups.groups(lengths, cap, 32)
    widths = [g.width for g in runs]
    assert len(set(widths)) == len(widths)  # sorted lengths: one run per width
    bound = max(0, math.ceil(math.log2(cap / eval_groups.MIN_WIDTH))) + 1
    assert len(widths) <= bound
    assert all(w == cap or w & (w - 1) == 0 for w in widths)
    for g in runs:
        assert all(lengths[i] <= g.width <= cap for i in range(g.start, g.stop))
    assert [(g.start, g.stop) for g in runs] == list(zip(
        [0] + [g.stop for g in runs[:-1]], [g.start for g in runs[1:]] + [cap]))


def test_rows_per_call_keep_prompt_tokens():
    assert [eval_groups.rows_at(w, 32) for w in (16, 256, 512, 1024, 8192)] == [32, 32, 16, 8, 1]
    assert eval_groups.rows_at(1024, 2) == 1  # never 0 rows


def test_unsort_undoes_the_length_order():
    lengths = [5, 3, 9, 3, 1, 9]
    perm = eval_groups.order(lengths)
    assert perm.tolist() == [4, 1, 3, 0, 2, 5]  # stable: the two 3s and 9s keep file order
    assert eval_groups.unsort([lengths[i] for i in perm], perm) == lengths


QUESTIONS = ["What is 2+2?", "What is 12 + 30?", "What is 99 - 9?",
             "Tom has 3 boxes of 4 apples. How many apples?", "What is 45 - 17?",
             "Tom has 3 boxes of 4 apples and 2 boxes of 5 apples and 1 box of 6 apples. "
             "How many apples does Tom have?", "What is 6 + 1?"]


@pytest.mark.slow
def test_grouped_rows_are_the_one_width_rows_in_file_order(tmp_path, monkeypatch):
    """Grouped and one-width (every row padded to P = 128) evaluation differ only in how far
    each prompt is left-padded: padded positions are masked out of attention (weight exactly
    0), so the logits differ only in the order and length of the forward's sums, by at most
    logit_tol. A greedy token can then differ only where its top logit leads by at most
    2 · logit_tol; every generated position of the one-width run is checked to lead by more
    (a full forward, as test_eval's tp test does), so the rows are equal on any CPU."""
    from locojax.envs import gsm8k
    from locojax.model import decoder
    from tests.hf_reference import assert_decisive_argmax

    data = tmp_path / "varied.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "#### 4"}) + "\n"
                            for q in QUESTIONS))
    seen = record_generates(monkeypatch)
    argv = ["--model", "embedded", "--task", "gsm8k", "--data", str(data), "--batch-size", "2",
            "--max-new-tokens", "12", "--max-prompt-tokens", "128"]
    one_rows, one = run_eval(tmp_path, *argv, "--one-width")
    one_calls = seen[:]
    grouped_rows, grouped = run_eval(tmp_path, *argv)
    assert {p.shape[1] for *_, p, _m, _g in one_calls} == {128}
    widths = [p.shape[1] for *_, p, _m, _g in seen[len(one_calls):]]
    assert len(set(widths)) >= 3 and widths == sorted(widths)  # 32, 64, 128: really grouped
    examples = gsm8k.load(data).examples  # the file's rows, in file order
    assert [(r["id"], r["prompt"]) for r in grouped_rows] == [(e.id, e.prompt) for e in examples]
    assert grouped_rows == one_rows and grouped == one
    for eng, w, prompts, mask, gen in one_calls:
        seq = jnp.concatenate([jnp.asarray(prompts), gen.tokens], axis=1)
        seq_mask = jnp.concatenate([jnp.asarray(mask), gen.mask], axis=1)
        positions = jnp.maximum(jnp.cumsum(seq_mask, axis=1) - 1, 0)
        hidden, _ = decoder.forward(w, seq, positions, eng.model_cfg, mask=seq_mask)
        logits = decoder.logits(w, hidden[:, prompts.shape[1] - 1:-1], eng.model_cfg)
        assert_decisive_argmax(np.asarray(logits)[np.asarray(gen.mask, bool)])
