"""Per-row length caps drawn from a long-tailed distribution: a benchmark's workload.

`--rollout.tail-median M --rollout.tail-sigma S` caps row r's new tokens at
ceil(M · exp(S · z_r)), z_r ~ N(0, 1), clipped to [1, N]: benchmarks/engine_work.py's
small-* shapes (median 200, σ 1), for a training run. With --rollout.ignore-eos every row
is exactly its cap, so a step's work is fixed and a few rows run far past the median (the
tail async's in-flight updates are for). z_r is drawn from the row's global group id and
its sample index alone, so a row's cap is the same whichever host, worker or lease
generates it.
"""

from __future__ import annotations

import math

import numpy as np

TAIL_KEY = 0x7A11  # the draws' own stream, apart from the run's sampling keys


def tail_limits(first_group: int, groups: int, group_size: int, median: int, sigma: float,
                cap: int) -> np.ndarray:
    """[groups · group_size] int32 caps of the rows of groups first_group.., prompt-major."""
    z = np.concatenate([np.random.default_rng([TAIL_KEY, first_group + g]).normal(
        size=group_size) for g in range(groups)])
    return np.clip(np.ceil(median * np.exp(sigma * z)), 1, cap).astype(np.int32)


def tail_quantile(median: int, sigma: float, q: float) -> float:
    """The q-quantile of the uncapped lognormal (a benchmark states its shape with it)."""
    from statistics import NormalDist

    return median * math.exp(sigma * NormalDist().inv_cdf(q))
