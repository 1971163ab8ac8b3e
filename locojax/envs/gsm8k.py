"""GSM8K: loader, prompt templates, and numeric answer rewards (strict `#### N` / flexible).

Rows are in the HF `openai/gsm8k` format: `question`, and `answer` = a rationale with
`<<48/2=24>>` calculator annotations, ending in the line `#### 72`. The annotations are
stripped from the gold solution (a model is never shown them at inference time, so training
on them would teach it to emit text it cannot check).

Rewards follow the lm-eval-harness `gsm8k` task: "strict-match" reads the number after the
last `####`; "flexible-extract" reads the last number anywhere. Both normalise `$`, thousands
commas, a trailing `.`, a unicode minus, and trailing decimal zeros (`18.00` == `18`), and
compare numerically. The arith and calc built-in tasks use the same rewards.

References: Cobbe et al. 2021 (GSM8K); lm-evaluation-harness `tasks/gsm8k/gsm8k.yaml`.
"""

from __future__ import annotations

import os
import re
from decimal import Decimal, InvalidOperation
from typing import Literal

from locojax.envs.base import (
    ANSWER_PREFIX, Example, Prompt, Reward, Task, combine_rewards, single_turn_demo,
)
from locojax.envs.data import Dataset, RowError, load_examples
from locojax.envs.rewards import bounded

_CALC_RE = re.compile(r"<<[^<>]*>>")
# A number as written in a solution: optional sign and $, digits with optional thousands
# commas, optional decimals; or a bare decimal like .5
_NUM = r"[-−]?\$?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_NUM_RE = re.compile(_NUM)
_STRICT_RE = re.compile(r"####\s*(" + _NUM + ")")

QWEN_INSTRUCTION = 'Please reason step by step, and put your final answer after "####".'


def strip_calculator(text: str) -> str:
    """Remove `<<expr=value>>` calculator annotations."""
    return _CALC_RE.sub("", text)


def normalize_number(text: str) -> str | None:
    """Canonical string of a number as written ('$1,234.50.' -> '1234.5'), or None."""
    s = text.strip().replace("−", "-").replace("$", "").replace(",", "").replace(" ", "")
    s = s.rstrip(".")
    if not s or s in "-+":
        return None
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def extract_strict(completion: str) -> str | None:
    """The normalised number after the last `####`, or None."""
    matches = _STRICT_RE.findall(completion)
    return normalize_number(matches[-1]) if matches else None


def extract_flexible(completion: str) -> str | None:
    """The normalised last number in the text, or None."""
    for m in reversed(_NUM_RE.findall(completion)):
        n = normalize_number(m)
        if n is not None:
            return n
    return None


@bounded  # linear regexes over the completion: safe in a thread
def correct_strict(completion: str, example: Example) -> float:
    """1 if the number after the last `####` equals the gold answer."""
    return float(extract_strict(completion) == normalize_number(example.answer))


@bounded
def correct_flexible(completion: str, example: Example) -> float:
    """1 if the last number in the completion equals the gold answer."""
    return float(extract_flexible(completion) == normalize_number(example.answer))


@bounded
def format_ok(completion: str, example: Example) -> float:
    """1 if the last non-empty line is `#### <number>` and nothing follows it."""
    lines = [ln for ln in completion.strip().splitlines() if ln.strip()]
    if not lines:
        return 0.0
    last = lines[-1].strip()
    return float(last.startswith("####") and normalize_number(last[4:]) is not None)


def ends_with_number(completion: str, example: Example) -> bool:
    """The flexible format: the reply ends with its final number (trailing punctuation
    aside), so the number the flexible reward reads is the one the reply concludes with."""
    tail = completion.rstrip().rstrip(".!")
    last = _NUM_RE.findall(tail)
    return bool(last) and tail.endswith(last[-1])


def reward(mode: Literal["strict", "flexible"] = "strict", format_weight: float = 0.0) -> Reward:
    """Correctness in the given mode, plus `format_weight` * format_ok if positive."""
    fns = {"strict": correct_strict, "flexible": correct_flexible}
    if mode not in fns:
        raise ValueError(f"mode must be 'strict' or 'flexible', got {mode!r}")
    if format_weight <= 0:
        return fns[mode]
    return combine_rewards([(fns[mode], 1.0), (format_ok, format_weight)])


def make_prompt(question: str, template: Literal["plain", "qwen", "chat"] = "plain") -> Prompt:
    """'plain': 'Question: ...\\nAnswer:' text. 'qwen' and 'chat': one user message, rendered by
    the hand-written ChatML of `tokenizer.base` (qwen) or the checkpoint's own chat template
    (chat, `tokenizer.chat_template`)."""
    if template == "plain":
        return f"Question: {question.strip()}\nAnswer:"
    if template in ("qwen", "chat"):
        return ({"role": "user", "content": f"{question.strip()}\n{QWEN_INSTRUCTION}"},)
    raise ValueError(f"template must be 'plain', 'qwen' or 'chat', got {template!r}")


def split_gold(answer: str) -> tuple[str, str]:
    """(solution without calculator annotations, normalised final number); RowError if none."""
    if "####" not in answer:
        raise RowError("field 'answer' has no '#### N' final line")
    final = answer.rsplit("####", 1)[1]
    number = normalize_number(final)
    if number is None:
        raise RowError(f"field 'answer' ends in '####{final[:40]}', not a number")
    solution = strip_calculator(answer.rsplit("####", 1)[0]).rstrip() + f"\n{ANSWER_PREFIX}{number}"
    return solution.lstrip("\n"), number


def load(path: str | os.PathLike, template: Literal["plain", "qwen", "chat"] = "plain",
         skip_invalid: bool = False, limit: int | None = None) -> Dataset:
    """GSM8K rows from a .jsonl or .parquet file."""
    make_prompt("", template)  # validate the template name before reading the file

    def convert(row, ex_id: str) -> Example:
        solution, number = split_gold(row["answer"])
        # With the plain template, the completion continues after "Answer:", hence the space.
        sol = " " + solution if template == "plain" else solution
        return Example(ex_id, make_prompt(row["question"], template), number, sol)

    return load_examples(path, convert, {"question": str, "answer": str},
                         skip_invalid=skip_invalid, limit=limit)


def task(train_path: str, test_path: str, template: Literal["plain", "qwen", "chat"] = "plain",
         mode: Literal["strict", "flexible"] = "strict", format_weight: float = 0.0,
         skip_invalid: bool = False) -> Task:
    """The GSM8K task over the user's train and test files."""
    return Task(
        name="gsm8k",
        train=load(train_path, template, skip_invalid).examples,
        test=load(test_path, template, skip_invalid),  # a Dataset: knows what it skipped
        reward=reward(mode, format_weight),
        demo=single_turn_demo,
        format_check=format_ok if mode == "strict" else ends_with_number,
    )
