"""The reward/verifier pool of the Ray modes (RLAX's verifier pool).

A rollout worker's producer is handed a `VerifierPool` in place of a local `RewardRunner`:
the pool splits each batch over the `Verifier` actors, each of which guards its calls with
its own `RewardRunner` (timeouts, errors). Scoring is idempotent, so a verifier restarted by
Ray is simply asked again.
"""

from __future__ import annotations

import numpy as np
import ray

from locojax.envs.rewards import RewardConfig, RewardRunner, Scores
from locojax.fleet.actors import setup_logging


@ray.remote
class Verifier:
    """Scores completions with its own guarded `RewardRunner`."""

    def __init__(self, index: int, config: RewardConfig):
        setup_logging()
        self.index, self.runner = index, RewardRunner(config)

    def __repr__(self) -> str:
        return f"verifier {self.index}"

    def score(self, fn, completions: list[str], examples: list) -> tuple[Scores, dict]:
        scores = self.runner.score_batch(fn, completions, examples)
        return scores, self.runner.metrics()


class VerifierPool:
    """The `RewardRunner` interface the producer uses, served by `Verifier` actors."""

    def __init__(self, verifiers: list):
        self.verifiers = verifiers
        self._counts: dict[str, float] = {}

    def score_batch(self, fn, completions, examples) -> Scores:
        n = len(completions)
        bounds = np.linspace(0, n, min(len(self.verifiers), max(n, 1)) + 1).astype(int)
        refs = [v.score.remote(fn, list(completions[a:b]), list(examples[a:b]))
                for v, a, b in zip(self.verifiers, bounds[:-1], bounds[1:])]
        results = ray.get(refs)
        for _, counts in results:
            for k, v in counts.items():
                if not k.endswith("/mean"):  # part means are recomputed from the rows
                    self._counts[k] = self._counts.get(k, 0.0) + v
        parts = {k: np.concatenate([s.parts[k] for s, _ in results]) for k in results[0][0].parts}
        return Scores(np.concatenate([s.total for s, _ in results]), parts)

    def metrics(self, reset: bool = True) -> dict[str, float]:
        out = dict(self._counts)
        if reset:
            self._counts = {}
        return out

    def close(self) -> None:
        pass
