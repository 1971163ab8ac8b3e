"""The environment protocol: examples, rewards, single- and multi-turn environments, tool calls.

Everything the trainer needs from a workload goes through the few names defined here:

- `Example`: one problem. `prompt` is plain text, or a tuple of chat messages
  (`{"role": ..., "content": ...}`) that the tokenizer renders with the model's chat template.
- `Reward`: a pure function `(completion, example) -> float`. `combine_rewards` makes a
  weighted sum that still exposes its parts, so `rewards.RewardRunner` can guard and log each
  part separately (`reward/<name>`).
- `SingleTurnEnv`: example -> prompt; completion -> (reward, info).
- `MultiTurnEnv`: `reset(example) -> observation`, then `step(action) -> Step(observation,
  reward, done, info)`. One env object holds one episode; the multi-turn rollout
  (`rollout/multi_turn.py`) builds one per trajectory from a factory.
- The tool-call format parsed from model text. It is deliberately tiny so that a
  character-level model can emit it after a short SFT:

      model:        <tool>calc 374*29</tool>
      environment:  <result>10846</result>

  The name is the first whitespace-delimited word inside `<tool>`; the arguments are the rest
  of the text, verbatim (they may span lines, e.g. an SWE `replace` with old and new text).
  A final answer is any model turn that contains no tool call; built-in tasks end it with the
  GSM8K-style line `#### N`.

References: the single-turn shape follows verifiers' `SingleTurnEnv` (prompt + reward
functions with weights); the multi-turn shape is the gym `reset`/`step` contract, with text
actions and observations as in SWE-agent's ACI.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

Message = Mapping[str, str]
"""A chat message: {"role": "system" | "user" | "assistant", "content": str}."""

Prompt = str | tuple[Message, ...]
"""Plain text, or chat messages that the tokenizer renders with the chat template."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem of a workload."""

    id: str
    """Stable identifier (file:line for loaded data, split/index for generated tasks)."""
    prompt: Prompt
    """What the model sees: text, or chat messages."""
    answer: str
    """The gold final answer, as text (e.g. "72", "\\frac{1}{2}")."""
    solution: str = ""
    """An ideal completion when one is known (gold GSM8K rationale, SFT demonstration)."""
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Anything else a reward or environment needs (difficulty, subject, operands, ...)."""


Reward = Callable[[str, Example], float]
"""A pure function of (completion, example). It must not mutate either argument. Its value
must be a finite number with |value| <= REWARD_LIMIT (`check_reward`)."""

REWARD_LIMIT = 1e6
"""The largest |reward| a run trains on, for a part and for a weighted total alike.

The trainer computes advantages in float32 (`rl/advantages.py`): rewards are summed per group
and their deviations squared, so a value must stay finite through that, not only through the
cast. (2 x 1e6)^2 = 4e12, summed over any realistic group, is far below float32's 3.4e38, and
at 1e6 float32 still resolves 1/16. A value within the range is finite after the cast to
float32, so the one test covers both. Real rewards are O(1); a value outside is a bug."""


class RewardValueError(ValueError):
    """A reward value the trainer cannot train on (see `check_reward`)."""


def check_reward(value: Any) -> float:
    """`value` as a float the trainer can train on, or `RewardValueError` saying why not: not a
    number (`float()` fails in any way, OverflowError for a huge int included), not finite, or
    outside +-REWARD_LIMIT (1e39 is finite in float64 but inf in float32; 1e300 squares to inf).

    The policy where rewards are scored (`rewards.RewardRunner`, `ToolEnv`): such a value
    scores 0 and counts as an error (`reward/errors`), like a reward that raised; it never
    reaches the advantages, and never stops the run."""
    try:
        f = float(value)
    except Exception as e:  # noqa: BLE001 - any `__float__` of any returned object
        raise RewardValueError(f"reward returned {_describe(value)}, not a number "
                               f"({type(e).__name__})") from None
    if not math.isfinite(f):
        raise RewardValueError(f"reward returned non-finite {f}")
    if abs(f) > REWARD_LIMIT:
        raise RewardValueError(f"reward returned {f:.6g}, outside +-{REWARD_LIMIT:g} "
                               "(locojax.envs.base.REWARD_LIMIT)")
    return f


def _describe(value: Any) -> str:
    """Type and a short repr of a value, never raising (a 5000-digit int has no repr)."""
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001
        text = f"<no repr: {type(e).__name__}>"
    return f"{type(value).__name__} {text[:80]}"


@dataclasses.dataclass(frozen=True)
class CombinedReward:
    """sum_i w_i * r_i(completion, example), keeping the parts so each can be guarded and logged."""

    parts: tuple[tuple[str, Reward, float], ...]
    """(name, reward function, weight) for each term."""

    def __call__(self, completion: str, example: Example) -> float:
        return float(sum(w * float(fn(completion, example)) for _, fn, w in self.parts))


def reward_name(fn: Reward) -> str:
    """The metric name of a reward function: its `name` attribute, else its `__name__`."""
    return getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__


def combine_rewards(terms: Sequence[tuple[Reward, float]]) -> CombinedReward:
    """Weighted sum of reward functions, e.g. `[(correct, 1.0), (format_ok, 0.1)]`.

    Nested combinations are flattened, their weights multiplied through. A weight must be a
    finite number. Each part's value and the weighted total are checked by `check_reward`
    where they are scored (`rewards.RewardRunner.score_batch`): a bad part scores 0, and a
    total outside the range makes the row's total 0; both count in `reward/errors`.
    """
    if not terms:
        raise ValueError("combine_rewards needs at least one (reward, weight) pair")
    parts: list[tuple[str, Reward, float]] = []
    for i, term in enumerate(terms):
        if not (isinstance(term, tuple) and len(term) == 2 and callable(term[0])):
            raise TypeError(f"combine_rewards term {i} must be (callable, weight), got {term!r}")
        fn, weight = term
        try:
            finite = math.isfinite(float(weight))
        except (TypeError, ValueError, OverflowError):
            finite = False
        if not finite:
            raise ValueError(f"combine_rewards term {i} ({reward_name(fn)}): the weight must be "
                             f"a finite number, got {_describe(weight)}")
        if isinstance(fn, CombinedReward):
            parts.extend((n, f, w * float(weight)) for n, f, w in fn.parts)
        else:
            parts.append((reward_name(fn), fn, float(weight)))
    names = [n for n, _, _ in parts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"combine_rewards: reward names must be unique, repeated: {dupes}")
    return CombinedReward(tuple(parts))


@runtime_checkable
class SingleTurnEnv(Protocol):
    """One prompt, one completion, one score."""

    def prompt(self, example: Example) -> Prompt:
        """What the model is asked."""
        ...

    def score(self, completion: str, example: Example) -> tuple[float, dict[str, float]]:
        """Unguarded: a raising reward raises here. The trainer scores through
        `rewards.RewardRunner`, which adds deadlines and error counting."""
        """(reward, info); info holds per-part rewards and other per-sample numbers."""
        ...


class Step(NamedTuple):
    """The result of one multi-turn step; unpacks as (observation, reward, done, info)."""

    observation: str
    """Environment text appended to the transcript (empty when done)."""
    reward: float
    """Reward earned by this step; an episode's return is the sum."""
    done: bool
    """True when the episode is over (answer given, submit, or error)."""
    info: dict[str, Any]
    """Per-step details (tool name, error, ...), for logging only."""


@runtime_checkable
class MultiTurnEnv(Protocol):
    """A stateful episode: `reset` once, then `step` until done."""

    def reset(self, example: Example) -> str:
        """Start an episode on `example`; returns the first observation (the prompt text)."""
        ...

    def step(self, action: str) -> Step:
        """Apply one model turn (text) and return what happens."""
        ...


# ---------------------------------------------------------------------------------------------
# The tool-call format.

TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ANSWER_PREFIX = "#### "

_TOOL_RE = re.compile(re.escape(TOOL_OPEN) + r"(.*?)" + re.escape(TOOL_CLOSE), re.DOTALL)
_CALL_RE = re.compile(r"\s*(\S*)(?:\s(.*))?", re.DOTALL)  # name, then args after one space


class ToolCall(NamedTuple):
    name: str
    """The tool name: the first word inside <tool>...</tool>."""
    args: str
    """Everything after the name and one separating whitespace character, verbatim."""


def parse_tool_call(text: str) -> ToolCall | None:
    """The first `<tool>name args</tool>` in `text`, or None if there is none.

    An empty `<tool></tool>` parses as a call with name "" so the env can answer with an error
    rather than treating it as a final answer.
    """
    m = _TOOL_RE.search(text)
    if m is None:
        return None
    name, args = _CALL_RE.fullmatch(m.group(1)).group(1, 2)
    return ToolCall(name, args or "")


def format_tool_call(name: str, args: str = "") -> str:
    """The text a model emits to call `name` (used by SFT demonstrations)."""
    return f"{TOOL_OPEN}{name} {args}{TOOL_CLOSE}" if args else f"{TOOL_OPEN}{name}{TOOL_CLOSE}"


def truncate_to_tool_call(text: str) -> str:
    """Cut a model turn just after its first `</tool>`: the env answers that call, and whatever
    the model wrote after it (e.g. a hallucinated result) is not part of the transcript."""
    i = text.find(TOOL_CLOSE)
    return text if i < 0 else text[: i + len(TOOL_CLOSE)]


def format_result(output: str, limit: int = 2000) -> str:
    """Wrap tool output as an observation, keeping head and tail when it exceeds `limit` chars."""
    if len(output) > limit:
        head = limit // 2
        tail = limit - head
        dropped = len(output) - limit
        output = f"{output[:head]}\n...[{dropped} chars truncated]...\n{output[-tail:]}"
    return f"{RESULT_OPEN}{output}{RESULT_CLOSE}\n"


Tool = Callable[[str], str]
"""A tool: argument text in, output text out. It should return error text rather than raise."""


class ToolEnv:
    """A multi-turn env where each model turn either calls a tool or gives the final answer.

    A tool call yields `<result>output</result>` as the next observation. A turn with no tool
    call ends the episode and is scored with `reward(final_turn, example)`. Reaching
    `max_tool_calls` ends the episode with reward 0. Subclasses or callers supply the tools.
    """

    def __init__(
        self,
        tools: Mapping[str, Tool],
        reward: Reward,
        max_tool_calls: int = 4,
        result_limit: int = 2000,
        score: Callable[[Reward, str, Example], float] | None = None,
    ):
        self.tools = dict(tools)
        self.reward = reward
        self.max_tool_calls = max_tool_calls
        self.result_limit = result_limit
        # `score` lets the trainer route the final reward through a RewardRunner (timeouts,
        # error counting); by default the reward is called directly.
        # `check_reward`: a value the trainer cannot train on raises, which the env pool
        # counts as an env error, the trajectory scoring 0.
        self._score = score or (lambda fn, completion, ex: check_reward(fn(completion, ex)))
        self.example: Example | None = None
        self.tool_calls = 0

    def reset(self, example: Example) -> str:
        if not isinstance(example.prompt, str):
            raise TypeError(f"ToolEnv needs a text prompt, example {example.id} has messages")
        self.example = example
        self.tool_calls = 0
        return example.prompt

    def step(self, action: str) -> Step:
        if self.example is None:
            raise RuntimeError("ToolEnv.step called before reset")
        call = parse_tool_call(action)
        if call is None:
            r = self._score(self.reward, action, self.example)
            return Step("", r, True, {"tool_calls": self.tool_calls})
        self.tool_calls += 1
        if self.tool_calls > self.max_tool_calls:
            return Step("", 0.0, True, {"tool_calls": self.tool_calls, "error": "too many calls"})
        tool = self.tools.get(call.name)
        if tool is None:
            out = f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(self.tools))}"
        else:
            out = tool(call.args)
        return Step(format_result(out, self.result_limit), 0.0, False,
                    {"tool": call.name, "tool_calls": self.tool_calls})


# ---------------------------------------------------------------------------------------------
# A workload as the trainer sees it.


class Segment(NamedTuple):
    """A piece of a transcript after the prompt."""

    text: str
    is_model: bool
    """True for model-generated text (trained on), False for environment text (masked)."""


@dataclasses.dataclass(frozen=True)
class Demo:
    """An SFT demonstration: a prompt and the ideal continuation, split by who writes what."""

    prompt: Prompt
    segments: tuple[Segment, ...]

    @property
    def completion(self) -> str:
        return "".join(s.text for s in self.segments)


@dataclasses.dataclass(frozen=True)
class Task:
    """A workload: data splits, a reward, and (for multi-turn tasks) an environment factory.

    A Task is itself a `SingleTurnEnv` (prompt/score). Multi-turn tasks set `make_env`; the
    multi-turn rollout (`rollout/multi_turn.py`) builds one env per trajectory from it.
    """

    name: str
    """Registry name, e.g. "arith"."""
    train: Sequence[Example]
    """Training split (procedural tasks: a lazily generated, indexable sequence)."""
    test: Sequence[Example]
    """Held-out split; never overlaps train."""
    reward: Reward
    """Scores a (whole) completion; for multi-turn tasks it scores the final model turn."""
    make_env: Callable[[], MultiTurnEnv] | None = None
    """Fresh environment per episode, or None for single-turn tasks."""
    max_turns: int = 1
    """Most model turns per episode (1 for single-turn)."""
    env_step_s: float = 0.0
    """The longest one env step may take by the task's own limits (the `swe` task: a test
    run's sandbox wall clock plus its setup). The env pool's deadline is kept above it
    (`pool.env_deadline_s`), so a slow but legal step is never an env timeout."""
    demo: Callable[[Example], Demo] | None = None
    """The ideal completion of an example, for SFT; None if the task has no gold completion."""
    format_check: Callable[[str, Example], bool] | None = None
    """Whether a completion answers in the task's format, right or wrong (evaluation reports
    the share, so a gain in accuracy can be told apart from a gain in format)."""

    @property
    def multi_turn(self) -> bool:
        return self.make_env is not None

    def prompt(self, example: Example) -> Prompt:
        return example.prompt

    def score(self, completion: str, example: Example) -> tuple[float, dict[str, float]]:
        """Unguarded: a raising reward raises here. The trainer scores through
        `rewards.RewardRunner`, which adds deadlines and error counting."""
        if isinstance(self.reward, CombinedReward):
            info = {f"reward/{n}": float(fn(completion, example)) for n, fn, _ in self.reward.parts}
            total = sum(w * info[f"reward/{n}"] for n, _, w in self.reward.parts)
            return float(total), info
        r = float(self.reward(completion, example))
        return r, {f"reward/{reward_name(self.reward)}": r}

    def demos(self, split: str = "train", n: int | None = None) -> list[Demo]:
        """The first `n` SFT demonstrations of a split (all of it if n is None)."""
        if self.demo is None:
            raise ValueError(f"task {self.name!r} has no demonstration generator")
        data = {"train": self.train, "test": self.test}.get(split)
        if data is None:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        n = len(data) if n is None else min(n, len(data))
        return [self.demo(data[i]) for i in range(n)]


def single_turn_demo(example: Example) -> Demo:
    """The demonstration of a single-turn example: its gold `solution`, all model text."""
    if not example.solution:
        raise ValueError(f"example {example.id} has no solution to demonstrate")
    return Demo(example.prompt, (Segment(example.solution, True),))
