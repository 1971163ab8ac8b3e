"""The per-token policy objective: clipped ratio, KL to a reference, truncated IS weight.

Three policies appear (decoupled PPO, Hilton et al. 2021):
  π_θ      the params being trained (logp; carries the gradient);
  π_old    the params at the start of the train step (old_logp; PPO's proximal policy);
  π_behav  the policy that sampled the data, whose logprobs the sampler returned.
The PPO ratio is r = π_θ / π_old. When a sample is stale (sampled by an older policy
version than the step starts from) the loss is also weighted by the truncated importance
weight w = min(π_old / π_behav, C) (Espeholt et al. 2018 "V-trace"; Yao et al. 2025 "TIS"),
a stop-gradient constant. On-policy (staleness 0) w = 1 and π_old = π_behav up to the
sampler/trainer numeric gap, which is logged as `rollout/logprob_mismatch`.

Per token, with A the advantage and ε_low, ε_high the clip ranges (DAPO clip-higher):
  pg  = max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high))          (PPO, Schulman et al. 2017)
  pg  = min(pg, -c·A)  where A < 0                          (dual-clip, Ye et al. 2020)
  GSPO (Zheng et al. 2025) replaces r by the sequence ratio
      s_b = exp((1/n_b) Σ_t (log π_θ - log π_old)),  the length-normalised geometric mean,
  broadcast to the row's tokens.
  loss = w·pg + β·KL(π_θ ‖ π_ref),  KL per token by k1, k2 or k3 (Schulman 2020).
Aggregation over tokens is `aggregation.aggregate`; metrics here are partial sums with
global denominators too, so they add up across micro-batches. Extremes (`*_max`, `*_min`)
are combined with max / min instead.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from locojax.rl.aggregation import Counts, aggregate, token_mean


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """Concrete loss settings, resolved from `AlgoConfig` by `algorithms.resolve`."""

    ratio_level: str = "token"  # "token" (PPO/GRPO) or "sequence" (GSPO)
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float = 0.0  # 0 = off
    beta: float = 0.0
    kl_estimator: str = "k3"
    loss_agg: str = "token-mean"
    max_response_len: int = 0
    is_cap: float = 2.0  # 0 = off
    is_all_samples: bool = False


def log_ratio(logp, old_logp, mask, level: str = "token"):
    """log r [B, T]: per token, or GSPO's per-sequence mean broadcast over the row."""
    delta = jnp.where(mask, logp - old_logp, 0.0)
    if level == "token":
        return delta
    if level != "sequence":
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {level!r}")
    n = jnp.maximum(mask.sum(axis=-1, keepdims=True).astype(jnp.float32), 1.0)  # [B, 1]
    return jnp.broadcast_to(delta.sum(axis=-1, keepdims=True) / n, delta.shape)


def clipped_pg(ratio, adv, eps_low: float, eps_high: float, dual_clip: float = 0.0):
    """PPO clipped surrogate loss per token [B, T], and where each clip side is active.

    A clip side is "active" when it zeroes the token's gradient: A > 0 with r > 1 + ε_high
    (clip_high), or A < 0 with r < 1 - ε_low (clip_low).
    """
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(unclipped, clipped)
    if dual_clip:
        # For A < 0 a huge ratio would otherwise give an unbounded loss; cap it at -c·A.
        loss = jnp.where(adv < 0, jnp.minimum(loss, -adv * dual_clip), loss)
    clip_high = (adv > 0) & (ratio > 1.0 + eps_high)
    clip_low = (adv < 0) & (ratio < 1.0 - eps_low)
    return loss, clip_low, clip_high


def kl_penalty(logp, ref_logp, estimator: str = "k3"):
    """Per-token estimate of KL(π_θ ‖ π_ref) from samples of π_θ, with δ = log π_θ - log π_ref.

    k1 = δ (unbiased, high variance, can be negative); k2 = δ²/2 (biased, low variance);
    k3 = e^{-δ} - 1 + δ (unbiased, non-negative; the GRPO paper's choice).
    """
    delta = logp - ref_logp
    if estimator == "k1":
        return delta
    if estimator == "k2":
        return 0.5 * delta * delta
    if estimator == "k3":
        return jnp.exp(-delta) - 1.0 + delta
    raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2 or k3")


def truncated_is_weight(old_logp, behav_logp, mask, stale, cap: float, level: str = "token"):
    """w = min(π_old / π_behav, C) [B, T] on rows where `stale` [B] is True, 1 elsewhere.

    At the ratio level of the loss (per sequence for GSPO). A constant: it reweights
    samples and is not differentiated. C = 0 turns it off (w = 1 everywhere).
    """
    if not cap:
        return jnp.ones(old_logp.shape, old_logp.dtype)
    w = jnp.minimum(jnp.exp(log_ratio(old_logp, behav_logp, mask, level)), cap)
    w = jnp.where(stale[:, None], w, 1.0)
    return jax.lax.stop_gradient(w)


IS_HIST_LOW, IS_HIST_WIDTH = -1.0, 0.02
"""Bins of the IS-weight histogram, in log w: [-1, log C] in steps of 0.02 (w within 2%),
with everything below e^-1 in the first bin."""


def is_weight_histogram(old_logp, behav_logp, mask, stale, counts: Counts, cap: float,
                        level: str = "token"):
    """Histogram [n_bins] of the truncated IS weight over stale rows' response tokens, each
    bin as a fraction of the update's global token count (so micro-batches add up);
    `is_weight_quantiles` turns it into quantiles on the host."""
    n = is_weight_bins(cap)
    w = truncated_is_weight(old_logp, behav_logp, mask, jnp.ones_like(stale), cap, level)
    idx = jnp.clip(jnp.floor((jnp.log(w) - IS_HIST_LOW) / IS_HIST_WIDTH), 0, n - 1)
    dtype = jnp.promote_types(w.dtype, jnp.float32)  # an f64 run sums its fractions in f64
    weight = (mask & stale[:, None]).astype(dtype) / jnp.maximum(counts.tokens, 1.0)
    return jnp.zeros((n,), dtype).at[idx.astype(jnp.int32).reshape(-1)].add(
        weight.reshape(-1))


def is_weight_bins(cap: float) -> int:
    top = math.log(cap) if cap else 0.0  # cap 0: w = 1 everywhere
    return int(math.ceil((top - IS_HIST_LOW) / IS_HIST_WIDTH)) + 1


def is_weight_quantiles(hist, qs=(0.1, 0.5, 0.9, 0.99)) -> dict[str, float]:
    """`actor/is_weight/p<q>` from `is_weight_histogram` (bin midpoints, so to within 2%);
    empty when no stale token was trained."""
    hist = np.asarray(hist, np.float64)
    total = hist.sum()
    if total <= 0:
        return {}
    cdf = np.cumsum(hist) / total
    out = {}
    for q in qs:
        i = int(np.searchsorted(cdf, q))
        out[f"actor/is_weight/p{round(q * 100)}"] = float(
            math.exp(IS_HIST_LOW + (min(i, len(hist) - 1) + 0.5) * IS_HIST_WIDTH))
    return out


def objective(logp, entropy, old_logp, behav_logp, ref_logp, adv, mask, stale,
              counts: Counts, s: LossSettings):
    """One micro-batch's loss share and metric shares (both with global denominators).

    logp, entropy: [B, T] from π_θ. old_logp, behav_logp, ref_logp: [B, T] (ref may be None
    when β = 0). adv: [B] or [B, T]. mask: [B, T] bool response tokens. stale: [B] bool, the
    rows the IS weight applies to.
    """
    # Zero whatever the caller left under the mask before any arithmetic: with `x * mask`
    # a NaN there would survive as NaN * 0, and in the backward pass even `where` leaks it.
    clean = lambda x: jnp.where(mask, x, 0.0)  # noqa: E731
    adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, mask.shape)
    adv, old_logp, behav_logp = clean(adv), clean(old_logp), clean(behav_logp)

    ratio = jnp.exp(log_ratio(logp, old_logp, mask, s.ratio_level))
    pg, clip_low, clip_high = clipped_pg(ratio, adv, s.eps_low, s.eps_high, s.dual_clip)
    w = truncated_is_weight(old_logp, behav_logp, mask, stale, s.is_cap, s.ratio_level)
    pg = w * pg
    pg_loss = aggregate(pg, mask, counts, s.loss_agg, s.max_response_len)
    loss = pg_loss

    f32 = lambda b: b.astype(jnp.float32)  # noqa: E731
    metrics = {
        "actor/pg_loss": pg_loss,
        "actor/entropy": token_mean(entropy, mask, counts),
        "actor/clip_frac_low": token_mean(f32(clip_low), mask, counts),
        "actor/clip_frac_high": token_mean(f32(clip_high), mask, counts),
        "actor/is_weight_mean": token_mean(w, mask, counts),
    }
    if s.beta:
        # Clean logp too: k3's e^{-δ} at a masked (prompt, pad) position could overflow,
        # and inf there would turn the zero cotangent into NaN in the backward pass.
        kl = kl_penalty(clean(logp), clean(ref_logp), s.kl_estimator)
        loss = loss + s.beta * aggregate(kl, mask, counts, s.loss_agg, s.max_response_len)
        metrics["actor/kl"] = token_mean(kl, mask, counts)
    # Extremes do not add across micro-batches; `train_step` combines them with max / min.
    extremes = {
        "actor/is_weight_max": jnp.max(jnp.where(mask, w, -jnp.inf)),
        "actor/ratio_max": jnp.max(jnp.where(mask, ratio, -jnp.inf)),
        "actor/ratio_min": jnp.min(jnp.where(mask, ratio, jnp.inf)),
    }
    return loss, metrics, extremes
