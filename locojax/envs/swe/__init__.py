"""SWE-style workload: fix a bug in a small Python repository through tools, tests in a sandbox.

Start at `env.py` (the episode rules), `workload.py` (the registry's `task`), then `tasks.py`
(task record, user-task loader), `generate.py` (seeded bug-fix tasks), `tools.py`
(view/replace), `runner.py` (test verdicts) and `harness.py` + `remote.py` (the tests and the
code under test in separate processes, the verdict on a channel the code cannot write), with
`treeview.py` (the tests' files, listings and stats answered from the task, never the disk).
"""

from locojax.envs.swe.env import SWEConfig, SWEEnv, score_submission
from locojax.envs.swe.generate import generate_examples, generate_tasks, make_task
from locojax.envs.swe.runner import TestOutcome, run_tests
from locojax.envs.swe.tasks import (
    Edit,
    SWETask,
    TaskError,
    load_task,
    load_tasks,
    oracle_actions,
    render_prompt,
    to_example,
    validate_task,
)
from locojax.envs.swe.workload import TranscriptReward, demo, task, transcript_reward

__all__ = [
    "Edit", "SWEConfig", "SWEEnv", "SWETask", "TaskError", "TestOutcome", "generate_examples",
    "generate_tasks", "load_task", "load_tasks", "make_task", "oracle_actions", "render_prompt",
    "run_tests", "score_submission", "task", "demo", "to_example", "TranscriptReward",
    "transcript_reward", "validate_task",
]
