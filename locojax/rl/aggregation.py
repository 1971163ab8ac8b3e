"""Loss aggregation over response tokens, normalised by GLOBAL counts.

The classic bug of RL trainers (verl, TRL, prime-rl and slime forks have all shipped it)
is a loss whose denominator is a per-device or per-micro-batch count, so the objective
changes with the layout. Here the counts of one optimizer update's whole batch (every
device, host and micro-batch) are computed once, before micro-batching (`global_counts`),
and every per-micro-batch loss is a partial SUM over its rows divided by those global
denominators. Summing micro-batch gradients then gives exactly the full-batch gradient.

Modes (L = per-token loss, m = response mask, n_b = Σ_t m_bt, S = #{b : n_b > 0}):
  token-mean               Σ_bt m L / Σ_bt m                 (DAPO)
  seq-mean-token-mean      (1/S) Σ_b (Σ_t m L) / n_b          (GRPO paper, GSPO)
  seq-mean-token-sum       (1/S) Σ_b Σ_t m L
  seq-mean-token-sum-norm  (1/S) Σ_b Σ_t m L / L_max          (Dr.GRPO, L_max a constant)
n_b is a row's own count, so it is local to whichever device holds the row.

Departure from verl: its `seq-mean-token-sum-norm` divides by the padded width
`loss_mask.shape[-1]` (so padding changes the objective); we divide by the configured
`max_response_len`, as Dr.GRPO's reference code does with its generation budget.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from locojax.rl.config import AGG_MODES


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Counts:
    """Denominators of one optimizer update, over its whole (global) batch."""

    tokens: jax.Array  # [] f32: response tokens
    seqs: jax.Array  # [] f32: sequences with at least one response token


def global_counts(loss_mask: jax.Array) -> Counts:
    """Counts over every row given. Call it on the whole update batch, never a micro-batch.

    Inside a jit whose input is the global (sharded) array, these sums are global: XLA
    inserts the all-reduce.
    """
    m = loss_mask.astype(jnp.float32)
    per_seq = m.sum(axis=-1)
    return Counts(tokens=per_seq.sum(), seqs=(per_seq > 0).sum().astype(jnp.float32))


def masked_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Σ over masked entries; `where`, not a product, so garbage (NaN) under the mask is inert."""
    return jnp.sum(jnp.where(mask, values, 0.0))


def aggregate(values: jax.Array, mask: jax.Array, counts: Counts, mode: str,
              max_len: int = 0) -> jax.Array:
    """This micro-batch's share of the loss: a partial sum over its rows / global denominators.

    values, mask: [B, T] (a micro-batch). Summed over the micro-batches of an update this is
    the aggregate of the whole update batch, exactly as if computed in one piece.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; choose from {AGG_MODES}")
    seqs = jnp.maximum(counts.seqs, 1.0)
    if mode == "token-mean":
        return masked_sum(values, mask) / jnp.maximum(counts.tokens, 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = jnp.sum(jnp.where(mask, values, 0.0), axis=-1)  # [B]
        n = jnp.maximum(mask.sum(axis=-1).astype(jnp.float32), 1.0)  # [B], this row's own count
        return jnp.sum(per_seq / n) / seqs
    if mode == "seq-mean-token-sum":
        return masked_sum(values, mask) / seqs
    if max_len <= 0:
        raise ValueError("seq-mean-token-sum-norm needs AlgoConfig.max_response_len > 0 "
                         "(the Dr.GRPO constant: the sampler's max new tokens)")
    return masked_sum(values, mask) / (seqs * max_len)


def token_mean(values: jax.Array, mask: jax.Array, counts: Counts) -> jax.Array:
    """Partial token mean for metrics: globally normalised like the loss."""
    return aggregate(values, mask, counts, "token-mean")
