"""The sampler-learner gap: |engine logprob - learner logprob| of every fresh token, each step.

The engine's logprob of a token it sampled and the learner's π_old of it come from one forward
(`decoder.py`) on one version of the weights, so they differ by rounding only; a larger gap
means the sampler did not run the learner's weights (a stale or damaged version: the class of
bug this catches). `metrics` measures it inside the train step, over the tokens the sampler
drew with this step's params: its mean (`rollout/logprob_mismatch`), its maximum
(`rollout/logprob_gap_max`) and a histogram (`rollout/logprob_gap_hist`, turned into
`rollout/logprob_gap/p50|p90|p99` and the share of tokens bitwise equal, `.../zero`, by
`quantiles` on the host). `check` stops the run when the maximum passes `bound`, naming the
weight versions. In disaggregated and async a rollout worker measures its unit with its own
forward on the version it names (`counts`, the same histogram), and `check_units` stops the
learner on a unit it reported past the bound.

The bound (docs/design.md, "Sampler logprobs equal trainer logprobs"):

  0 with `ModelConfig.batch_invariant` in bf16 compute, the sampler's cache and weights in
  bf16 too: both sides run the same fixed-order kernels (`model/invariant.py`), bitwise
  under every XLA:CPU flag set tried; in f32 they are bitwise under the suite's flags but
  not XLA's defaults (docs/design.md), so f32 keeps the derived bound;

  otherwise what two programs computing the same logprob may differ by, as the suite's
  `tests/hf_reference.logprob_tol` derives it: each logit is off by at most
  λ·√n·u · Σ_d |h_d e_vd| in each program (Higham & Mary's probabilistic bound, λ = 10, n the
  forward's reduction depth: `depth`), so by 2·λ√n·u·Σ between the two; a logprob
  z_t/τ - logsumexp(z/τ) moves by twice that over τ, plus the V-term sum's own rounding
  2·λ√V·u. Σ_d |h_d e_vd| ≤ ‖h‖·‖e_v‖ ≤ √D · max|norm scale| · max_v ‖e_v‖ (h leaves the
  final RMSNorm with unit RMS): `logit_terms`, from the weights each step. u is the unit
  roundoff of the coarsest dtype either side computes or stores in (bf16: a rollout copy, a
  bf16 cache or compute), or that its matrix products round f32 to (XLA:TPU at jax's default
  precision: `matmul_rounding`). The bound holds for any kernel order; it is loose (large models,
  bf16), so there it catches only gross version mix-ups.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from locojax.model.config import ModelConfig

LAMBDA = 10.0  # the probabilistic bound's confidence factor (tests/tolerance.py)
EDGES = tuple(10.0 ** (e / 2) for e in range(-18, 3))
"""Histogram bin edges of |gap|, half decades from 1e-9 to 10; bin 0 holds the exact zeros,
the last everything past 10."""


def metrics(mask, sampler, trainer, tokens) -> dict:
    """The gap's metric shares over `mask` [B, T] (sums over micro-batches and devices give
    the step's): mean, max and histogram (fractions of the step's `tokens`)."""
    gap = jnp.where(mask, jnp.abs(jnp.where(mask, sampler, 0.0) - trainer), 0.0)
    share = mask.astype(gap.dtype) / jnp.maximum(tokens, 1.0)
    edges = jnp.asarray(EDGES, gap.dtype)
    idx = jnp.where(gap == 0, 0, 1 + jnp.searchsorted(edges, gap, side="right"))
    hist = jnp.zeros((len(EDGES) + 2,), gap.dtype).at[idx.reshape(-1)].add(share.reshape(-1))
    return {"rollout/logprob_mismatch": jnp.sum(gap) / jnp.maximum(tokens, 1.0),
            "rollout/logprob_gap_max": jnp.max(gap), "rollout/logprob_gap_hist": hist}


def quantiles(hist) -> dict[str, float]:
    """`rollout/logprob_gap/p50|p90|p99` (the upper edge of the quantile's bin) and `/zero`
    (the share of tokens with no gap at all) from `rollout/logprob_gap_hist`."""
    hist = np.asarray(hist, np.float64)
    total = hist.sum()
    if total <= 0:
        return {}
    cdf = np.cumsum(hist) / total
    upper = (0.0,) + EDGES + (math.inf,)
    out = {"rollout/logprob_gap/zero": float(hist[0] / total)}
    for q in (0.5, 0.9, 0.99):
        out[f"rollout/logprob_gap/p{round(q * 100)}"] = upper[int(np.searchsorted(cdf, q))]
    return out


def counts(gap) -> tuple[float, ...]:
    """Token counts per bin of `metrics`' histogram, on the host: `gap` holds the |gap| of
    each token checked (a rollout worker's, `fleet/rollout_worker.py`)."""
    gap = np.asarray(gap, np.float64).reshape(-1)
    idx = np.where(gap == 0, 0, 1 + np.searchsorted(np.asarray(EDGES), gap, side="right"))
    return tuple(float(c) for c in np.bincount(idx, minlength=len(EDGES) + 2))


def logit_terms(params, cfg: ModelConfig):
    """A bound on any logit's Σ_d |h_d e_vd| under these weights (module docstring), in the
    weights' own precision (at least f32): a step's metric, so in f64 it agrees across
    layouts to f64 rounding (tests/test_layout_invariance.py compares every metric)."""
    head = params["embed"] if cfg.tie_word_embeddings else params["lm_head"].T  # [V, D]
    dtype = jnp.promote_types(head.dtype, jnp.float32)
    scale = params["final_norm"].astype(dtype)
    scale = 1.0 + scale if cfg.family.unit_offset_norm else scale
    rows = jnp.sqrt(jnp.max(jnp.sum(jnp.square(head.astype(dtype)), axis=-1)))
    return math.sqrt(cfg.hidden_size) * jnp.max(jnp.abs(scale)) * rows


def depth(cfg: ModelConfig, columns: int) -> int:
    """n: the reduction terms along a logit's forward at `columns` keys (what each layer
    sums over: norm, projections, q/k norm, scores, softmax and p·v, o-proj, norm, gate/up,
    down; then the final norm and the head)."""
    d, h, n = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads
    per_layer = d + d + h + h + 2 * columns + n * h + d + d + cfg.intermediate_size
    return cfg.num_hidden_layers * per_layer + 2 * d


def bound(cfg: ModelConfig, terms: float, columns: int, temperature: float,
          sampler_dtypes=()) -> float:
    """The largest gap rounding explains (module docstring); 0 where both sides are bitwise.
    sampler_dtypes: the engine's cache and weights dtypes where they differ from compute."""
    dtypes = {np.dtype(cfg.dtype), *(np.dtype(d) for d in sampler_dtypes),
              *matmul_rounding()}
    if cfg.batch_invariant and dtypes == {np.dtype(jnp.bfloat16)}:
        return 0.0
    u = max(float(jnp.finfo(d).eps) / 2 for d in dtypes)
    logit = 2 * LAMBDA * math.sqrt(depth(cfg, columns)) * u * terms
    return 2 * logit / max(temperature, 1e-6) + 2 * LAMBDA * math.sqrt(cfg.vocab_size) * u


def matmul_rounding() -> tuple:
    """The dtype a matrix product rounds its f32 operands to where it is coarser than f32:
    XLA:TPU at jax's default matmul precision multiplies f32 in one bf16 pass
    (docs/tpu.md, "The chip's arithmetic"), so there u is bf16's."""
    precision = jax.config.jax_default_matmul_precision
    if jax.default_backend() == "tpu" and precision in (None, "default", "bfloat16", "fastest"):
        return (jnp.bfloat16,)
    return ()


class LogprobGapError(RuntimeError):
    """A step's sampler-learner gap passed its bound: the sampler ran other weights."""


def check(metrics: dict, limit: float, sampler_version: int, learner_version: int) -> None:
    """Raise `LogprobGapError` naming both versions if the step's gap passed `limit`; a step
    without the measurement (stale rows, measured by the rollout workers) passes."""
    gap = metrics.get("rollout/logprob_gap_max")
    if gap is None or not gap > limit:
        return
    raise LogprobGapError(
        f"the sampler's logprobs differ from the learner's by up to {gap:.3g}, past the "
        f"rounding bound {limit:.3g} (locojax/rl/logprob_gap.py): the rollout was generated "
        f"by weights version {sampler_version} and the learner scored it with version "
        f"{learner_version}; a gap past rounding means the sampler did not run the learner's "
        "weights (a stale or damaged version).")


def unit_key(version: int, step: int, unit: int) -> str:
    """A leased unit's key in `RolloutStats.logprob_gap_past` and `_bounds`."""
    return f"version {version}, step {step} unit {unit}"


def check_units(past: dict[str, float], bounds: dict[str, float], learner_version: int) -> None:
    """The Ray modes' `check`: each rollout worker scores its unit's tokens with its own
    forward on the version it holds and names (`fleet/rollout_worker.py`), and reports a
    unit whose gap passed the bound (`unit_key` -> its largest gap, and -> the bound).
    Raise `LogprobGapError` naming the worst unit's version and the learner's."""
    bad = {k: v for k, v in past.items() if v > bounds.get(k, 0.0)}
    if not bad:
        return
    worst = max(bad, key=bad.get)
    raise LogprobGapError(
        f"{len(bad)} leased unit(s) were sampled with logprobs that differ from their rollout "
        f"worker's forward past the rounding bound (locojax/rl/logprob_gap.py); the worst, "
        f"{worst}: by up to {bad[worst]:.3g}, past {bounds.get(worst, 0.0):.3g}. The rollout "
        f"was generated by a sampler holding and naming weights {worst.split(',')[0]} "
        f"while the learner is at version {learner_version}; a gap past rounding means the "
        "sampler did not run the weights it names (a stale or damaged version).")
