"""Workloads: the environment protocol, rewards, data loading, built-in tasks, GSM8K, boxed math.

Start at `base.py` (the protocol), then `registry.make_task`.
"""

from locojax.envs.base import (
    CombinedReward,
    Example,
    MultiTurnEnv,
    SingleTurnEnv,
    Step,
    ToolCall,
    ToolEnv,
    combine_rewards,
    format_result,
    format_tool_call,
    parse_tool_call,
)

__all__ = [
    "CombinedReward", "Example", "MultiTurnEnv", "SingleTurnEnv", "Step", "ToolCall", "ToolEnv",
    "combine_rewards", "format_result", "format_tool_call", "parse_tool_call",
]
