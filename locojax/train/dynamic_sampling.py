"""DAPO's rollout-side parts: dynamic sampling, overlong filtering, soft overlong punishment.

Dynamic sampling (Yu et al. 2025, DAPO §3.2): a group whose G rewards are all equal has zero
advantage everywhere, so it adds nothing to the gradient while still counting in every
normaliser. DAPO keeps sampling until the batch holds only groups with signal. Here each
global prompt slot owns a chain of candidates: round 0 is the slot's admitted prompt, round
r ≥ 1 a fresh prompt drawn for (step, slot, r) (`Curator.refill_index`). A slot whose group
has zero variance after round r - 1 takes its round-r candidate, for at most `max_rounds`
rounds; a slot still without signal after that keeps its last group (zero advantage, counted
as `rollout/refill/unfilled`). So:
- the global batch keeps exactly B groups, and the global slot → group map is a pure
  function of (seed, step, slot, round, curation table): the same on every layout;
- a host refills only its own slots, so groups never cross hosts and no host waits on
  another during rollout.
Departure: DAPO over-samples a larger generation batch and keeps the first groups with
signal; a per-slot chain does the same job and keeps the result independent of the layout.
A refill round regenerates the host's whole share at the shape of round 0 (one compiled
shape, and every row at the same position on every layout), using the rows of the slots
that need it; the others' rows are discarded. On a small model, a round costs one rollout
(`perf/phase/decode` etc. include it); the refilled group count is logged.

Overlong filtering (DAPO §3.4): a response cut off at `max_new_tokens` without a stop token
is masked out of the loss (its reward still enters its group's baseline).
Soft overlong punishment (DAPO eq. 13), with L_max = max_new_tokens and L_cache the buffer:
    R_length(y) = 0                                   if |y| ≤ L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| ≤ L_max
(times `overlong_penalty`), added to the task reward before advantages (and before the
zero-variance test, since that is what the advantage sees). |y| > L_max cannot happen here:
generation stops at L_max.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from locojax.rollout.single_turn import Rollouts
from locojax.sums import Sums


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
    """DAPO's rollout-side options: dynamic sampling and overlong shaping (all off by default)."""

    max_rounds: int = 0
    """Refill rounds per step: a group whose rewards are all equal (no learning signal) is
    replaced by a fresh prompt's group, at most this many times (DAPO dynamic sampling).
    0 = off."""
    overlong_filter: bool = False
    """Mask responses cut off at max_new_tokens (no stop token) out of the loss (DAPO)."""
    overlong_buffer: int = 0
    """L_cache: soft overlong punishment over the last L_cache tokens of max_new_tokens:
    a response longer than max_new_tokens - L_cache loses up to `overlong_penalty`,
    linearly, all of it at max_new_tokens (DAPO). 0 = off."""
    overlong_penalty: float = 1.0
    """The punishment at max_new_tokens (DAPO: 1, the reward scale)."""

    def __post_init__(self):
        if self.max_rounds < 0 or self.overlong_buffer < 0 or self.overlong_penalty < 0:
            raise ValueError(f"max_rounds, overlong_buffer and overlong_penalty must be >= 0: "
                             f"{self}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RefillStats(Sums):
    """What a step's refill rounds did, as sums over groups (adds with +)."""

    zero_std_round0: float = 0.0  # groups without signal after round 0
    replaced: float = 0.0  # groups a refill round replaced
    generated_groups: float = 0.0  # groups the refill rounds generated (their cost)

    def metrics(self, groups: float) -> dict[str, float]:
        """Zero-variance groups after round 0 vs after the last round (`rollout/frac_zero_std`)
        is what dynamic sampling bought; `generated_groups` is what it cost."""
        return {"rollout/refill/frac_zero_std_round0": self.zero_std_round0 / groups,
                "rollout/refill/replaced": self.replaced,
                "rollout/refill/generated_groups": self.generated_groups}


def zero_variance(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """[R] rewards (prompt-major) → [R / G] bool: the group's rewards are all exactly equal."""
    grouped = np.asarray(rewards).reshape(-1, group_size)
    return grouped.max(axis=1) == grouped.min(axis=1)


def truncated(tokens: np.ndarray, mask: np.ndarray, stop_ids: Sequence[int]) -> np.ndarray:
    """[R] bool: the response holds no stop token, i.e. it was cut off at max_new_tokens."""
    stopped = np.isin(tokens, np.asarray(list(stop_ids), tokens.dtype)) & mask
    return ~stopped.any(axis=1)


def overlong_penalty(lengths: np.ndarray, max_new_tokens: int, buffer: int,
                     penalty: float = 1.0) -> np.ndarray:
    """[R] f32 R_length (≤ 0) of DAPO eq. 13 for response lengths [R]; zeros if buffer is 0."""
    lengths = np.asarray(lengths, np.float64)
    if buffer <= 0:
        return np.zeros(lengths.shape, np.float32)
    over = np.clip(lengths - (max_new_tokens - buffer), 0.0, buffer) / buffer
    return (-penalty * over).astype(np.float32)


def shape_rewards(out: Rollouts, cfg: DynamicSamplingConfig, max_new_tokens: int) -> Rollouts:
    """The rollouts with the soft overlong punishment added to their rewards (as the reward
    part `overlong`); unchanged when it is off."""
    if cfg.overlong_buffer <= 0:
        return out
    pen = overlong_penalty(out.mask.sum(axis=1), max_new_tokens, cfg.overlong_buffer,
                           cfg.overlong_penalty)
    return dataclasses.replace(out, rewards=(out.rewards + pen).astype(np.float32),
                               reward_parts={**out.reward_parts, "overlong": pen})


def select_groups(rounds: Sequence[Rollouts], choice: np.ndarray) -> Rollouts:
    """Group j of the result is group j of `rounds[choice[j]]` (all rounds have the same
    prompts-per-host and G): the batch dynamic sampling keeps."""
    choice = np.asarray(choice)
    first = rounds[0]
    g, b = first.group_size, len(first.examples)
    if choice.shape != (b,):
        raise ValueError(f"choice has shape {choice.shape}, expected ({b},)")
    if all(c == 0 for c in choice):
        return first
    row_choice = np.repeat(choice, g)

    def pick(name: str, per_row: bool):
        sel = row_choice if per_row else choice
        out = np.array(getattr(first, name), copy=True)
        for r, ro in enumerate(rounds[1:], start=1):
            out[sel == r] = getattr(ro, name)[sel == r]
        return out

    parts = {}
    for k in first.reward_parts:
        parts[k] = np.array(first.reward_parts[k], copy=True)
        for r, ro in enumerate(rounds[1:], start=1):
            parts[k][row_choice == r] = ro.reward_parts[k][row_choice == r]
    return Rollouts(
        examples=[rounds[c].examples[j] for j, c in enumerate(choice)],
        prompt_tokens=pick("prompt_tokens", False), prompt_mask=pick("prompt_mask", False),
        tokens=pick("tokens", True), mask=pick("mask", True), logprobs=pick("logprobs", True),
        texts=[rounds[c].texts[i] for i, c in enumerate(row_choice)],
        rewards=pick("rewards", True), reward_parts=parts, group_ids=first.group_ids)
