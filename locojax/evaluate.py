"""Held-out evaluation: greedy pass@1 accuracy and mean reward on a task's test split.

Accuracy counts a completion as correct when its total reward reaches 1, which for the
built-in tasks, GSM8K and boxed math is exactly "the final answer is right" (format terms,
when enabled, only add on top of a correct answer's 1).
"""

from __future__ import annotations

import jax
import numpy as np

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import Task
from locojax.envs.rewards import RewardRunner
from locojax.profiler import StepTimer
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
             batch_size: int = 256) -> dict[str, float]:
    """`eval/accuracy` and `eval/reward_mean` over `examples`, greedy, one sample each."""
    sampling = greedy_sampling(tokenizer, max_new_tokens)
    rewards = []
    timer = StepTimer()
    for start in range(0, len(examples), batch_size):
        chunk = list(examples[start:start + batch_size])
        # Pad the last chunk to a full batch so every chunk reuses one compiled shape.
        padded = chunk + [chunk[-1]] * (batch_rows(len(examples), batch_size) - len(chunk))
        out = rollout(engine, weights, tokenizer, task, runner, padded, 0, jax.random.key(0),
                      sampling, 1, max_prompt_tokens, timer)
        rewards.extend(out.rewards[:len(chunk)].tolist())
    rewards = np.asarray(rewards)
    return {"eval/accuracy": float(np.mean(rewards >= 1.0 - 1e-6)),
            "eval/reward_mean": float(np.mean(rewards))}


def greedy_accuracy(weights, model_cfg, tokenizer, task: Task, num_examples: int,
                    max_new_tokens: int = 48, max_prompt_tokens: int = 32) -> float:
    """Convenience for scripts: a fresh single-device engine and runner."""
    examples = [task.test[i] for i in range(min(num_examples, len(task.test)))]
    with RewardRunner() as runner:
        return evaluate(Engine(model_cfg), weights, tokenizer, task, runner, examples,
                        max_new_tokens, max_prompt_tokens)["eval/accuracy"]
