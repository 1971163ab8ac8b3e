"""`swe` as a trainer `Task`: generated or user bug-fix tasks, the env factory, SFT demos and a
transcript reward.

    make_task("swe", level=2)                                   # generated, nothing to download
    make_task("swe", train_dir="my_tasks/train", test_dir="my_tasks/test")   # your own tasks

The episode reward comes from `SWEEnv` (1.0 iff the tests pass after `submit`). `Task.reward`
is `TranscriptReward`, the same verdict as a pure function of (model text, example): it
replays every `replace` call found in the text in order, and scores at the first `submit`.

The task runs model-written code, so building it resolves its sandbox (`sandbox="auto"`: the
strongest isolation here) and refuses to start, naming what is missing and how to get it,
when none works; unisolated runs need `sandbox="none"`, by name.

Demonstrations view the file to edit, apply the known fix and submit; their observations come
from the same tool functions the env uses, so no sandbox run is needed to build them.
"""

from __future__ import annotations

import dataclasses
import functools
import random

from locojax.envs.base import (
    TOOL_CLOSE, TOOL_OPEN, Demo, Example, Segment, Task, format_result, parse_tool_call,
)
from locojax.envs.sandbox import MODES, default_sandbox
from locojax.envs.swe import tools
from locojax.envs.swe.env import SWEConfig, SWEEnv, score_submission
from locojax.envs.swe.generate import KINDS, LEVELS, make_task
from locojax.envs.swe.tasks import TaskError, load_tasks, oracle_actions, to_example
from locojax.envs.tasks.procedural import ProceduralSplit


SANDBOX_SETUP_S = 15.0
"""Room for a test run's sandbox setup and teardown (a cgroup, the work dir's copy, the
interpreter's start, the wall-clock kill's grace) above its wall clock: a step that runs
tests lasts at most `limits.wall_seconds` plus this (`Task.env_step_s`)."""


def tool_calls(text: str) -> list[tuple[str, str]]:
    """Every `<tool>name args</tool>` in `text`, in order, as (name, args)."""
    out, pos = [], 0
    while (i := text.find(TOOL_OPEN, pos)) >= 0:
        j = text.find(TOOL_CLOSE, i)
        if j < 0:
            break
        call = parse_tool_call(text[i: j + len(TOOL_CLOSE)])
        out.append((call.name, call.args))
        pos = j + len(TOOL_CLOSE)
    return out


@dataclasses.dataclass(frozen=True)
class TranscriptReward:
    """1.0 iff replaying the `replace` calls of `completion` up to its first `submit` makes the
    task's tests pass (0.0 without a `submit`), run in a `sandbox`-mode sandbox. A picklable
    callable, so process-isolated reward workers can run it."""

    sandbox: str = "auto"
    """Sandbox mode (`locojax.envs.sandbox.MODES`)."""
    name = "transcript_reward"  # the metric name (`reward/transcript_reward/mean`)
    bounded = True  # waits on the sandbox (GIL released), whose wall limit ends every run

    def __call__(self, completion: str, example: Example) -> float:
        task = example.meta["swe_task"]
        files = dict(task.files)
        for name, args in tool_calls(completion):
            if name == "submit":
                out = score_submission(task, files, default_sandbox(self.sandbox))
                return 1.0 if out.passed else 0.0
            if name == "replace":
                try:
                    path, text, _ = tools.replace(files, args)
                except tools.ToolError:
                    continue
                files[path] = text
        return 0.0


transcript_reward = TranscriptReward()


def demo(example: Example) -> Demo:
    """View, fix, submit; observations computed by the env's own file tools."""
    task = example.meta["swe_task"]
    files = dict(task.files)
    *steps, submit = oracle_actions(task, run_tests=False)
    segments = []
    for action in steps:
        call = parse_tool_call(action)
        if call.name == "view":
            out = tools.view(files, call.args)
        else:
            path, files[path], out = tools.replace(files, call.args)
        segments += [Segment(action, True),
                     Segment(format_result(out, SWEConfig.result_limit), False)]
    return Demo(example.prompt, (*segments, Segment(submit, True)))


def task(level: int = 1, seed: int = 0, train_size: int = 10_000, test_size: int = 50,
         train_dir: str | None = None, test_dir: str | None = None, max_turns: int = 12,
         autosubmit: bool = False, sandbox: str = "auto") -> Task:
    """Generated tasks at `level` (1-3), or the user's task directories when `train_dir` is set
    (layout in `tasks.py`; `test_dir` optional, and it may not share a task with train).

    `sandbox` is the sandbox mode of every test run (`locojax.envs.sandbox.MODES`); it is
    resolved here, so a machine without isolation refuses the task before any work starts
    (`SandboxError`, naming what is missing and how to get it)."""
    if sandbox not in MODES:
        raise ValueError(f"swe sandbox must be one of {MODES}, got {sandbox!r}")
    default_sandbox(sandbox)  # refuse now, not at the first submit
    if train_dir is not None:
        train = [to_example(t) for t in load_tasks(train_dir)]
        test = [to_example(t) for t in load_tasks(test_dir)] if test_dir else []
        shared = ({_key(e) for e in train} & {_key(e) for e in test})
        if shared:
            raise TaskError(f"{train_dir} and {test_dir} share {len(shared)} task(s)")
    else:
        if level not in LEVELS:
            raise ValueError(f"swe level must be one of {LEVELS}, got {level!r}")

        def draw(rng: random.Random) -> tuple[str, Example]:
            t = make_task(rng, level, KINDS)
            return t.meta["key"], to_example(t)

        train = ProceduralSplit(draw, "train", seed, train_size)
        test = ProceduralSplit(draw, "test", seed, test_size)
    config = SWEConfig(max_turns=max_turns, autosubmit=autosubmit, sandbox=sandbox)
    return Task(name="swe", train=train, test=test, reward=TranscriptReward(sandbox),
                make_env=functools.partial(SWEEnv, config), max_turns=max_turns, demo=demo,
                env_step_s=config.limits.wall_seconds + SANDBOX_SETUP_S)


def _key(example: Example) -> str:
    t = example.meta["swe_task"]
    return repr(sorted(t.files.items()))
