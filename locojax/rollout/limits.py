"""Limits of multi-turn trajectories, and the check that they fit the engine's cache.

`MultiTurnConfig` is part of the run config (`--multi-turn.*`). `check_limits` runs once
the model and task are known, before the first step: a trajectory that could outgrow the
KV cache or the model's positions is refused then, with the numbers that do not fit,
instead of failing (or silently cutting) mid-run.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class MultiTurnConfig:
    """Multi-turn rollouts (tasks with an environment: calc, swe)."""

    max_turns: int = 0
    """T: most model turns per trajectory (0: the task's own limit)."""
    max_obs_tokens: int = 64
    """O: an environment turn (tool output, observation) is cut to this many tokens, keeping
    its head and tail (`env/obs_truncated` counts the cuts)."""
    max_trajectory_tokens: int = 0
    """M: most tokens after the prompt, model and environment together; a trajectory that
    reaches it ends (`env/truncated`). Also the response width of the training batch.
    0: the worst case T·N + (T-1)·O."""
    env_timeout_s: float = 30.0
    """Deadline of one environment step (a tool call, a test run); past it the trajectory
    ends with reward 0 and counts `env/timeouts`."""
    env_workers: int = 4
    """Threads per host stepping environments in parallel."""
    compact: bool = True
    """Drop finished trajectories from the decode batch between turns (else mask them)."""
    max_cache_slots: int = 16384
    """Most KV-cache slots per row the engine may allocate for one conversation."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Concrete limits of one run (see `resolve`)."""

    max_turns: int  # T
    max_new_tokens: int  # N, per turn
    max_obs_tokens: int  # O
    max_trajectory_tokens: int  # M
    max_prompt_tokens: int  # P
    slots: int  # KV-cache slots per row

    @property
    def max_block(self) -> int:
        """Widest extend block: a turn's last token, then one observation."""
        return 1 + self.max_obs_tokens


def resolve(cfg: MultiTurnConfig, task_max_turns: int, max_new_tokens: int,
            max_prompt_tokens: int, max_positions: int) -> Limits:
    """The run's limits; ValueError naming what does not fit (before any work)."""
    from locojax.engine.extend import slots_needed

    t = cfg.max_turns or task_max_turns
    n, o, p = max_new_tokens, cfg.max_obs_tokens, max_prompt_tokens
    for name, v in (("multi_turn.max_turns", t), ("multi_turn.max_obs_tokens", o),
                    ("rollout.max_new_tokens", n), ("multi_turn.env_workers", cfg.env_workers)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if cfg.max_trajectory_tokens < 0:
        raise ValueError(f"multi_turn.max_trajectory_tokens must be >= 0, got "
                         f"{cfg.max_trajectory_tokens}")
    if not cfg.env_timeout_s > 0:
        raise ValueError(f"multi_turn.env_timeout_s must be > 0, got {cfg.env_timeout_s}")
    m = cfg.max_trajectory_tokens or t * n + (t - 1) * o
    slots = slots_needed(p, n, t, 1 + o)
    if slots > cfg.max_cache_slots:
        raise ValueError(
            f"multi-turn limits need {slots} KV-cache slots per row (prompt {p} + {t} turns x "
            f"(max_new_tokens {n} - 1) + {t - 1} observations x (max_obs_tokens {o} + 1)), "
            f"more than multi_turn.max_cache_slots={cfg.max_cache_slots}: lower "
            "multi_turn.max_turns, rollout.max_new_tokens or multi_turn.max_obs_tokens, or "
            "raise max_cache_slots if the memory allows")
    if p + m > max_positions:
        raise ValueError(
            f"a trajectory of {p} prompt + {m} tokens (multi_turn.max_trajectory_tokens) does "
            f"not fit the model's max_position_embeddings={max_positions}")
    return Limits(t, n, o, m, p, slots)
