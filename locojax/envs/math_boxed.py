r"""Boxed-answer math (MATH, NuminaMath-CoT): loader, prompts, and a math-verify reward.

Rows are either `problem` + `solution` (+ optional `answer`), as in MATH / MATH-500 and
NuminaMath-CoT, or `messages` (a user turn with the problem, an assistant turn with the
solution). Without an `answer` field the gold answer is the last `\boxed{...}` of the solution;
without a solution (`problem` + `answer`, or a user turn + `answer`, the shape of many
evaluation sets) the example has no demonstration (`solution == ""`). An answer stored as a
JSON number is read as the text the file wrote (`27.0` stays "27.0"; see `data.NumberText`).

The reward takes the LAST `\boxed{...}` of the completion (braces may nest) and checks it
against the gold answer:
1. normalised string equality (cheap, and the only check for answers sympy cannot parse,
   such as `\text{Monday}`);
2. otherwise math-verify (`parse` + `verify`), which decides fractions vs decimals, radicals,
   intervals, tuples, sets, degrees and equations symbolically.
Step 2 runs under a deadline that works in any thread: in the main thread, when no other
real-time timer is pending, math-verify's own `signal.alarm` timeouts are used (they can
interrupt sympy); otherwise, and in any other thread, where signals are unavailable, the
check runs in a helper thread and is abandoned at the deadline.
A check that raises or times out counts as "not equivalent by math-verify", so the result
falls back to step 1. `boxed_correct` is not `@bounded`, so `RewardRunner`'s default
isolation runs it in a worker process (a hang that holds the GIL is killed at the deadline),
whose main thread gives math-verify its signal timeouts.

References: Hendrycks et al. 2021 (MATH, `\boxed{}` convention, `last_boxed_only_string`);
HF math-verify 0.9; Qwen2.5-Math prompt ("put your final answer within \boxed{}").
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
from typing import Literal

from locojax.envs.base import Example, Prompt, Reward, Task, combine_rewards, single_turn_demo
from locojax.envs.data import Dataset, RowError, load_examples
from locojax.envs.rewards import Deadline, bounded, call_with_timeout

QWEN_INSTRUCTION = r"Please reason step by step, and put your final answer within \boxed{}."
VERIFY_TIMEOUT_S = 5.0


def last_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` (or `\fbox{...}`, or `\boxed 5`), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if text.startswith(" ", i):  # `\boxed 5`: the argument runs to the next `$` or space
        m = re.match(r" +([^\s$]+)", text[i:])
        return m.group(1) if m else None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{" and text[j - 1] != "\\":
            depth += 1
        elif text[j] == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None  # unbalanced: the model never closed its box


_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def normalize_answer(s: str) -> str:
    """Canonical string of a LaTeX answer for exact comparison (conservative on purpose)."""
    s = s.strip()
    s = _TEXT_RE.sub(r"\1", s)
    for a, b in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""),
                 ("\\ ", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("^\\circ", ""),
                 ("^{\\circ}", ""), ("\\%", ""), ("%", ""), ("\\$", ""), ("$", "")):
        s = s.replace(a, b)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d+\.0+", s):  # 18.00 -> 18
        s = s.split(".")[0]
    return s.lower() if re.fullmatch(r"[A-Za-z ]+", s) else s


def _math_verify(gold: str, pred: str, signal_timeout: int | None) -> bool:
    import math_verify
    from math_verify import grader, parser

    # We enforce the deadline ourselves when signal timeouts are off; silence the warning
    # math-verify logs about that.
    grader.TIMEOUT_WARNING_SHOWN = parser.TIMEOUT_WARNING_SHOWN = True
    g = math_verify.parse(f"${gold}$", parsing_timeout=signal_timeout)
    p = math_verify.parse(f"${pred}$", parsing_timeout=signal_timeout)
    if not g or not p:
        return False
    return bool(math_verify.verify(g, p, timeout_seconds=signal_timeout))


def math_equal(pred: str, gold: str, timeout_s: float = VERIFY_TIMEOUT_S) -> bool:
    """Whether `pred` and `gold` are the same answer (see module docstring for the rules)."""
    if normalize_answer(pred) == normalize_answer(gold):
        return True
    try:
        # signal.alarm would cancel any pending real-time timer (pytest-timeout's, a user's),
        # so math-verify's own timeouts are used only when none is set.
        if (threading.current_thread() is threading.main_thread()
                and signal.getitimer(signal.ITIMER_REAL)[0] == 0):
            return _math_verify(gold, pred, max(1, math.ceil(timeout_s)))
        return bool(call_with_timeout(_math_verify, (gold, pred, None), timeout_s))
    except (Deadline, Exception):  # noqa: BLE001 - sympy raises anything; that means "no"
        return False


def boxed_correct(completion: str, example: Example) -> float:
    r"""1 if the completion's last `\boxed{}` is equivalent to the gold answer."""
    pred = last_boxed(completion)
    return 0.0 if pred is None else float(math_equal(pred, example.answer))


@bounded  # a scan for the last box; boxed_correct (sympy) runs in a worker process
def boxed_format(completion: str, example: Example) -> float:
    r"""1 if the completion contains a complete `\boxed{...}`."""
    return float(last_boxed(completion) is not None)


def reward(format_weight: float = 0.0) -> Reward:
    if format_weight <= 0:
        return boxed_correct
    return combine_rewards([(boxed_correct, 1.0), (boxed_format, format_weight)])


def make_prompt(problem: str, template: Literal["plain", "qwen", "chat"] = "plain") -> Prompt:
    """'plain': 'Problem: ...\\nSolution:' text. 'qwen' and 'chat': one user message, rendered by
    the hand-written ChatML of `tokenizer.base` (qwen) or the checkpoint's own chat template
    (chat, `tokenizer.chat_template`)."""
    if template == "plain":
        return f"Problem: {problem.strip()}\nSolution:"
    if template in ("qwen", "chat"):
        return ({"role": "user", "content": f"{problem.strip()}\n{QWEN_INSTRUCTION}"},)
    raise ValueError(f"template must be 'plain', 'qwen' or 'chat', got {template!r}")


def _from_messages(messages: list) -> tuple[str, str | None]:
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    bots = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    if not users:
        raise RowError("field 'messages' needs a user message")
    problem = users[0].get("content")
    solution = bots[-1].get("content") if bots else None
    if not isinstance(problem, str) or not (solution is None or isinstance(solution, str)):
        raise RowError("message 'content' must be a string")
    return problem, solution


def _text_field(row, name: str) -> str:
    if not isinstance(row.get(name), str) or not row[name].strip():
        what = "missing" if row.get(name) is None else "empty or not a string"
        raise RowError(f"field {name!r} is {what}")
    return row[name]


def load(path: str | os.PathLike, template: Literal["plain", "qwen", "chat"] = "plain",
         skip_invalid: bool = False, limit: int | None = None) -> Dataset:
    """Boxed-math rows (problem/solution[/answer], problem/answer, or messages[/answer])
    from .jsonl or .parquet."""
    make_prompt("", template)

    def convert(row, ex_id: str) -> Example:
        if row.get("problem") is not None or row.get("solution") is not None:
            problem = _text_field(row, "problem")
            solution = None if row.get("solution") is None else _text_field(row, "solution")
        elif row.get("messages") is not None:
            problem, solution = _from_messages(row["messages"])
        else:
            raise RowError(f"needs 'problem' and 'solution' or 'answer', or 'messages' "
                           f"(have: {sorted(row)})")
        answer = row.get("answer")
        if answer is None:
            if solution is None:
                raise RowError("no 'solution' (nor an assistant message) and no 'answer': "
                               "nothing to check an answer against")
            answer = last_boxed(solution)
            if answer is None:
                raise RowError("no 'answer' field and no \\boxed{} in the solution")
        if not str(answer).strip():
            raise RowError("field 'answer' is empty")
        meta = {k: row[k] for k in ("subject", "level", "unique_id", "source") if k in row}
        if solution is None:
            sol = ""  # no demonstration known: rewards and evaluation need only the answer
        else:
            sol = " " + solution.strip() if template == "plain" else solution.strip()
        return Example(ex_id, make_prompt(problem, template), str(answer).strip(), sol, meta)

    return load_examples(path, convert, {}, {"problem": str, "solution": str, "messages": list,
                                             "answer": (str, int, float)},
                         skip_invalid=skip_invalid, limit=limit)


def task(train_path: str, test_path: str, template: Literal["plain", "qwen", "chat"] = "plain",
         format_weight: float = 0.0, skip_invalid: bool = False) -> Task:
    """The boxed-math task over the user's train and test files."""
    return Task(
        name="math",
        train=load(train_path, template, skip_invalid).examples,
        test=load(test_path, template, skip_invalid),  # a Dataset: knows what it skipped
        reward=reward(format_weight),
        demo=single_turn_demo,
    )
