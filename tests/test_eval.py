"""`locojax eval`: a checkpoint scored on a task's rows, outside training.

Guards: the pass@k estimator equals brute-force enumeration; on GSM8K-format and boxed-math
files (tests/data, not ../shared/data) the rows written are the file's valid rows in order,
each sample's reward is what the task's reward gives its text, and the summary is what the
rows add up to; a procedural task's counts and pass@k agree; a multi-turn task (calc) runs
with its tools; malformed rows are refused naming file:line, or skipped and counted; a
checkpoint's chat template renders the prompts; 2 colocated hosts give exactly the rows and
summary of 1; `--tp 2` gives the rows of `--tp 1`, in one process and on 2 hosts, and a tp
that does not split the host's devices or the model is refused.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.commands import eval as eval_cmd
from locojax.evaluate import pass_at_k

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SMALL = ["--batch-size", "8", "--max-new-tokens", "12", "--max-prompt-tokens", "64"]


def run_eval(tmp_path, *argv) -> tuple[list[dict], dict]:
    out = tmp_path / "rows.jsonl"
    assert eval_cmd.main([*argv, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return rows, json.loads(Path(str(out) + ".summary.json").read_text())


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_is_the_chance_a_k_subset_holds_a_correct_sample(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            # Both are ratios of integers below C(6, 3) = 20: equal to f64 rounding.
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(n, 0, n + 1)


def test_reported_ks():
    assert eval_cmd.pass_ks(1) == [1]
    assert eval_cmd.pass_ks(8) == [1, 2, 4, 8]
    assert eval_cmd.pass_ks(6) == [1, 2, 4, 6]


@pytest.mark.slow
@pytest.mark.parametrize("task,file", [("gsm8k", "gsm8k_small.jsonl"),
                                       ("math", "math_small.jsonl")])
def test_eval_a_data_file(tmp_path, task, file):
    import importlib

    from locojax.envs.registry import TASKS

    module = importlib.import_module(TASKS[task].module)
    examples = module.load(DATA / file).examples
    reward = module.reward()
    k = 2
    rows, summary = run_eval(tmp_path, "--model", "embedded", "--task", task, "--data",
                             str(DATA / file), "--k", str(k), *SMALL)
    assert [r["id"] for r in rows] == [ex.id for ex in examples]
    assert [r["answer"] for r in rows] == [ex.answer for ex in examples]
    assert [r["prompt"] for r in rows] == [ex.prompt for ex in examples]  # plain text
    for r, ex in zip(rows, examples):
        assert len(r["completions"]) == len(r["rewards"]) == k
        # The same reward code as training, on the text the row records.
        assert r["rewards"] == [reward(text, ex) for text in r["completions"]]
        assert r["correct"] == sum(x >= 1 - 1e-6 for x in r["rewards"])
        # A row the budget cut off used the whole budget.
        assert all(n == 12 for n, cut in zip(r["lengths"], r["truncated"]) if cut)
        assert all(1 <= n <= 12 for n in r["lengths"])
    assert summary == {**summary, **eval_cmd.summarize(rows, k, False)}
    assert summary["rows"] == len(examples) and summary["skipped"] == 0
    assert summary["accuracy"] == pytest.approx(
        np.mean([r["correct"] for r in rows]) / k, abs=1e-12)  # integers over 16: exact
    assert summary["temperature"] == 1.0


@pytest.mark.slow
def test_eval_procedural_counts_and_pass_at_k(tmp_path):
    """embedded-strict answers arith level 2 right about 40% of the time: counts vary."""
    k = 4
    rows, summary = run_eval(tmp_path, "--model", "embedded-strict", "--task", "arith",
                             "--level", "2", "--limit", "8", "--k", str(k), *SMALL)
    solved = [r["correct"] for r in rows]
    assert len(rows) == 8 and 0 < sum(solved) < 8 * k
    for j in (1, 2, 4):
        assert summary[f"pass@{j}"] == pytest.approx(
            np.mean([pass_at_k(k, c, j) for c in solved]), abs=1e-12)
    assert summary["pass@1"] == pytest.approx(summary["accuracy"], abs=1e-12)
    assert summary["pass@4"] == pytest.approx(np.mean([c > 0 for c in solved]), abs=1e-12)
    # The format share: completions that stopped by themselves on a `#### N` line, right or
    # wrong, recomputed from the rows' own texts.
    from locojax.envs.gsm8k import format_ok

    ok = np.asarray([[bool(format_ok(t, None)) and not cut
                      for t, cut in zip(r["completions"], r["truncated"])] for r in rows])
    assert [r["in_format"] for r in rows] == ok.tolist() and 0 < ok.sum()
    right = np.asarray([[x >= 1 - 1e-6 for x in r["rewards"]] for r in rows])
    assert summary["format_rate"] == pytest.approx(ok.mean(), abs=1e-12)
    assert summary["accuracy_in_format"] == pytest.approx((ok & right).sum() / ok.sum(),
                                                          abs=1e-12)


@pytest.mark.slow
def test_eval_multi_turn(tmp_path):
    """calc with the tool-using checkpoint: trajectories, tool calls and rewards per row."""
    rows, summary = run_eval(tmp_path, "--model", "embedded-calc", "--task", "calc",
                             "--level", "2", "--limit", "4", "--k", "2", "--batch-size", "4",
                             "--max-new-tokens", "24", "--max-prompt-tokens", "32")
    assert len(rows) == 4 and all(len(r["tool_calls"]) == 2 for r in rows)
    assert summary["tool_call_rate"] == pytest.approx(
        np.mean([[t > 0 for t in r["tool_calls"]] for r in rows]), abs=1e-12)
    for r in rows:
        for text, calls, rew in zip(r["completions"], r["tool_calls"], r["rewards"]):
            assert (calls > 0) == ("<tool>" in text)
            assert rew in (0.0, 1.0)
            assert (rew == 1.0) == text.rstrip().endswith(f"#### {r['answer']}")


@pytest.mark.slow
def test_malformed_rows_are_refused_or_skipped_and_counted(tmp_path, capsys):
    bad = DATA / "gsm8k_malformed.jsonl"
    argv = ["--model", "embedded", "--task", "gsm8k", "--data", str(bad), *SMALL,
            "--out", str(tmp_path / "rows.jsonl")]
    assert eval_cmd.main(argv) == 2
    assert f"{bad}:2: broken JSON line" in capsys.readouterr().err
    rows, summary = run_eval(tmp_path, *argv[:-2], "--skip-invalid")
    assert [r["id"] for r in rows] == ["gsm8k_malformed.jsonl:1", "gsm8k_malformed.jsonl:4"]
    assert summary["skipped"] == 3 and summary["rows"] == 2
    assert "skipped 3 malformed rows" in capsys.readouterr().out


@pytest.mark.slow
def test_chat_template_renders_the_prompts(tmp_path):
    """A random Qwen3 checkpoint with Qwen3's chat template: each row's prompt is what
    transformers' apply_chat_template makes of the task's message."""
    transformers = pytest.importorskip("transformers")
    from locojax.envs import gsm8k
    from tests.hf_reference import random_hf_model, tiny_cfg
    from tests.test_chat_template import hf_checkpoint_dir

    model_dir = hf_checkpoint_dir(tmp_path, "qwen3")
    random_hf_model(tiny_cfg(vocab_size=512)).save_pretrained(str(model_dir))
    rows, summary = run_eval(tmp_path, "--model", str(model_dir), "--task", "gsm8k",
                             "--data", str(DATA / "gsm8k_small.jsonl"), "--template", "chat",
                             "--limit", "2", "--batch-size", "2", "--max-new-tokens", "4",
                             "--max-prompt-tokens", "256")
    hf = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    examples = gsm8k.load(DATA / "gsm8k_small.jsonl", "chat").examples[:2]
    assert [r["prompt"] for r in rows] == [
        hf.apply_chat_template(list(ex.prompt), tokenize=False, add_generation_prompt=True)
        for ex in examples]
    assert summary["temperature"] == 0.0 and summary["template"] == "chat"
    assert eval_cmd.main(["--model", "embedded", "--task", "gsm8k", "--data",
                          str(DATA / "gsm8k_small.jsonl"), "--template", "chat"]) == 2


LAUNCHED = ["--model", "embedded", "--task", "gsm8k", "--data", str(DATA / "gsm8k_small.jsonl"),
            "--k", "2", "--batch-size", "4", "--max-new-tokens", "12", "--max-prompt-tokens", "64"]
TP = ["--model", "embedded-strict", "--task", "arith", "--level", "2", "--limit", "8", *SMALL]
"""Rows on which every greedy token of embedded-strict is decisive (test_tp2_...)."""


def _launch(tmp_path, hosts: int, name: str, argv=LAUNCHED, devices: int = 1
            ) -> tuple[list[dict], dict]:
    out = tmp_path / f"{name}.jsonl"
    cmd = [sys.executable, "-m", "locojax.cli", "launch", "--hosts", str(hosts),
           "--devices-per-host", str(devices), "--", "eval", *argv, "--out", str(out)]
    env = {**os.environ, "LOCOJAX_HEARTBEAT_S": "60"}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return rows, json.loads(Path(str(out) + ".summary.json").read_text())


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_hosts_give_the_rows_of_one(tmp_path):
    """Each host scores its own half (4 rows, one batch of 4, as the single host's two
    batches), samples keyed by global row: the same programs on the same rows, so the
    gathered rows and the summary are bitwise those of one host."""
    one_rows, one = _launch(tmp_path, 1, "one")
    two_rows, two = _launch(tmp_path, 2, "two")
    assert two_rows == one_rows
    assert {**two, "hosts": 1} == one and two["hosts"] == 2


def record_generates(monkeypatch) -> list:
    """Every generate's [engine, weights, prompts, prompt_mask, generation], in call order,
    so a test can re-run a full forward over exactly what eval sampled."""
    from locojax.engine.engine import Engine

    seen, prefill, decode = [], Engine.prefill, Engine.decode

    def record_prefill(self, weights, prompts, *a, prompt_mask=None, **kw):
        seen.append([self, weights, prompts, prompt_mask])
        return prefill(self, weights, prompts, *a, prompt_mask=prompt_mask, **kw)

    def record_decode(self, pending):
        seen[-1].append(gen := decode(self, pending))
        return gen

    monkeypatch.setattr(Engine, "prefill", record_prefill)
    monkeypatch.setattr(Engine, "decode", record_decode)
    return seen


@pytest.mark.slow
def test_tp2_scores_the_rows_of_tp1(tmp_path, monkeypatch):
    """`--tp 2` (data 4 x tensor 2 over the 8 test devices, ROLLOUT_TP) gives the greedy
    completions and rewards of `--tp 1`. The two differ only in the order of the forward's
    sums (tests/test_rollout_tp.py), so a greedy token can differ only where its top logit
    leads by at most 2 · logit_tol; every generated position of the tp 1 run is checked
    to lead by more (a full forward over its prompts and tokens), so equality holds on any
    CPU. Also: the engine's weights really are split over `tensor`."""
    from locojax.model import decoder
    from tests.hf_reference import assert_decisive_argmax

    seen = record_generates(monkeypatch)
    one_rows, one = run_eval(tmp_path, *TP, "--tp", "1")
    tp1 = seen[:]
    two_rows, two = run_eval(tmp_path, *TP, "--tp", "2")
    assert [r["completions"] for r in two_rows] == [r["completions"] for r in one_rows]
    assert two_rows == one_rows and two == one
    assert 0 < one["accuracy"] < 1  # rewards that could differ
    for eng, w, prompts, mask, gen in tp1:
        seq = jnp.concatenate([jnp.asarray(prompts), gen.tokens], axis=1)
        seq_mask = jnp.concatenate([jnp.asarray(mask), gen.mask], axis=1)
        positions = jnp.maximum(jnp.cumsum(seq_mask, axis=1) - 1, 0)
        hidden, _ = decoder.forward(w, seq, positions, eng.model_cfg, mask=seq_mask)
        logits = decoder.logits(w, hidden[:, prompts.shape[1] - 1:-1], eng.model_cfg)
        assert_decisive_argmax(np.asarray(logits)[np.asarray(gen.mask, bool)])
    specs = {str(x.sharding.spec) for _, w, *_ in seen[len(tp1):] for x in jax.tree.leaves(w)}
    assert any("tensor" in s for s in specs), specs


@pytest.mark.parametrize("tp,why", [
    ("3", "--tp 3 does not divide this host's 8 device(s)"),
    ("8", "--tp 8 does not divide the model's num_attention_heads (4)")])
def test_bad_tp_is_refused(tp, why, capsys):
    """A tp that does not split the host's 8 devices, or the embedded model's 4 heads."""
    assert eval_cmd.main(["--model", "embedded", "--task", "arith", "--tp", tp]) == 2
    assert why in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_hosts_tp2_give_the_rows_of_one(tmp_path):
    """`launch --hosts 2 --devices-per-host 2 -- eval --tp 2`: each host splits its engine
    over its own 2 devices. The rows of `TP`, whose greedy tokens are decisive
    (test_tp2_scores_the_rows_of_tp1), so equal to one host's without tp on any CPU."""
    one_rows, one = _launch(tmp_path, 1, "one", TP)
    two_rows, two = _launch(tmp_path, 2, "two", [*TP, "--tp", "2"], devices=2)
    assert two_rows == one_rows
    assert {**two, "hosts": 1} == one and two["hosts"] == 2
