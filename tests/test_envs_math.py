r"""Boxed math: last-\boxed extraction, math-verify equivalence with a thread-safe deadline,
and the gold MATH-500 solutions scoring 1."""

import os
import pathlib
import threading
import time

import numpy as np
import pytest

from locojax.envs import math_boxed as mb
from locojax.envs.base import Example
from locojax.envs.rewards import RewardConfig, RewardRunner

DATA = pathlib.Path(os.environ.get(
    "LOCOJAX_DATA", pathlib.Path(__file__).resolve().parents[1] / "../shared/data"))

# Rows of MATH-500 whose gold solution does not score 1 against its answer, with the reason.
# Empty today: every gold solution's last \boxed{} equals its `answer` field.
GOLD_EXCEPTIONS: dict[str, str] = {}
# Rows where the "wrong" answer borrowed from the next row is in fact equivalent.
WRONG_EXCEPTIONS = {
    "test.jsonl:23": "gold '5', borrowed 'x=5': math-verify takes an equation's value; same",
}


@pytest.fixture(scope="module")
def math500():
    path = DATA / "math500" / "test.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present (set LOCOJAX_DATA)")
    return mb.load(path)


def test_gold_solutions_score_one(math500):
    assert len(math500) == 500 and math500.skipped == 0
    failures = {ex.id for ex in math500 if mb.boxed_correct(ex.solution, ex) != 1.0}
    assert failures <= set(GOLD_EXCEPTIONS), sorted(failures - set(GOLD_EXCEPTIONS))
    assert 1 - len(failures) / len(math500) >= 0.98


def _with_box(solution: str, answer: str) -> str:
    box = "\\boxed{" + mb.last_boxed(solution) + "}"
    i = solution.rfind(box)
    return solution[:i] + "\\boxed{" + answer + "}" + solution[i + len(box):]


@pytest.mark.slow
def test_wrong_answers_score_zero_and_math_verify_agrees_on_gold(math500):
    n = len(math500)
    wrongly_right, verify_fails = [], []
    for i, ex in enumerate(math500):
        # math-verify alone (no string fast path) accepts the gold box.
        if not mb._math_verify(ex.answer, mb.last_boxed(ex.solution), 5):
            verify_fails.append(ex.id)
        other = math500[(i + 1) % n].answer
        if mb.normalize_answer(other) == mb.normalize_answer(ex.answer):
            continue
        if mb.boxed_correct(_with_box(ex.solution, other), ex) != 0.0:
            wrongly_right.append(ex.id)
    assert set(wrongly_right) == set(WRONG_EXCEPTIONS), wrongly_right
    assert len(verify_fails) / n <= 0.02, verify_fails


@pytest.mark.parametrize("text,boxed", [
    (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
    (r"\boxed{1} then \boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),
    (r"$\boxed 5$", "5"),
    (r"\fbox{7}", "7"),
    (r"\boxed{\frac{1}{2}", None),  # never closed
    ("no box", None),
    (r"\boxed", None),
])
def test_last_boxed(text, boxed):
    assert mb.last_boxed(text) == boxed


EQUIVALENT = [
    ("0.5", r"\frac{1}{2}"),            # fraction vs decimal
    (r"\dfrac{3}{4}", r"\frac34"),
    (r"2\sqrt{2}", r"\sqrt{8}"),          # radicals
    ("[1,3)", "[1, 3)"),                 # intervals
    (r"(-\infty, 2]", r"(-\infty,2]"),
    ("(2,3)", "(2, 3)"),                 # tuples
    (r"\{1,2\}", r"\{2,1\}"),            # sets are unordered
    (r"30^\circ", "30"),                 # degrees
    (r"\text{Monday}", "Monday"),        # text answers
    (r"\pi/2", r"\frac{\pi}{2}"),
    (r"2+\sqrt{3}", r"\sqrt{3}+2"),
    ("18.00", "18"),
]
DIFFERENT = [
    ("(1,3)", "[1,3]"), ("(3,2)", "(2,3)"), ("1.5", r"\frac{2}{3}"), ("3", "4"),
    ("Tuesday", "Monday"), (r"\sqrt{3}", "1.732"),
]


def test_equivalence_main_thread():
    for pred, gold in EQUIVALENT:
        assert mb.math_equal(pred, gold), (pred, gold)
    for pred, gold in DIFFERENT:
        assert not mb.math_equal(pred, gold), (pred, gold)


def test_equivalence_outside_main_thread():
    """math-verify's signal.alarm fails off the main thread; our deadline must not."""
    results = {}

    def work():
        results["same"] = [mb.math_equal(p, g) for p, g in EQUIVALENT]
        results["diff"] = [mb.math_equal(p, g) for p, g in DIFFERENT]

    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert not t.is_alive()
    assert all(results["same"]) and not any(results["diff"])


def test_reward_runner_thread_isolation_uses_math_verify():
    ex = Example("e", "p", r"\frac{1}{2}")
    run = RewardRunner(RewardConfig(timeout_s=20, isolation="thread"))
    scores = run.score_batch(mb.boxed_correct, [r"\boxed{0.5}", r"\boxed{0.4}", "0.5"], [ex] * 3)
    np.testing.assert_array_equal(scores.total, [1, 0, 0])
    assert run.metrics()["reward/errors"] == 0


def test_hung_check_falls_back_to_string_equality(monkeypatch):
    def hang(gold, pred, signal_timeout):  # a pure-Python loop, as sympy's are; bounded at 3 s
        end = time.monotonic() + 3
        while time.monotonic() < end:
            pass
        return True

    monkeypatch.setattr(mb, "_math_verify", hang)
    out = {}

    def work():
        t0 = time.monotonic()
        out["diff"] = mb.math_equal("0.5", r"\frac{1}{2}", timeout_s=0.2)  # needs math-verify
        out["same"] = mb.math_equal(r"\dfrac{1}{2}", r"\frac{1}{2}", timeout_s=0.2)
        out["dt"] = time.monotonic() - t0

    t = threading.Thread(target=work)
    t.start()
    t.join(10)
    assert out["diff"] is False and out["same"] is True
    assert 0.2 <= out["dt"] < 1.0  # one deadline (the string-equal pair needs no check)


@pytest.mark.slow
def test_process_isolation_runs_math_verify_in_worker_main_thread():
    ex = Example("e", "p", r"\sqrt{8}")
    with RewardRunner(RewardConfig(timeout_s=30, isolation="process", workers=1)) as run:
        total = run.score_batch(mb.reward(format_weight=0.5),
                                [r"\boxed{2\sqrt{2}}", r"\boxed{3}", "none"], [ex] * 3).total
    np.testing.assert_array_equal(total, [1.5, 0.5, 0.0])


def test_messages_format_and_templates(tmp_path):
    import json
    path = tmp_path / "numina.jsonl"
    path.write_text(json.dumps({"messages": [
        {"role": "user", "content": "What is 1/2+1/2?"},
        {"role": "assistant", "content": r"Sum is $\boxed{1}$."}], "source": "amc"}) + "\n")
    (ex,) = mb.load(path, template="qwen")
    assert ex.answer == "1" and ex.meta == {"source": "amc"}
    assert ex.prompt[0]["role"] == "user" and r"\boxed{}" in ex.prompt[0]["content"]
    assert mb.boxed_correct(ex.solution, ex) == 1.0
    (ex,) = mb.load(path)
    assert ex.prompt == "Problem: What is 1/2+1/2?\nSolution:"


def test_math500_without_solutions_loads_and_scores(math500, tmp_path):
    """MATH-500 reduced to the evaluation-set shape (problem + answer) loads, row for row,
    with the same answers; a gold box of each answer scores 1."""
    import json

    rows = [json.loads(line) for line in open(DATA / "math500" / "test.jsonl")]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps({"problem": r["problem"], "answer": r["answer"]}) + "\n"
                            for r in rows))
    bare = mb.load(path)
    assert [e.answer for e in bare] == [e.answer for e in math500]
    assert all(e.solution == "" for e in bare)
    assert all(mb.boxed_correct("\\boxed{" + e.answer + "}", e) == 1.0 for e in bare[:50])
