"""A host's error ends a multi-host run cleanly (locojax/failure.py, commands/launch.py): when
user code raises on host 1 of 2, at start-up or mid-run, the run stops within seconds and the
last line printed is that host's error, naming the host, the user's exception and its
file:line; no coordination-service or gloo stack traces from the other host, and no wait
in the distributed runtime's shutdown barrier (which took 5 minutes before)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ["demo", "--model", "tiny", "--steps", "4", "--rollout.prompts-per-step", "4",
       "--algo.group-size", "2", "--rollout.max-new-tokens", "8", "--eval.every", "0",
       "--no-progress", "--no-tensorboard", "--rollout.max-prompt-tokens", "8"]

BOOM = '''import os


def _check_host():
    if os.environ.get("LOCOJAX_PROCESS_ID") == "1":
        raise RuntimeError("reward table missing on this host")


_check_host()


def score(completions, **kwargs):
    return [0.0 for _ in completions]
'''

ROWS = '''import os

from locojax.envs.base import Example, Task


class Rows:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if not 0 <= i < 64:
            raise IndexError(i)
        if os.environ.get("LOCOJAX_PROCESS_ID") == "1" and i >= 8:
            raise KeyError(f"row {i} is missing on this host")
        return Example(f"rows:{i}", f"{i % 10}+{i % 7}=", str(i % 10 + i % 7))


def exact(completion, example):
    return float(completion.strip() == example.answer)


def make(seed):
    test = tuple(Example(f"test:{i}", f"{i}+1=", str(i + 1)) for i in range(8))
    return Task("rows", Rows(), test, reward=exact)
'''


def _launch(tmp_path, *args):
    out = subprocess.run([sys.executable, "-m", "locojax.cli", "launch", "--hosts", "2",
                          "--heartbeat-s", "10", "--", "train", *RUN, "--run-dir",
                          str(tmp_path / "run"), *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    lines = (out.stdout + out.stderr).strip().splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith("[launch] host 1 exited"))
    return out.returncode, lines, lines[failed + 1:]


def test_a_reward_module_that_fails_on_one_host_at_start_up(tmp_path):
    (tmp_path / "boom.py").write_text(BOOM)
    (tmp_path / "rows.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": 2}) + "\n")
    code, lines, after = _launch(tmp_path, "--task.name", "data", "--task.data", "rows.jsonl",
                                 "--task.reward", "boom.py:score")
    assert code == 2
    assert after == [f"[launch] host 1 failed: locojax train: host 1 of 2: ValueError: "
                     f"'boom.py:score': cannot import 'boom' (RuntimeError: reward table "
                     f"missing on this host) (at {tmp_path / 'boom.py'}:6)"], lines[-20:]


def test_user_code_that_raises_on_one_host_mid_run(tmp_path):
    """Host 1 raises while admitting its first step's prompts; host 0 is then on its way to
    the step's collectives, where it would wait for host 1 until the gloo timeout."""
    (tmp_path / "rows_task.py").write_text(ROWS)
    code, lines, after = _launch(tmp_path, "--task.name", "rows_task:make")
    assert code == 1
    assert len(after) == 1 and after[0].startswith(
        "[launch] host 1 failed: locojax train: host 1 of 2: KeyError: 'row "), lines[-20:]
    assert after[0].endswith(f"is missing on this host' (at {tmp_path / 'rows_task.py'}:14)")
    assert not any("Check failure" in line or "DEADLINE_EXCEEDED" in line for line in lines)


def test_eval_ends_the_same_way(tmp_path):
    (tmp_path / "boom.py").write_text(BOOM)
    (tmp_path / "rows.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": 2}) + "\n")
    out = subprocess.run([sys.executable, "-m", "locojax.cli", "launch", "--hosts", "2",
                          "--heartbeat-s", "10", "--", "eval", "--model", "tiny", "--task",
                          "data", "--data", "rows.jsonl", "--reward", "boom.py:score",
                          "--max-new-tokens", "4", "--out", str(tmp_path / "e.jsonl")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    last = (out.stdout + out.stderr).strip().splitlines()[-1]
    assert out.returncode == 2
    assert last == (f"[launch] host 1 failed: locojax eval: host 1 of 2: ValueError: "
                    f"'boom.py:score': cannot import 'boom' (RuntimeError: reward table "
                    f"missing on this host) (at {tmp_path / 'boom.py'}:6)"), last
