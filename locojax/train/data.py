"""Which examples a step trains on: a pure function of (seed, step), so resume is exact.

Global prompt slot i of step s is the (s·B + i)-th draw of an endless stream that walks the
training split in a fresh seeded permutation each epoch. The data cursor is therefore just
the step, and any host can compute its own slots without talking to the others. With
pass-rate curation on (`curation.py`), held prompts are skipped, and the cursor (the next
draw) is kept by the curator and saved in the checkpoint.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from locojax.envs.base import Example


class PromptStream:
    def __init__(self, examples: Sequence[Example], seed: int):
        if len(examples) == 0:
            raise ValueError("the training split is empty")
        self.examples, self.seed = examples, seed
        self._perm: dict[int, np.ndarray] = {}

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm:
            self._perm = {epoch: np.random.default_rng([self.seed, epoch]).permutation(
                len(self.examples))}
        return self._perm[epoch]

    def index(self, draw: int) -> int:
        """The training-split index of the stream's `draw`-th prompt (0-based)."""
        n = len(self.examples)
        return int(self._permutation(draw // n)[draw % n])

    def take(self, step: int, per_step: int, start: int, stop: int) -> list[Example]:
        """Slots [start, stop) of step `step`'s `per_step` prompts."""
        return [self.examples[self.index(i)]
                for i in range(step * per_step + start, step * per_step + stop)]
