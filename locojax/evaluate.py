"""Evaluation: k samples of each example, scored by the task's own reward, and what they add
up to. One scorer serves the held-out evaluation inside training (`evaluate`: greedy, one
sample each) and `locojax eval` (any k, temperature and task; `commands/eval.py`).

Accuracy counts a completion as correct when its total reward reaches 1, which for the
built-in tasks, GSM8K and boxed math is exactly "the final answer is right" (format terms,
when enabled, only add on top of a correct answer's 1).

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", eq. 1): with n samples of a problem of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), the chance that k of the n drawn without replacement hold
a correct one, averaged over problems. pass@1 is then c/n, the accuracy.

Multi-turn tasks are evaluated as they are trained (tools and all), and also report how
often the model called a tool and how it did without one: `eval/tool_call_rate`,
`eval/correct_no_tool` (a share of all examples, so it sums over hosts) and, derived once
the hosts' shares are summed (`derived`), `eval/accuracy_no_tool`.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import Task
from locojax.envs.rewards import RewardRunner
from locojax.profiler import StepTimer
from locojax.rollout import multi_turn
from locojax.rollout.single_turn import rollout

CORRECT = 1.0 - 1e-6
"""A total reward at least this is a correct answer (rewards are sums of f32 terms)."""


def greedy_sampling(tokenizer, max_new_tokens: int) -> SamplingConfig:
    """The decoding rules of an evaluation (also what the memory plan compiles)."""
    return SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0,
                          stop_token_ids=tuple(tokenizer.stop_ids), pad_token_id=tokenizer.pad_id)


def batch_rows(num_examples: int, batch_size: int) -> int:
    """Prompts per generate call of `evaluate`: one call for few examples, else full batches."""
    return min(num_examples, batch_size)


@dataclasses.dataclass(frozen=True)
class Scores:
    """k samples of each of n examples, example-major ([n, k] arrays)."""

    rewards: np.ndarray  # [n, k] f32 total reward
    lengths: np.ndarray  # [n, k] int: tokens the model wrote (stop token included)
    truncated: np.ndarray  # [n, k] bool: stopped by a length limit, not by the model
    texts: list[list[str]]  # [n][k] the completions (multi-turn: the whole trajectory)
    tool_calls: np.ndarray | None = None  # [n, k] int, multi-turn tasks only

    @property
    def correct(self) -> np.ndarray:
        return self.rewards >= CORRECT


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): the chance that k of n samples, c of them correct, drawn
    without replacement, hold a correct one (unbiased for k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def score(engine: Engine, weights, tokenizer, task: Task, runner: RewardRunner, examples,
          sampling: SamplingConfig, samples: int, max_prompt_tokens: int, batch_size: int,
          key: jax.Array, first_index: int = 0, pool=None, limits=None) -> Scores:
    """`samples` completions of each example on `engine`, scored by `task.reward` through
    `runner` (multi-turn tasks: by their envs, on `pool`, within `limits`).

    Batches of `batch_size` examples, the last padded to a full batch (one compiled shape).
    Sample r of example i is keyed by its global row (first_index + i) * samples + r, so
    what it draws depends neither on the batch size nor on which host scores it."""
    rewards, lengths, truncated, texts, tools = [], [], [], [], []
    stop_ids = np.asarray(sampling.stop_token_ids, np.int64)
    rows = batch_rows(len(examples), batch_size)
    for start in range(0, len(examples), batch_size):
        chunk = list(examples[start:start + batch_size])
        padded = chunk + [chunk[-1]] * (rows - len(chunk))
        first, keep = first_index + start, len(chunk) * samples
        if task.multi_turn:
            out = multi_turn.rollout(engine, weights, tokenizer, task, pool, padded, first, key,
                                     sampling, samples, limits, StepTimer())
            cut = np.asarray([s == "truncated" for s in out.status])
            tools.append(out.tool_calls[:keep])
        else:
            out = rollout(engine, weights, tokenizer, task, runner, padded, first, key,
                          sampling, samples, max_prompt_tokens, StepTimer())
            n = out.mask.sum(axis=1)
            last = out.tokens[np.arange(len(n)), np.maximum(n - 1, 0)]
            cut = ~((n > 0) & np.isin(last, stop_ids))  # no stop token: the budget ended it
        rewards.append(out.rewards[:keep])
        lengths.append(out.mask.sum(axis=1)[:keep])
        truncated.append(cut[:keep])
        texts.extend(out.texts[:keep])

    def rows_of(parts, dtype):
        return np.concatenate(parts).astype(dtype).reshape(len(examples), samples)

    return Scores(rows_of(rewards, np.float32), rows_of(lengths, np.int64),
                  rows_of(truncated, bool),
                  [texts[i * samples:(i + 1) * samples] for i in range(len(examples))],
                  rows_of(tools, np.int64) if task.multi_turn else None)


def evaluate(engine: Engine, weights, tokenizer, task: Task, runner: RewardRunner,
             examples, max_new_tokens: int, max_prompt_tokens: int,
             batch_size: int = 256, pool=None, limits=None) -> dict[str, float]:
    """`eval/accuracy` and `eval/reward_mean` over `examples`, greedy, one sample each.
    Multi-turn tasks need the env `pool` and resolved `limits` (`rollout.limits`)."""
    s = score(engine, weights, tokenizer, task, runner, examples,
              greedy_sampling(tokenizer, max_new_tokens), 1, max_prompt_tokens, batch_size,
              jax.random.key(0), pool=pool, limits=limits)
    correct = s.correct[:, 0]
    out = {"eval/accuracy": float(np.mean(correct)), "eval/reward_mean": float(np.mean(s.rewards))}
    if task.multi_turn:
        used = s.tool_calls[:, 0] > 0
        out.update({"eval/tool_call_rate": float(np.mean(used)),
                    "eval/correct_no_tool": float(np.mean(correct & ~used))})
    if task.format_check is not None:
        ok = in_format(task, s, examples)[:, 0]
        out.update({"eval/format_rate": float(np.mean(ok)),
                    "eval/correct_in_format": float(np.mean(correct & ok))})
    return out


def in_format(task: Task, s: Scores, examples) -> np.ndarray:
    """[E, k] whether each completion stopped by itself and passes the task's format check:
    a gain in accuracy with this share flat is the task, not the format."""
    ok = [[bool(task.format_check(t, ex)) for t in row] for row, ex in zip(s.texts, examples)]
    return np.asarray(ok, bool).reshape(s.truncated.shape) & ~s.truncated


def derived(shares: dict[str, float]) -> dict[str, float]:
    """Ratios of summed shares: accuracy among the answers given without a tool call (absent
    when every answer called a tool), and among the answers in the task's format."""
    out = {}
    if shares.get("eval/tool_call_rate", 1.0) < 1.0:
        out["eval/accuracy_no_tool"] = (shares["eval/correct_no_tool"]
                                        / (1.0 - shares["eval/tool_call_rate"]))
    if shares.get("eval/format_rate", 0.0) > 0.0:
        out["eval/accuracy_in_format"] = (shares["eval/correct_in_format"]
                                          / shares["eval/format_rate"])
    return out


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

