"""Seeded, lazily generated splits whose train and held-out problems never overlap.

A problem is identified by a canonical key (e.g. "37+48"). Its split is a fixed hash of that
key, independent of the seed: `blake2b(key) mod 1000 < test_permille` -> held out. So no
seed, level or size of the train split can ever produce a held-out problem, and a user can
grow the train split without touching the test split.

Train example i is drawn from `Random(f"{seed}/train/{i}")` by rejection until its key hashes
to train, so examples are reproducible by index alone: the data cursor is one integer. The
held-out split is materialised once, deduplicated, so accuracy is over distinct problems.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

from locojax.envs.base import Example

TEST_PERMILLE = 100
"""Share of the problem space reserved for held-out evaluation, in thousandths."""


def is_held_out(key: str, test_permille: int = TEST_PERMILLE) -> bool:
    """The fixed, seed-independent split of a problem key."""
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return h % 1000 < test_permille


Sampler = Callable[[random.Random], tuple[str, Example]]
"""rng -> (canonical key, example); the example id is filled in by the split."""


class ProceduralSplit(Sequence[Example]):
    """`length` examples, example i generated from (seed, split, i) alone."""

    def __init__(self, sample: Sampler, split: str, seed: int, length: int,
                 test_permille: int = TEST_PERMILLE, widest: Sequence[Example] = ()):
        """widest: examples whose prompts are, by the generator's construction, the longest
        it can draw (`data_lengths.fit` sizes `auto` from these, not from every row)."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if length <= 0:
            raise ValueError(f"split length must be positive, got {length}")
        self.sample, self.split, self.seed, self.length = sample, split, seed, length
        self.test_permille = test_permille
        self.widest = tuple(widest)
        self._held = split == "test"
        self._cache: list[Example] | None = None
        if self._held:
            self._cache = self._distinct_test_examples()

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.length))]
        if not -self.length <= i < self.length:
            raise IndexError(f"index {i} out of range for {self.split} split of {self.length}")
        i %= self.length
        if self._cache is not None:
            return self._cache[i]
        return self._draw(random.Random(f"{self.seed}/{self.split}/{i}"), i)

    def _draw(self, rng: random.Random, i: int) -> Example:
        for _ in range(100_000):
            key, ex = self.sample(rng)
            if is_held_out(key, self.test_permille) == self._held:
                return _with_id(ex, f"{self.split}/{i}", key)
        raise RuntimeError(f"could not draw a {self.split} problem in 100000 tries; "
                           "the problem space is too small for this split")

    def _distinct_test_examples(self) -> list[Example]:
        rng = random.Random(f"{self.seed}/test")
        seen: set[str] = set()
        out: list[Example] = []
        tries = 0
        while len(out) < self.length:
            tries += 1
            if tries > 200 * self.length + 100_000:
                raise ValueError(
                    f"only {len(out)} distinct held-out problems found, {self.length} requested; "
                    "use a harder level or a smaller test split")
            key, ex = self.sample(rng)
            if key in seen or not is_held_out(key, self.test_permille):
                continue
            seen.add(key)
            out.append(_with_id(ex, f"test/{len(out)}", key))
        return out


def _with_id(ex: Example, ex_id: str, key: str) -> Example:
    return Example(ex_id, ex.prompt, ex.answer, ex.solution, {**ex.meta, "key": key})
