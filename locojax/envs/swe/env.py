"""The SWE-style multi-turn environment: the model fixes a bug through view/replace/run_tests/submit.

Follows `locojax.envs.base.MultiTurnEnv`: `reset(example)` returns the prompt (issue, file
list, tool help); each `step(model_turn)` parses the first `<tool>...</tool>` call and returns
a `Step` whose observation is the tool output wrapped by `format_result` (head and tail kept).

Rules:
- `submit` ends the episode: the task's original test files are restored (edits to tests do
  not count), hidden files are added, and the reward is 1.0 iff every expected test passes
  (`runner.run_tests`), else 0.0.
- A turn with no tool call, an unknown tool, bad arguments or a path outside the repository
  costs a turn and yields an `error: ...` observation, never an exception.
- After `max_turns` turns without `submit` the episode ends with reward 0 (or is scored as if
  submitted, with `autosubmit`).
- Tests run in the sandbox (`locojax.envs.sandbox`, mode `SWEConfig.sandbox`), the code
  under test apart from the tests that judge it (`harness.py`); the file tools only rewrite
  strings.

References: SWE-agent's agent-computer interface (small tool set, truncated observations,
submit ends the episode, reward from the repository's tests); SWE-Gym for the RL framing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from locojax.envs.base import Example, Step, format_result, parse_tool_call
from locojax.envs.sandbox import MODES, Limits, Sandbox, default_sandbox
from locojax.envs.swe import tools
from locojax.envs.swe.runner import TestOutcome, run_tests
from locojax.envs.swe.tasks import SWETask

TOOLS = ("view", "replace", "run_tests", "submit")


@dataclasses.dataclass(frozen=True)
class SWEConfig:
    """Episode rules for `SWEEnv`."""

    max_turns: int = 16
    """Model turns per episode; reaching it ends the episode."""
    result_limit: int = 2000
    """Characters of tool output kept per observation (head and tail)."""
    autosubmit: bool = False
    """At `max_turns`, score the repository as if the model had submitted (else reward 0)."""
    limits: Limits = Limits(cpu_seconds=10, wall_seconds=30, memory_bytes=1 << 30,
                            file_size_bytes=16 << 20, max_processes=16)
    """Sandbox limits for each test run."""
    sandbox: str = "auto"
    """Sandbox mode of the test runs (`locojax.envs.sandbox.MODES`): "auto" is the strongest
    isolation here or an error, never none; "none" runs model code unisolated, by name only."""

    def __post_init__(self):
        if self.max_turns < 1 or self.result_limit < 100:
            raise ValueError(f"SWEConfig needs max_turns >= 1 and result_limit >= 100, got "
                             f"{self.max_turns}, {self.result_limit}")
        if self.sandbox not in MODES:
            raise ValueError(f"SWEConfig.sandbox must be one of {MODES}, got {self.sandbox!r}")


def score_submission(task: SWETask, files: dict[str, str], sandbox: Sandbox | None = None,
                     limits: Limits | None = None) -> TestOutcome:
    """Test an edited repository as `submit` does: the task's whole test tree restored
    (`SWETask.test_tree`: edits to tests, helpers and data files do not count, and files the
    model added under a test directory are dropped) and its hidden files added."""
    return run_tests(sandbox or default_sandbox(), restore_test_tree(task, files),
                     task.score_tests, task.runner, limits or SWEConfig().limits,
                     trusted=task.test_tree)


def restore_test_tree(task: SWETask, files: dict[str, str]) -> dict[str, str]:
    """`files` with `task.test_tree` as the task has it; files the model added under a test
    directory are dropped (a planted `conftest.py` or `cases2.json` is not the task's)."""
    dirs, every = task.test_dirs, {**task.files, **task.hidden}
    kept = {p: t for p, t in files.items() if not (dirs and p.startswith(dirs))}
    return {**kept, **{p: every[p] for p in task.test_tree}}


class SWEEnv:
    """One episode on one `SWETask` (carried in `example.meta["swe_task"]`, see `to_example`)."""

    def __init__(self, config: SWEConfig = SWEConfig(), sandbox: Sandbox | None = None):
        self.config = config
        self.sandbox = sandbox  # resolved on first test run: building envs stays cheap
        self.task: SWETask | None = None
        self.files: dict[str, str] = {}
        self.turns = 0
        self.done = False

    def reset(self, example: Example) -> str:
        task = example.meta.get("swe_task")
        if not isinstance(task, SWETask):
            raise TypeError(f"SWEEnv needs example.meta['swe_task'] (an SWETask); example "
                            f"{example.id!r} has meta keys {sorted(example.meta)}")
        self.task, self.files = task, dict(task.files)
        self.turns, self.done = 0, False
        if not isinstance(example.prompt, str):
            raise TypeError(f"SWEEnv needs a text prompt, example {example.id!r} has messages")
        return example.prompt

    def step(self, action: str) -> Step:
        if self.task is None:
            raise RuntimeError("SWEEnv.step called before reset")
        if self.done:
            raise RuntimeError("SWEEnv.step called after the episode ended")
        self.turns += 1
        info: dict[str, Any] = {"turn": self.turns}
        call = parse_tool_call(action)
        if call is None:
            out = f"error: no tool call found; call one of {', '.join(TOOLS)} as <tool>name " \
                  f"arguments</tool>"
            info["error"] = "no_tool_call"
        else:
            info["tool"] = call.name
            if call.name == "submit":
                return self._finish(info)
            try:
                out = self._tool(call.name, call.args, info)
            except tools.ToolError as e:
                out, info["error"] = f"error: {e}", "bad_call"
        if self.turns >= self.config.max_turns:
            info["truncated"] = True
            if self.config.autosubmit:
                return self._finish(info)
            self.done = True
            return Step("", 0.0, True, info)
        return Step(format_result(out, self.config.result_limit), 0.0, False, info)

    def _tool(self, name: str, args: str, info: dict) -> str:
        if name == "view":
            return tools.view(self.files, args)
        if name == "replace":
            path, text, msg = tools.replace(self.files, args)
            self.files[path] = text
            return msg
        if name == "run_tests":
            res = self._run(self.files, self.task.tests)
            info["tests_passed"] = res.passed
            verdict = "all tests passed" if res.passed else "tests FAILED"
            return f"{res.output.rstrip()}\n[{verdict}]"
        raise tools.ToolError(f"unknown tool {name!r}; tools: {', '.join(TOOLS)}")

    def _sandbox(self) -> Sandbox:
        if self.sandbox is None:
            self.sandbox = default_sandbox(self.config.sandbox)
        return self.sandbox

    def _run(self, files: dict[str, str], tests) -> TestOutcome:
        tree = tuple(p for p in self.task.test_tree if p in files)  # as scoring will judge
        return run_tests(self._sandbox(), files, tests, self.task.runner, self.config.limits,
                         trusted=tree)

    def _finish(self, info: dict) -> Step:
        self._sandbox()
        res = score_submission(self.task, self.files, self.sandbox, self.config.limits)
        self.done = True
        info.update(tests_passed=res.passed, submitted=not info.get("truncated"),
                    n_passed=res.n_passed,
                    n_failed=res.n_failed)
        if res.missing:
            info["missing_tests"] = list(res.missing)
        return Step("", 1.0 if res.passed else 0.0, True, info)
