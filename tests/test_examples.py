"""Each example of examples/ runs as docs/your_task.md says: a short `train` on the tiny
preset (random weights: the point is the wiring, not learning), then `eval` of the exported
model with the same task options."""

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EX = os.path.join(ROOT, "examples")
SHORT = ["--model", "tiny", "--mode", "single", "--steps", "2", "--rollout.prompts-per-step",
         "4", "--algo.group-size", "2", "--rollout.max-new-tokens", "8", "--eval.every", "0",
         "--no-progress", "--no-tensorboard"]


def locojax(*args, cwd=ROOT, timeout=600):
    out = subprocess.run([sys.executable, "-m", "locojax.cli", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"locojax {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
    return out


def metrics(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    for r in rows:
        assert all(np.isfinite(v) for v in r.values() if isinstance(v, float)), r
    return rows


def test_trl_reward_file_on_jsonl(tmp_path):
    task = ["--task.data", "examples/trl_reward/data.jsonl",
            "--task.reward", "examples/trl_reward/rewards.py:reward_len",
            "examples/trl_reward/rewards.py:correct"]
    run = tmp_path / "run"
    locojax("train", "demo", *SHORT, "--run-dir", str(run), "--task.name", "data", *task,
            "--task.reward-weights", "0.1", "1", "--rollout.max-prompt-tokens", "auto")
    last = metrics(run)[-1]
    assert last["step"] == 2 and last["reward/errors"] == 0
    # reward_len: -|20 - len| / 20 over completions of at most 8 characters, so in [-1, -0.6]
    assert -1.0 <= last["reward/reward_len/mean"] <= -0.6
    out = tmp_path / "eval.jsonl"
    locojax("eval", "--model", str(run / "final_model"), "--task", "data",
            "--data", "examples/trl_reward/data.jsonl",
            "--reward", "examples/trl_reward/rewards.py:correct", "--max-new-tokens", "8",
            "--out", str(out))  # --max-prompt-tokens: auto, from the rows
    summary = json.load(open(f"{out}.summary.json"))
    assert summary["rows"] == 24 and summary["task"] == "data"


def test_datasets_directory_with_custom_columns(tmp_path):
    data = tmp_path / "sums"
    subprocess.run([sys.executable, os.path.join(EX, "datasets_columns", "make_dataset.py"),
                    str(data)], check=True, timeout=300)
    task = ["--task.data", str(data), "--task.prompt-field", "question",
            "--task.answer-field", "total",
            "--task.reward", "examples/datasets_columns/rewards.py:exact"]
    run = tmp_path / "run"
    # the conversational prompt, in the tokenizer's chat template, is ~40 characters
    locojax("train", "demo", *SHORT, "--run-dir", str(run), "--task.name", "data", *task,
            "--rollout.max-prompt-tokens", "48")
    last = metrics(run)[-1]
    assert last["step"] == 2 and last["reward/errors"] == 0 and "reward/exact/mean" in last
    out = tmp_path / "eval.jsonl"
    locojax("eval", "--model", str(run / "final_model"), "--task", "data", "--data", str(data),
            "--prompt-field", "question", "--answer-field", "total",
            "--reward", "examples/datasets_columns/rewards.py:exact", "--max-new-tokens", "4",
            "--max-prompt-tokens", "48", "--out", str(out))
    rows = [json.loads(line) for line in open(out)]
    assert len(rows) == 8 and rows[0]["id"] == "sums/test:1"  # the test split, by name
    assert rows[0]["prompt"].startswith("<|im_start|>user\n")  # rendered as chat


def test_tool_env_of_your_own(tmp_path):
    out = tmp_path / "eval.jsonl"
    locojax("eval", "--model", "tiny", "--task", "examples/tool_env/env.py:make_env",
            "--data", "examples/tool_env/words.jsonl", "--max-new-tokens", "8",
            "--max-prompt-tokens", "32", "--multi-turn.max-turns", "2", "--out", str(out))
    summary = json.load(open(f"{out}.summary.json"))
    assert summary["rows"] == 4 and "tool_call_rate" in summary
