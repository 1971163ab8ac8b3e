"""Workloads: the environment protocol, rewards, data loading, built-in tasks, GSM8K, boxed math.

    base.py            the protocol: examples, rewards, single- and multi-turn envs, tools
    registry.py        from a config to a Task
    tasks/             the built-in procedural tasks (arith, calc)
    swe/               the SWE-style workload: fix a bug through tools, tests in the sandbox
    gsm8k.py           GSM8K: loader, templates, `#### N` rewards
    math_boxed.py      boxed-answer math with a math-verify reward
    user.py            your own task, data and reward
    data.py            jsonl / parquet / `datasets` rows into Examples
    data_lengths.py    prompt lengths, every prompt encoded once
    prompt.py          an example's prompt as token ids (the one encoding)
    rewards.py         safe reward execution: deadlines, no reward kills the run
    reward_worker.py   a reward worker process and its messages
    pool.py            a host's environment worker pool
    sandbox/           untrusted code (patches, tests, code rewards) in a contained child
    pyast.py           `ast.parse` that many threads may call at once

Start at `base.py` (the protocol), then `registry.make_task`:

    task = make_task("arith", level=3)        # or "calc", "gsm8k", "math", "swe"
    with RewardRunner(RewardConfig(timeout_s=5)) as runner:
        scores = runner.score_batch(task.reward, completions, examples)
"""

from locojax.envs.base import (
    CombinedReward,
    Demo,
    Example,
    MultiTurnEnv,
    Segment,
    SingleTurnEnv,
    Step,
    Task,
    ToolCall,
    ToolEnv,
    combine_rewards,
    format_result,
    format_tool_call,
    parse_tool_call,
)
from locojax.envs.registry import make_task, task_names
from locojax.envs.rewards import RewardConfig, RewardRunner

__all__ = [
    "CombinedReward", "Demo", "Example", "MultiTurnEnv", "RewardConfig", "RewardRunner",
    "Segment", "SingleTurnEnv", "Step", "Task", "ToolCall", "ToolEnv", "combine_rewards",
    "format_result", "format_tool_call", "make_task", "parse_tool_call", "task_names",
]
