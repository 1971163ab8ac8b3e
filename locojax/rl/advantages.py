"""Outcome advantages from per-sequence rewards: group-relative, leave-one-out, batch baseline.

All take `rewards [B]` and `group_id [B]` (any ints; rows with equal ids are one group, in
any order) and return `(advantages [B], metrics)`. They run on whatever rows they are
given: in colocated mode that is one host's rollouts, which is exact because groups never
span hosts (docs/design.md), and for the batch baseline means a per-host baseline.

References: GRPO, Shao et al. 2024 (DeepSeekMath) §4.1.2; Dr.GRPO, Liu et al. 2025
("Understanding R1-Zero-like training"); RLOO, Ahmadian et al. 2024 / Kool et al. 2019;
REINFORCE with a baseline, Williams 1992. Legend: b, c rows of the batch.

Rewards reach here checked (`envs/base.check_reward`, applied by `envs/rewards.RewardRunner`
and `ToolEnv`: a value that is not finite or exceeds `REWARD_LIMIT` scored 0 and was counted
in `reward/errors`). A reward that came another way (a custom env's step rewards) gets the
same policy here, in float32: it counts as 0 and in `rollout/bad_rewards`, so one value can
never make a NaN or inf advantage for its group.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from locojax.envs.base import REWARD_LIMIT


def usable(rewards):
    """(rewards as float32 with every value the trainer cannot train on as 0, how many were).

    Checked after the cast: 1e39 is finite in float64 and inf in float32."""
    r = jnp.asarray(rewards).astype(jnp.float32)
    ok = jnp.isfinite(r) & (jnp.abs(r) <= REWARD_LIMIT)
    return jnp.where(ok, r, 0.0), jnp.sum(~ok).astype(jnp.float32)


def _metrics(rewards, group_id, bad):
    return {"rollout/frac_zero_std": frac_zero_std(rewards, group_id),
            "rollout/bad_rewards": bad}


def _groups(rewards, group_id):
    """Per-row statistics of the row's own group: count, sum, mean, and whether constant."""
    r, _ = usable(rewards)
    same = group_id[:, None] == group_id[None, :]  # [B, B]: row b and row c share a group
    # Masked sums, not a matmul: matmuls run at reduced precision on TPU by default.
    count = same.sum(axis=1).astype(jnp.float32)  # [B]
    total = jnp.where(same, r[None, :], 0.0).sum(axis=1)  # [B]
    mean = total / count
    # Exactly-equal rewards, tested without arithmetic: 0.1+0.1+0.1 over 3 is not 0.1.
    hi = jnp.where(same, r[None, :], -jnp.inf).max(axis=1)
    lo = jnp.where(same, r[None, :], jnp.inf).min(axis=1)
    constant = hi == lo
    return r, same, count, total, mean, constant


def frac_zero_std(rewards, group_id) -> jax.Array:
    """Share of groups whose rewards are all equal (they carry no learning signal)."""
    _, _, count, _, _, constant = _groups(rewards, group_id)
    # Each group counted once: its rows each contribute 1 / (its size).
    return jnp.sum(constant / count) / jnp.sum(1.0 / count)


def grpo(rewards, group_id, *, scale_by_std: bool = True, eps: float = 1e-6):
    """Â_b = (r_b - mean_g(r)) / (std_g(r) + ε), with g the group of b.

    `scale_by_std=False` is Dr.GRPO's Â_b = r_b - mean_g(r): dividing by the std upweights
    prompts that are nearly always or nearly never solved.
    Departure: std is the unbiased (n-1) sample std, as TRL and verl compute it; groups whose
    rewards are all equal (and singleton groups) get exactly 0, not 0/ε noise.
    """
    r, same, count, _, mean, constant = _groups(rewards, group_id)
    _, bad = usable(rewards)
    centred = r - mean
    sq = jnp.where(same, (r[None, :] - mean[:, None]) ** 2, 0.0).sum(axis=1)
    std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))
    adv = centred / (std + eps) if scale_by_std else centred
    adv = jnp.where(constant, 0.0, adv)
    return adv, _metrics(rewards, group_id, bad)


def rloo(rewards, group_id, **_):
    """Â_b = r_b - (Σ_{c in g, c≠b} r_c) / (n_g - 1): the mean of the *other* group members.

    Unbiased (the baseline does not depend on b's own sample). Singleton groups get 0.
    """
    r, _, count, total, _, constant = _groups(rewards, group_id)
    _, bad = usable(rewards)
    others = (total - r) / jnp.maximum(count - 1.0, 1.0)
    adv = jnp.where((count > 1) & ~constant, r - others, 0.0)
    return adv, _metrics(rewards, group_id, bad)


def batch_baseline(rewards, group_id, **_):
    """REINFORCE with a batch baseline: Â_b = r_b - mean over every row given.

    `group_id` is only used for the `rollout/frac_zero_std` metric.
    """
    r, bad = usable(rewards)
    return r - jnp.mean(r), _metrics(rewards, group_id, bad)


_SETTINGS = ("scale_by_std", "eps")
ESTIMATORS = {name: jax.jit(fn, static_argnames=_SETTINGS)
              for name, fn in (("grpo", grpo), ("rloo", rloo), ("batch", batch_baseline))}
"""Advantage estimators by name, jitted; `algorithms.py` picks one per algorithm. Run
eagerly, their ~20 small ops were dispatched one by one: 2 ms of a TINY step's host time."""
