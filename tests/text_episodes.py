"""A text-level multi-turn driver for tests: batches of episodes, one policy call per turn.

`locojax train` does not use it: its rollouts are token-level and continue each row in the
KV cache (`locojax.rollout.multi_turn`). This driver is for any policy that maps text to
text (scripted policies in tests, an external inference server), where re-encoding the
transcript every turn is the policy's business.

    transcript = prompt, then alternating model turns and environment observations:
      "374*29=" | "<tool>calc 374*29</tool>" | "<result>10846</result>\\n" | "#### 10846"
                   model (trained on)          environment (masked)         model

Each turn, every still-running episode's transcript so far is sent to the policy in one
batched call, `policy(list[str]) -> list[str]`, so the engine decodes all episodes of a batch
together. The engine adapter passes "</tool>" as a stop string; the driver also cuts each turn
after its first `</tool>` so a model that keeps writing (e.g. hallucinates a `<result>`) cannot
put text in the environment's mouth.

The result keeps who wrote what: `Episode.segments` mark model text and environment text,
and `Episode.tokenize(encode)` turns them into token ids plus a loss mask (1 = model-generated,
0 = environment-provided). Segments are encoded one by one, so an observation's tokens never
merge with the model's across a boundary. A policy may return `Generation`s instead of strings
to hand over the exact token ids it sampled (and their logprobs); these are used as-is unless
the driver had to cut the turn, in which case the text is re-encoded.

An episode ends when its env says done, when it raises (reward 0, `env/errors`), when it
has had `max_turns` model turns (`env/truncated`), or when its transcript exceeds
`max_chars` (`env/truncated`).

Reference: the loss-masking of tool output follows verl's multi-turn rollout and
SWE-agent/rLLM practice (observations are context, never targets).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from locojax.envs.base import Example, MultiTurnEnv, Segment, truncate_to_tool_call

log = logging.getLogger(__name__)


class Generation(NamedTuple):
    """A policy output with the exact tokens behind it."""

    text: str
    token_ids: Sequence[int] | None = None
    logprobs: Sequence[float] | None = None


Policy = Callable[[list[str]], Sequence[str | Generation]]
"""Transcripts so far -> the next model turn for each."""


@dataclasses.dataclass
class Episode:
    """One finished multi-turn episode."""

    example: Example
    prompt: str
    """The first observation (the env's rendering of the example's prompt)."""
    segments: list[Segment] = dataclasses.field(default_factory=list)
    """Everything after the prompt, in order."""
    reward: float = 0.0
    """Sum of step rewards."""
    turns: int = 0
    """Model turns taken."""
    done: bool = False
    """True if the env ended the episode; False if it was cut off (max turns / chars / error)."""
    error: str = ""
    """The exception text if the env raised."""
    infos: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The info dict of each step."""
    generations: list[Generation | None] = dataclasses.field(default_factory=list)
    """Per segment: the policy's token ids/logprobs for model segments where usable, else None."""

    @property
    def completion(self) -> str:
        return "".join(s.text for s in self.segments)

    @property
    def transcript(self) -> str:
        return self.prompt + self.completion

    def tokenize(self, encode: Callable[[str], list[int]]) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
        """(prompt ids [P], completion ids [C], loss mask [C]); mask is 1 on model tokens."""
        ids: list[int] = []
        mask: list[int] = []
        for seg, gen in zip(self.segments, self.generations):
            toks = list(gen.token_ids) if gen is not None and gen.token_ids is not None \
                else encode(seg.text)
            ids.extend(toks)
            mask.extend([int(seg.is_model)] * len(toks))
        return (np.asarray(encode(self.prompt), np.int32), np.asarray(ids, np.int32),
                np.asarray(mask, np.int32))


def run_episodes(policy: Policy, make_env: Callable[[], MultiTurnEnv],
                 examples: Sequence[Example], max_turns: int,
                 max_chars: int | None = None) -> list[Episode]:
    """Run one episode per example (repeat an example G times for a GRPO group)."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    envs = [make_env() for _ in examples]
    episodes = []
    for env, ex in zip(envs, examples):
        episodes.append(Episode(ex, env.reset(ex)))
    active = list(range(len(examples)))
    texts = [ep.prompt for ep in episodes]
    while active:
        outputs = policy([texts[i] for i in active])
        if len(outputs) != len(active):
            raise ValueError(f"policy returned {len(outputs)} completions for "
                             f"{len(active)} prompts")
        still = []
        for i, out in zip(active, outputs):
            ep = episodes[i]
            gen = out if isinstance(out, Generation) else Generation(str(out))
            action = truncate_to_tool_call(gen.text)
            ep.segments.append(Segment(action, True))
            ep.generations.append(gen if action == gen.text and gen.token_ids is not None
                                  else None)
            ep.turns += 1
            try:
                obs, reward, done, info = envs[i].step(action)
            except Exception as e:  # noqa: BLE001 - a broken env ends its episode, not the run
                log.warning("env step raised on %s: %s: %s", ep.example.id, type(e).__name__, e)
                ep.error, ep.reward = f"{type(e).__name__}: {e}", 0.0
                continue
            ep.reward += float(reward)
            ep.infos.append(dict(info))
            if done:
                ep.done = True
                continue
            if obs:
                ep.segments.append(Segment(obs, False))
                ep.generations.append(None)
            texts[i] += action + obs
            if ep.turns >= max_turns or (max_chars is not None and len(texts[i]) > max_chars):
                continue  # cut off: done stays False
            still.append(i)
        active = still
    return episodes


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """`env/*` summary numbers of a batch of episodes."""
    n = max(len(episodes), 1)
    tool_calls = [sum(1 for info in ep.infos if "tool" in info) for ep in episodes]
    return {
        "env/reward/mean": sum(ep.reward for ep in episodes) / n,
        "env/turns/mean": sum(ep.turns for ep in episodes) / n,
        "env/tool_calls/mean": sum(tool_calls) / n,
        "env/errors": float(sum(bool(ep.error) for ep in episodes)),
        "env/truncated": float(sum(not ep.done and not ep.error for ep in episodes)),
    }
