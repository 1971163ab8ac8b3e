"""`arith`: multi-digit addition/subtraction for a tiny character-level model.

    prompt:      "374+481-123="
    completion:  "374+481=855\n855-123=732\n#### 732"     (two operands: just "#### 855")

The completion is a chain of running results, one line per operation, then the GSM8K-style
final line, so the same strict `#### N` reward as GSM8K scores it. Intermediate results are
kept non-negative, so no line needs a sign. Sizes stay within what a char-level model with a
64-token context handles: prompts <= 12 chars; completions <= 9 chars with two operands, <= 29
at level 4 and <= 36 at level 5.

For an instruct model, `template="chat"` asks in words instead ("What is 9 + 18? Give only
the final number.", `chat_prompt`), usually with the flexible reward (the reply's last
number): level 0 is where SmolLM2-135M-Instruct is partly right (docs/real_model.md).

Difficulty levels (`at_level(n)`); a short SFT on a tiny model leaves level 3 mediocre but
learnable, which is where GRPO has room to help:

| level | operands | digits | ops |
|---|---|---|---|
| 0 | 2 | 0-20 | +- |
| 1 | 2 | 1-2 | + |
| 2 | 2 | 2 | +- |
| 3 | 2 | 3 | +- |
| 4 | 3 | 2 | +- |
| 5 | 3 | 3 | +- |
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Literal

from locojax.envs.base import (
    ANSWER_PREFIX, Demo, Example, Prompt, Segment, Task, single_turn_demo,
)
from locojax.envs.gsm8k import ends_with_number, format_ok
from locojax.envs.gsm8k import reward as gsm8k_reward
from locojax.envs.tasks.procedural import TEST_PERMILLE, ProceduralSplit


@dataclasses.dataclass(frozen=True)
class ArithConfig:
    """Shape of the generated problems."""

    operands: int = 2
    """Numbers per problem (2 or more)."""
    min_digits: int = 3
    """Fewest digits of an operand."""
    max_digits: int = 3
    """Most digits of an operand; each operand's digit count is uniform in [min, max]."""
    ops: str = "+-"
    """Operators to draw from: any of '+', '-', and '*' with two operands (left-to-right
    evaluation and the usual precedence agree only there)."""
    max_value: int = 0
    """If > 0: operands are uniform in [0, max_value] instead of by digit count."""
    test_permille: int = TEST_PERMILLE
    """Share of the problem space held out, in thousandths: a small space (level 0 has 672
    problems) needs a larger share to hold 200 distinct held-out ones."""

    def __post_init__(self):
        if self.operands < 2:
            raise ValueError(f"operands must be >= 2, got {self.operands}")
        if not 1 <= self.min_digits <= self.max_digits <= 9:
            raise ValueError(f"need 1 <= min_digits <= max_digits <= 9, got "
                             f"{self.min_digits}, {self.max_digits}")
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"ops must be a non-empty subset of '+-*', got {self.ops!r}")
        if "*" in self.ops and self.operands != 2:
            raise ValueError(f"'*' needs exactly 2 operands, got {self.operands}")


LEVELS = {
    0: ArithConfig(operands=2, min_digits=1, max_digits=2, ops="+-", max_value=20,
                   test_permille=350),
    1: ArithConfig(operands=2, min_digits=1, max_digits=2, ops="+"),
    2: ArithConfig(operands=2, min_digits=2, max_digits=2),
    3: ArithConfig(operands=2, min_digits=3, max_digits=3),
    4: ArithConfig(operands=3, min_digits=2, max_digits=2),
    5: ArithConfig(operands=3, min_digits=3, max_digits=3),
}


def at_level(n: int) -> ArithConfig:
    if n not in LEVELS:
        raise ValueError(f"arith level must be one of {sorted(LEVELS)}, got {n}")
    return LEVELS[n]


def _number(rng: random.Random, cfg: ArithConfig) -> int:
    if cfg.max_value > 0:
        return rng.randint(0, cfg.max_value)
    d = rng.randint(cfg.min_digits, cfg.max_digits)
    return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)


def solve(nums: list[int], ops: list[str]) -> tuple[list[str], int]:
    """(chain lines 'a+b=c', final value) of a left-to-right evaluation."""
    value, lines = nums[0], []
    for op, n in zip(ops, nums[1:]):
        new = value + n if op == "+" else value - n if op == "-" else value * n
        lines.append(f"{value}{op}{n}={new}")
        value = new
    return lines, value


LOOSE_ANSWER = "The answer is "


def loose_format_demo(example: Example) -> Demo:
    """The gold demonstration with its last line written `The answer is N`, not `#### N`.

    Right arithmetic in a format the strict reward does not accept: SFT data that mixes
    these with `#### N` demonstrations leaves a model that can answer but often does not
    say it the verifiable way: a format for GRPO to enforce, as in the first steps of many
    real GRPO runs.
    """
    head, _, answer = example.solution.rpartition(ANSWER_PREFIX)
    return Demo(example.prompt, (Segment(f"{head}{LOOSE_ANSWER}{answer}", True),))


def sample(rng: random.Random, cfg: ArithConfig) -> tuple[str, Example]:
    """One problem with non-negative running results: (key, example)."""
    while True:
        nums = [_number(rng, cfg) for _ in range(cfg.operands)]
        ops = [rng.choice(cfg.ops) for _ in range(cfg.operands - 1)]
        lines, value = solve(nums, ops)
        if all(not ln.split("=")[1].startswith("-") for ln in lines):
            break
    expr = str(nums[0]) + "".join(f"{o}{n}" for o, n in zip(ops, nums[1:]))
    chain = "".join(ln + "\n" for ln in lines) if len(lines) > 1 else ""
    solution = f"{chain}{ANSWER_PREFIX}{value}"
    return expr, Example("", expr + "=", str(value), solution, {"operands": cfg.operands})


CHAT_INSTRUCTION = "Give only the final number."
"""What a chat prompt asks for: the reply is scored by its last number (flexible) and
counted as in format when it ends with that number (`ends_with_number`)."""


def chat_prompt(expr: str) -> Prompt:
    """One user message for an instruct model: 'What is 37 + 5? Give only the final number.'"""
    spaced = "".join(f" {c} " if c in "+-*" else c for c in expr)
    return ({"role": "user", "content": f"What is {spaced}? {CHAT_INSTRUCTION}"},)


def widest_expressions(cfg: ArithConfig) -> list[str]:
    """The longest expressions `sample` can draw: one per sequence of operators, every
    operand at its most digits. A prompt's length in tokens depends only on its operators
    and its operands' digit counts for the char tokenizer (one token per character) and for
    tokenizers that split digits one by one or in fixed groups (SmolLM2, Qwen, Llama 3), in
    either template, so these prompts are the longest of the task: `auto` sizes the width
    from them rather than from 100,000 drawn rows (`data_lengths.fit`, which also checks
    them against a probe of drawn rows; tests/test_data_lengths.py checks every level-0
    prompt with SmolLM2's chat template)."""
    widest = cfg.max_value if cfg.max_value > 0 else 10**cfg.max_digits - 1
    return [str(widest) + "".join(f"{o}{widest}" for o in ops)
            for ops in itertools.product(cfg.ops, repeat=cfg.operands - 1)]


def task(level: int | None = 3, config: ArithConfig | None = None, seed: int = 0,
         train_size: int = 100_000, test_size: int = 200, format_weight: float = 0.0,
         mode: Literal["strict", "flexible"] = "strict",
         template: Literal["plain", "chat"] = "plain") -> Task:
    """The arith task at a preset `level`, or with an explicit `config` (which wins).

    template: plain ('374+481=', for the char-level checkpoints) or chat (one user message
    in the checkpoint's own chat template, `chat_prompt`, for instruct models, with
    `ends_with_number` as its format check). mode: the reward, strict (`#### N`) or
    flexible (the last number)."""
    cfg = config or at_level(level if level is not None else 3)
    if template not in ("plain", "chat"):
        raise ValueError(f"arith template must be 'plain' or 'chat', got {template!r}")

    def prompt(expr: str) -> Prompt:
        return chat_prompt(expr) if template == "chat" else expr + "="

    def draw(rng: random.Random) -> tuple[str, Example]:
        key, ex = sample(rng, cfg)
        return key, dataclasses.replace(ex, prompt=prompt(key))

    widest = [Example(f"widest/{i}", prompt(e), "") for i, e in
              enumerate(widest_expressions(cfg))]
    return Task(
        name="arith",
        train=ProceduralSplit(draw, "train", seed, train_size, cfg.test_permille, widest),
        test=ProceduralSplit(draw, "test", seed, test_size, cfg.test_permille, widest),
        reward=gsm8k_reward(mode, format_weight),
        demo=single_turn_demo,
        format_check=ends_with_number if template == "chat" else format_ok,
    )
