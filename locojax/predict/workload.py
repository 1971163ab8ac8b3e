"""The workload of one RL step: prompts, group size, length distributions, host costs.

A step samples G completions for each of B prompts. What the cost model needs of it:
- prompt lengths and the padded prompt columns P (locojax's engine pads to P);
- completion lengths and the cap N: a static-batch decode runs until the longest row of
  its batch stops, so what matters is the expected maximum of the rows that share a decode
  loop (a host's rows, a lease's rows), which grows with the tail of the distribution;
- host work: reward per row, and for multi-turn tasks env turns with their tool time and
  observation tokens.

Lengths come from a preset (assumptions stated), or for a `locojax train` command line
(locojax/commands/predict_train.py) from a data file (reference-solution lengths in
characters over a characters-per-token ratio) or a run's rollout dump (the `mask` of each
row gives its completion length exactly).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np

GRID = 512  # quantiles kept per distribution


@dataclasses.dataclass(frozen=True)
class Lengths:
    """A distribution of token counts as its quantile function on a uniform grid."""

    quantiles: tuple[float, ...]
    source: str

    @classmethod
    def fixed(cls, n: int, source: str) -> "Lengths":
        return cls((float(n),) * GRID, source)

    @classmethod
    def from_samples(cls, samples, source: str, cap: int | None = None) -> "Lengths":
        x = np.sort(np.asarray(samples, np.float64))
        if x.size == 0:
            raise ValueError(f"{source}: no lengths")
        u = (np.arange(GRID) + 0.5) / GRID
        q = np.quantile(x, u, method="inverted_cdf")
        if cap:
            q = np.minimum(q, cap)
        return cls(tuple(float(v) for v in q), source)

    @classmethod
    def lognormal(cls, mean: float, sigma: float, cap: int, source: str) -> "Lengths":
        """Log-normal with this mean (before the cap) and log-space σ, capped at `cap`."""
        mu = math.log(mean) - sigma ** 2 / 2
        nd = statistics.NormalDist()
        u = (np.arange(GRID) + 0.5) / GRID
        q = [min(cap, max(1.0, math.exp(mu + sigma * nd.inv_cdf(p)))) for p in u]
        return cls(tuple(q), source)

    @property
    def mean(self) -> float:
        return float(np.mean(self.quantiles))

    def expected_max(self, n: float) -> float:
        """E[max of n independent draws] = ∫ Q(u) d(u^n) over the quantile grid."""
        if n <= 1:
            return self.mean
        edges = np.arange(GRID + 1) / GRID
        weights = np.diff(edges ** n)
        return float(np.dot(weights, self.quantiles))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.asarray(self.quantiles)[rng.integers(0, GRID, size=n)]


@dataclasses.dataclass(frozen=True)
class Workload:
    """One step's work (B prompts x G samples) and its host costs per row."""

    name: str
    prompts: int  # B, over all hosts
    group: int  # G
    prompt_columns: int  # P: padded prompt tokens per row (locojax pads to max_prompt_tokens)
    max_new: int  # N: completion cap
    completion: Lengths  # tokens per completion (per model turn for multi-turn)
    task: str = "arith"  # which host rates apply (reward per row)
    beta: float = 0.0
    turns: int = 1  # model turns per trajectory
    obs_tokens: int = 0  # tokens of each env observation between turns
    tool_s: float = 0.0  # seconds of env/tool work per row per env turn (0: use the task's)
    trajectory: int = 0  # M: columns after the prompt of a multi-turn row (0: turns N + obs)
    source: str = ""

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    @property
    def response_columns(self) -> int:
        """Columns after the prompt, in the KV cache and the train batch: N, or for a
        multi-turn task M (`--multi-turn.max-trajectory-tokens`; unset: every turn's N
        tokens and the observations between them)."""
        if self.turns <= 1:
            return self.max_new
        return self.trajectory or self.turns * self.max_new + (self.turns - 1) * self.obs_tokens

    def decode_steps(self, rows_per_loop: float) -> float:
        """Decode iterations of one static-batch loop over `rows_per_loop` rows: the longest
        row, less the token prefill samples (at most N - 1)."""
        return max(0.0, min(self.max_new - 1, self.completion.expected_max(rows_per_loop) - 1))
