"""One host's single-turn rollout: tokenize → engine.generate → detokenize → score.

Everything here runs on one host's examples and its local engine; the coordination modes
only decide which examples a host gets and which devices its engine spans. Groups (the G
samples of one prompt) are always generated together, so they never cross hosts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from locojax.engine.engine import Engine, pad_prompts
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import Example, Task
from locojax.envs.prompt import encode_prompt
from locojax.envs.rewards import RewardRunner
from locojax.profiler import StepTimer
from locojax.tokenizer import Tokenizer, decode_all


@dataclasses.dataclass
class Rollouts:
    """A host's rollout rows as numpy, prompt-major: row r belongs to prompt r // G."""

    examples: list[Example]  # [B] prompts' examples
    prompt_tokens: np.ndarray  # [B, P] int32, left-padded
    prompt_mask: np.ndarray  # [B, P] bool
    tokens: np.ndarray  # [R, N] int32 completions (pad after stop)
    mask: np.ndarray  # [R, N] bool
    logprobs: np.ndarray  # [R, N] f32 behaviour logprobs
    texts: list[str]  # [R] decoded completions
    rewards: np.ndarray  # [R] f32
    reward_parts: dict[str, np.ndarray]  # part name -> [R]
    group_ids: np.ndarray  # [R] int32: the global index of the row's prompt
    env_mask: np.ndarray | None = None  # [R, N] bool: environment tokens (multi-turn only)
    env: Any = None  # multi_turn.EnvStats of the rows (multi-turn only)
    decode_steps: int = 0  # decode-loop iterations run to make these rows (all turns)

    @property
    def group_size(self) -> int:
        return len(self.rewards) // len(self.examples)

    def rows(self, x: np.ndarray) -> np.ndarray:
        """Repeat a per-prompt [B, ...] array to per-row [R, ...]."""
        return np.repeat(x, self.group_size, axis=0)


def encode_prompts(tokenizer: Tokenizer, examples: Sequence[Example], max_prompt_tokens: int):
    """Left-padded [B, P] ids and mask, P = max_prompt_tokens (a fixed shape: one compile).

    A prompt longer than max_prompt_tokens is an error naming the example: silently cutting
    it would train on a question the model never saw whole.
    """
    ids = [encode_prompt(tokenizer, ex) for ex in examples]
    for ex, x in zip(examples, ids):
        if len(x) > max_prompt_tokens:
            raise ValueError(f"prompt of example {ex.id} has {len(x)} tokens, more than "
                             f"max_prompt_tokens={max_prompt_tokens}")
    return pad_prompts(ids, tokenizer.pad_id, max_prompt_tokens)


def score(task: Task, runner: RewardRunner, texts: Sequence[str], examples: Sequence[Example]):
    scores = runner.score_batch(task.reward, texts, examples)
    return scores.total.astype(np.float32), {k: v.astype(np.float32) for k, v in scores.parts.items()}


def rollout(engine: Engine, weights, tokenizer: Tokenizer, task: Task, runner: RewardRunner,
            examples: Sequence[Example], first_group: int, key: jax.Array,
            sampling: SamplingConfig, group_size: int, max_prompt_tokens: int,
            timer: StepTimer, limits=None,
            generated: Callable[[Rollouts], None] | None = None) -> Rollouts:
    """Generate `group_size` completions for each example and score them.

    first_group: global index of examples[0], so group ids (and per-row sampling keys) are
    the same whichever host or layout generates a prompt. `timer` gets the admission,
    prefill, decode and detokenize_reward phases. `limits`: each row's most tokens
    (`Engine.prefill`); a run passes none, `benchmarks/measure_child.py` the lengths it
    measures a step at. `generated`, if given, is called with the rows before they are
    scored (no texts, rewards 0): device work that needs no reward is dispatched there, and
    runs while the host scores (`train/early.py`).
    """
    phase = timer.phase
    with phase("admission"):
        prompt_tokens, prompt_mask = encode_prompts(tokenizer, examples, max_prompt_tokens)
    with phase("prefill") as ph:
        pending = engine.prefill(weights, prompt_tokens, key, sampling, num_samples=group_size,
                                 prompt_mask=prompt_mask, first_row=first_group * group_size,
                                 limits=limits)
        ph.sync(pending.prefilled)
    with phase("decode") as ph:
        gen = engine.decode(pending)
        ph.sync(gen)
    with phase("detokenize_reward"):  # the rows' copy to the host is part of the phase
        rows = unscored(gen, examples, prompt_tokens, prompt_mask, first_group, group_size)
    if generated is not None:
        generated(rows)
    with phase("detokenize_reward"):
        return scored(rows, tokenizer, task, runner)


def unscored(gen, examples: Sequence[Example], prompt_tokens: np.ndarray,
             prompt_mask: np.ndarray, first_group: int, group_size: int) -> Rollouts:
    """The engine's output `gen` as host rows, not yet decoded or scored (rewards 0)."""
    tokens, mask, logprobs = (np.asarray(x) for x in (gen.tokens, gen.mask, gen.logprobs))
    group_ids = np.repeat(np.arange(first_group, first_group + len(examples)), group_size)
    return Rollouts(list(examples), prompt_tokens, prompt_mask, tokens, mask, logprobs, [],
                    np.zeros(len(tokens), np.float32), {}, group_ids.astype(np.int32),
                    decode_steps=int(gen.steps))


def scored(rows: Rollouts, tokenizer: Tokenizer, task: Task, runner: RewardRunner) -> Rollouts:
    """`rows` detokenized (one batch call, `decode_all`) and scored: the `detokenize_reward`
    phase."""
    texts = decode_all(tokenizer, [row[m].tolist() for row, m in zip(rows.tokens, rows.mask)])
    row_examples = [ex for ex in rows.examples for _ in range(rows.group_size)]
    rewards, parts = score(task, runner, texts, row_examples)
    return dataclasses.replace(rows, texts=texts, rewards=rewards, reward_parts=parts)
