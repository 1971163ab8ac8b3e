"""Named algorithms: each is an advantage estimator plus loss settings, not a subclass.

`ALGORITHMS[name]()` gives the algorithm's defaults; `resolve(AlgoConfig)` fills the
config's `None` fields from them and returns the advantage function and `LossSettings`.
Each entry's docstring gives its objective and where locojax departs from the paper.
Notation: r = π_θ/π_old per token, A the advantage, G the group size, |o_i| the length of
response i, sg stop-gradient, β the KL weight (`AlgoConfig.beta`, 0 by default everywhere).

Anchors: Tunix `algo_core` (algorithms as registry entries), verl `core_algos.py`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from locojax.rl import advantages as adv_lib
from locojax.rl.config import AlgoConfig
from locojax.rl.losses import LossSettings


@dataclasses.dataclass(frozen=True)
class Algorithm:
    advantage: str
    """Key of `advantages.ESTIMATORS`."""
    scale_by_std: bool
    ratio_level: str
    """"token" or "sequence"."""
    loss_agg: str
    eps_low: float = 0.2
    eps_high: float = 0.2


def grpo() -> Algorithm:
    """GRPO (Shao et al. 2024, DeepSeekMath eq. 3):
    J = (1/G) Σ_i (1/|o_i|) Σ_t [min(r A_i, clip(r, 1-ε, 1+ε) A_i) - β KL_k3],
    A_i = (R_i - mean(R)) / std(R) over the group.
    Departures: β defaults to 0 (the paper used 0.04; many replications drop the KL);
    the per-token KL is aggregated like the policy term.
    """
    return Algorithm("grpo", True, "token", "seq-mean-token-mean")


def dr_grpo() -> Algorithm:
    """Dr.GRPO (Liu et al. 2025): GRPO without its two length/difficulty biases,
    J = (1/G) Σ_i Σ_t min(r A_i, clip(r) A_i) / L_max,   A_i = R_i - mean(R).
    L_max is the constant `max_response_len` (the generation budget), not |o_i|.
    """
    return Algorithm("grpo", False, "token", "seq-mean-token-sum-norm")


def dapo() -> Algorithm:
    """DAPO (Yu et al. 2025): GRPO advantages, clip-higher and token-level averaging,
    J = (1 / Σ_i |o_i|) Σ_i Σ_t min(r A_i, clip(r, 1-ε_low, 1+ε_high) A_i),
    ε_low = 0.2, ε_high = 0.28, no KL.
    Departures: dynamic sampling (refilling groups with zero reward variance) and overlong
    filtering / soft punishment belong to the rollout side: `--dynamic.*` of `locojax train`
    (`train/dynamic_sampling.py`), off by default, for any algorithm.
    """
    return Algorithm("grpo", True, "token", "token-mean", eps_low=0.2, eps_high=0.28)


def gspo() -> Algorithm:
    """GSPO (Zheng et al. 2025): a sequence-level ratio,
    s_i = (π_θ(o_i) / π_old(o_i))^{1/|o_i|} = exp((1/|o_i|) Σ_t log r_it),
    J = (1/G) Σ_i min(s_i A_i, clip(s_i, 1-ε_low, 1+ε_high) A_i), ε = (3e-4, 4e-4).
    s_i is broadcast to the row's tokens and aggregated seq-mean-token-mean, which equals the
    paper's sum over sequences (GSPO-token with sequence-level advantages).
    """
    return Algorithm("grpo", True, "sequence", "seq-mean-token-mean", eps_low=3e-4, eps_high=4e-4)


def rloo() -> Algorithm:
    """RLOO (Ahmadian et al. 2024): leave-one-out baseline A_i = R_i - mean_{j≠i} R_j,
    J = token-mean of min(r A_i, clip(r) A_i).
    Departure: the paper's loss is plain REINFORCE at the sequence level; with μ = 1 the
    first update is exactly that (r = 1, nothing clipped), and PPO clipping guards μ > 1.
    """
    return Algorithm("rloo", False, "token", "token-mean")


def reinforce() -> Algorithm:
    """REINFORCE with a batch baseline (Williams 1992): A_i = R_i - mean over the batch,
    J = token-mean of min(r A_i, clip(r) A_i) (plain REINFORCE at μ = 1, as for RLOO).
    The batch is what the advantage function is given: one host's rollouts in colocated mode.
    """
    return Algorithm("batch", False, "token", "token-mean")


ALGORITHMS: dict[str, Callable[[], Algorithm]] = {
    f.__name__: f for f in (grpo, dr_grpo, dapo, gspo, rloo, reinforce)
}


def algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose from {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]()


def resolve(cfg: AlgoConfig) -> tuple[Callable, LossSettings]:
    """The advantage function (rewards, group_id) -> (adv, metrics) and the loss settings."""
    a = algorithm(cfg.name)
    pick = lambda mine, default: default if mine is None else mine  # noqa: E731
    settings = LossSettings(
        ratio_level=a.ratio_level,
        eps_low=pick(cfg.eps_low, a.eps_low),
        eps_high=pick(cfg.eps_high, a.eps_high),
        dual_clip=cfg.dual_clip,
        beta=cfg.beta,
        kl_estimator=cfg.kl_estimator,
        loss_agg=pick(cfg.loss_agg, a.loss_agg),
        max_response_len=cfg.max_response_len,
        is_cap=cfg.is_cap,
        is_all_samples=cfg.is_all_samples,
    )
    if settings.loss_agg == "seq-mean-token-sum-norm" and cfg.max_response_len <= 0:
        raise ValueError(f"algorithm {cfg.name!r} with loss_agg 'seq-mean-token-sum-norm' needs "
                         "max_response_len > 0 (the Dr.GRPO constant: the max new tokens)")
    fn = functools.partial(adv_lib.ESTIMATORS[a.advantage],
                           scale_by_std=pick(cfg.scale_by_std, a.scale_by_std), eps=cfg.adv_eps)
    return fn, settings


def compute_advantages(cfg: AlgoConfig, rewards, group_id):
    """Advantages [B] and `rollout/*` metrics for the configured algorithm."""
    fn, _ = resolve(cfg)
    return fn(rewards, group_id)
