"""Quantiles of the truncated IS weights (async modes), from an additive histogram."""

import jax.numpy as jnp
import numpy as np

from locojax.rl.aggregation import global_counts
from locojax.rl.losses import IS_HIST_WIDTH, is_weight_histogram, is_weight_quantiles


def setup(seed=0, rows=40, cols=25):
    rng = np.random.default_rng(seed)
    log_w = rng.uniform(-0.5, 0.9, (rows, cols)).astype(np.float32)
    behav = rng.uniform(-3, -0.1, (rows, cols)).astype(np.float32)
    old = behav + log_w  # w = π_old / π_behav = exp(log_w)
    mask = rng.random((rows, cols)) < 0.8
    stale = np.arange(rows) % 4 != 0  # every 4th row fresh: not weighted, not counted
    return old, behav, mask, stale, log_w


def test_quantiles_match_the_sample_quantiles_of_the_stale_tokens():
    old, behav, mask, stale, log_w = setup()
    cap = 2.0
    counts = global_counts(jnp.asarray(mask))
    hist = is_weight_histogram(jnp.asarray(old), jnp.asarray(behav), jnp.asarray(mask),
                               jnp.asarray(stale), counts, cap)
    q = is_weight_quantiles(hist)
    w = np.minimum(np.exp(log_w[stale][mask[stale]].astype(np.float64)), cap)
    assert abs(float(hist.sum()) - len(w) / mask.sum()) < 1e-6  # fractions of all tokens
    for name, p in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        true = np.quantile(w, p, method="inverted_cdf")
        # The estimate is the midpoint of the bin holding that sample: within half a bin in
        # log w; 1e-5 more for f32 rounding of log / exp at a bin edge (|log w| < 1).
        assert abs(np.log(q[f"actor/is_weight/{name}"]) - np.log(true)) <= IS_HIST_WIDTH / 2 + 1e-5
    # Weights above the cap are truncated to it: p99 sits in the top bin, at the cap.
    assert abs(np.log(q["actor/is_weight/p99"]) - np.log(cap)) <= IS_HIST_WIDTH


def test_micro_batches_add_up_to_the_whole_and_no_stale_rows_give_no_quantiles():
    old, behav, mask, stale, _ = setup(1)
    args = [jnp.asarray(x) for x in (old, behav, mask, stale)]
    counts = global_counts(args[2])
    whole = is_weight_histogram(*args, counts, 2.0)
    halves = sum(is_weight_histogram(*(a[i::2] for a in args), counts, 2.0) for i in (0, 1))
    # Same global denominator: the halves' fractions sum to the whole's, up to f32 rounding
    # of sums of at most 1000 terms each below 1 (relative 1e-7 per add).
    np.testing.assert_allclose(np.asarray(halves), np.asarray(whole), atol=1e-6)
    none = is_weight_histogram(*args[:3], jnp.zeros_like(args[3]), counts, 2.0)
    assert float(none.sum()) == 0.0 and is_weight_quantiles(none) == {}
