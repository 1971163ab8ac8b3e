"""Workloads: the environment protocol, rewards, data loading, built-in tasks, GSM8K, boxed math.

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
