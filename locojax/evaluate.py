"""Held-out evaluation: greedy pass@1 accuracy and mean reward on a task's test split.

Accuracy counts a completion as correct when its total reward reaches 1, which for the
built-in tasks, GSM8K and boxed math is exactly "the final answer is right" (format terms,
when enabled, only add on top of a correct answer's 1).

Multi-turn tasks are evaluated as they are trained (greedy, tools and all), and also report
how often the model called a tool and how it did without one: `eval/tool_call_rate`,
`eval/correct_no_tool` (a share of all examples, so it sums over hosts) and, derived once
the hosts' shares are summed (`derived`), `eval/accuracy_no_tool`.
"""

from __future__ import annotations

import jax
import numpy as np

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import Task
from locojax.envs.rewards import RewardRunner
from locojax.profiler import StepTimer
from locojax.rollout import multi_turn
from locojax.rollout.single_turn import rollout


def greedy_sampling(tokenizer, max_new_tokens: int) -> SamplingConfig:
    """The decoding rules of an evaluation (also what the memory plan compiles)."""
    return SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0,
                          stop_token_ids=tuple(tokenizer.stop_ids), pad_token_id=tokenizer.pad_id)


def batch_rows(num_examples: int, batch_size: int) -> int:
    """Prompts per generate call of `evaluate`: one call for few examples, else full batches."""
    return batch_size if num_examples > batch_size else num_examples


def evaluate(engine: Engine, weights, tokenizer, task: Task, runner: RewardRunner,
             examples, max_new_tokens: int, max_prompt_tokens: int,
             batch_size: int = 256, pool=None, limits=None) -> dict[str, float]:
    """`eval/accuracy` and `eval/reward_mean` over `examples`, greedy, one sample each.
    Multi-turn tasks need the env `pool` and resolved `limits` (`rollout.limits`)."""
    sampling = greedy_sampling(tokenizer, max_new_tokens)
    rewards, used_tool = [], []
    timer = StepTimer()
    for start in range(0, len(examples), batch_size):
        chunk = list(examples[start:start + batch_size])
        # Pad the last chunk to a full batch so every chunk reuses one compiled shape.
        padded = chunk + [chunk[-1]] * (batch_rows(len(examples), batch_size) - len(chunk))
        if task.multi_turn:
            out = multi_turn.rollout(engine, weights, tokenizer, task, pool, padded, 0,
                                     jax.random.key(0), sampling, 1, limits, timer)
            used_tool.extend(out.tool_calls[:len(chunk)].tolist())
        else:
            out = rollout(engine, weights, tokenizer, task, runner, padded, 0, jax.random.key(0),
                          sampling, 1, max_prompt_tokens, timer)
        rewards.extend(out.rewards[:len(chunk)].tolist())
    rewards = np.asarray(rewards)
    correct = rewards >= 1.0 - 1e-6
    out = {"eval/accuracy": float(np.mean(correct)), "eval/reward_mean": float(np.mean(rewards))}
    if task.multi_turn:
        used = np.asarray(used_tool) > 0
        out.update({"eval/tool_call_rate": float(np.mean(used)),
                    "eval/correct_no_tool": float(np.mean(correct & ~used))})
    return out


def derived(shares: dict[str, float]) -> dict[str, float]:
    """Ratios of summed shares: accuracy among the answers given without a tool call (absent
    when every answer called a tool)."""
    if "eval/tool_call_rate" not in shares or shares["eval/tool_call_rate"] >= 1.0:
        return {}
    return {"eval/accuracy_no_tool": shares["eval/correct_no_tool"]
            / (1.0 - shares["eval/tool_call_rate"])}


def greedy_eval(weights, model_cfg, tokenizer, task: Task, num_examples: int,
                max_new_tokens: int = 48, max_prompt_tokens: int = 32) -> dict[str, float]:
    """Convenience for scripts: `evaluate` on a fresh single-device engine, reward runner and
    (multi-turn) env pool with the default `MultiTurnConfig` limits."""
    from locojax.envs.pool import EnvPool
    from locojax.rollout.limits import MultiTurnConfig, resolve

    examples = [task.test[i] for i in range(min(num_examples, len(task.test)))]
    limits = resolve(MultiTurnConfig(), task.max_turns, max_new_tokens, max_prompt_tokens,
                     model_cfg.max_position_embeddings) if task.multi_turn else None
    with RewardRunner() as runner, EnvPool() as pool:
        out = evaluate(Engine(model_cfg), weights, tokenizer, task, runner, examples,
                       max_new_tokens, max_prompt_tokens, pool=pool, limits=limits)
    return {**out, **derived(out)}


def greedy_accuracy(weights, model_cfg, tokenizer, task: Task, num_examples: int,
                    max_new_tokens: int = 48, max_prompt_tokens: int = 32) -> float:
    """`greedy_eval`'s held-out accuracy."""
    return greedy_eval(weights, model_cfg, tokenizer, task, num_examples, max_new_tokens,
                       max_prompt_tokens)["eval/accuracy"]
