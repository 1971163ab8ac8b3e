"""`calc`: a multi-turn tool task. The model may call a calculator, then answers `#### N`.

    prompt:       "374*29="
    model:        "<tool>calc 374*29</tool>"
    environment:  "<result>10846</result>\\n"
    model:        "#### 10846"

Multiplying 3-digit by 2-digit numbers in its head is beyond a tiny char-level model, but
copying the expression into a tool call and copying the result back is easy, so after a short
SFT on these demonstrations the tool is what makes the task solvable. Answering directly,
without the tool, is allowed and scored the same.

The calculator is a whitelist evaluator over Python's `ast` (integers, decimals, + - * / and
parentheses, bounded size); it never calls `eval` and returns error text instead of raising.
It parses through `pyast.parse`, so env pool threads may call it at once.

| level | problem |
|---|---|
| 1 | 2-digit * 2-digit |
| 2 | 3-digit * 2-digit (default) |
| 3 | 3-digit * 3-digit |
| 4 | 2-digit * 2-digit + 3-digit |
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable
from decimal import Decimal

from locojax.envs.base import (
    ANSWER_PREFIX, Demo, Example, Reward, Segment, Task, ToolEnv, format_result,
    format_tool_call,
)
from locojax.envs.gsm8k import correct_strict
from locojax.envs.pyast import parse
from locojax.envs.tasks.procedural import ProceduralSplit

LEVELS = {1: ((2, 2),), 2: ((3, 2),), 3: ((3, 3),), 4: ((2, 2), 3)}
"""level -> factor digit counts, then the digits of an added term (if any)."""

MAX_EXPR_CHARS = 100
MAX_MAGNITUDE = 10**15

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}


def _eval(node: ast.AST) -> Decimal:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Decimal(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and b == 0:
            raise ZeroDivisionError("division by zero")
        v = _OPS[type(node.op)](a, b)
        if abs(v) > MAX_MAGNITUDE:
            raise OverflowError("result too large")
        return v
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def calculator(args: str) -> str:
    """Evaluate an arithmetic expression; 'error: ...' text on bad input."""
    expr = args.strip()
    if not expr:
        return "error: empty expression"
    if len(expr) > MAX_EXPR_CHARS:
        return f"error: expression longer than {MAX_EXPR_CHARS} chars"
    try:
        value = _eval(parse(expr, mode="eval"))
    except SyntaxError:
        return "error: cannot parse expression"
    except (ValueError, ZeroDivisionError, OverflowError, ArithmeticError) as e:
        return f"error: {e}"
    if value == value.to_integral_value():
        return str(int(value))
    return format(round(value, 6).normalize(), "f")


def sample(rng: random.Random, level: int) -> tuple[str, Example]:
    spec = LEVELS[level]
    a_digits, b_digits = spec[0]
    a = rng.randint(10 ** (a_digits - 1), 10**a_digits - 1)
    b = rng.randint(max(2, 10 ** (b_digits - 1)), 10**b_digits - 1)
    expr = f"{a}*{b}"
    if len(spec) > 1:
        c = rng.randint(10 ** (spec[1] - 1), 10 ** spec[1] - 1)
        expr += f"+{c}"
    return expr, Example("", expr + "=", calculator(expr), "", {"expr": expr})


def demo(example: Example) -> Demo:
    """Call the calculator on the whole expression, then copy its result."""
    expr = example.meta["expr"]
    return Demo(example.prompt, (
        Segment(format_tool_call("calc", expr), True),
        Segment(format_result(calculator(expr)), False),
        Segment(f"{ANSWER_PREFIX}{example.answer}", True),
    ))


def direct_demo(example: Example) -> Demo:
    """Answer at once, without the tool (the tiny-calc checkpoint learned from a mix of these
    and `demo`: a char-level model cannot multiply 3-digit by 2-digit numbers in its head,
    so it guesses, and GRPO has a tool call to discover)."""
    return Demo(example.prompt, (Segment(f"{ANSWER_PREFIX}{example.answer}", True),))


def make_env(score: Callable[[Reward, str, Example], float] | None = None) -> ToolEnv:
    """One episode: the calculator tool, at most two calls, final turn scored `#### N`.

    Pass `score=runner.score` (a `RewardRunner`) to guard the final reward with a deadline.
    """
    return ToolEnv({"calc": calculator}, correct_strict, max_tool_calls=2, score=score)


def task(level: int = 2, seed: int = 0, train_size: int = 100_000,
         test_size: int = 200) -> Task:
    if level not in LEVELS:
        raise ValueError(f"calc level must be one of {sorted(LEVELS)}, got {level}")

    def draw(rng: random.Random) -> tuple[str, Example]:
        return sample(rng, level)

    return Task(
        name="calc",
        train=ProceduralSplit(draw, "train", seed, train_size),
        test=ProceduralSplit(draw, "test", seed, test_size),
        reward=correct_strict,
        make_env=make_env,
        max_turns=3,
        demo=demo,
    )
