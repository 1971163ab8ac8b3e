"""A generate in waves: B prompts as `waves` plain generates of B / waves prompts, one after
another (`Engine(waves=k)`; the memory plan chooses k when a rollout does not fit).

Why: a generate's KV cache is rows x slots, and remat, micro-batches and offloading change
nothing of it. On one TPU v5e (2026-12-06) Qwen3-0.6B's generate of 128 rows x (256 + 512)
tokens asked XLA for 19.2 GB of temporaries beside 2.4 GB of weights, more than the chip's
15.75 GB. Each wave's cache goes back to the engine when the wave ends and is the next
wave's buffer (`Engine._buffer`), so one wave's cache lives at a time.

Exactness: row r of the batch keeps its global id (`first_row`), so its c-th token is drawn
with the uniform of `fold_in(fold_in(key, row_id), c)` in whichever wave it runs: greedy
and sampled tokens are the one-batch generate's wherever the logits round the same. Not
bitwise: a wave is a smaller batch, another XLA program (as compaction's smaller batches
are, docs/design.md). The prefill phase times the first wave's prefill; the later waves'
prefills run inside decode.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass
class Waves:
    """A generate in waves waiting for `Engine.decode`: the first wave prefilled, the later
    ones' prompts (tokens, mask, first row, limits) prefilled each as the one before ends."""

    first: object  # the first wave's `engine.Pending`
    rest: list[tuple[np.ndarray, np.ndarray, int, np.ndarray | None]]
    weights: object
    key: jax.Array
    sampling: object
    num_samples: int

    @property
    def prefilled(self):
        """What a caller blocks on to time prefill (`Pending.prefilled`): the first wave's."""
        return self.first.prefilled


def split(engine, prompts: int) -> bool:
    """Whether `engine` generates `prompts` prompts in waves: only when they divide evenly,
    so every wave is one compiled shape (the memory plan compiles exactly that one)."""
    k = engine.waves
    return k > 1 and prompts >= k and prompts % k == 0


def start(engine, weights, tokens: np.ndarray, mask: np.ndarray, key: jax.Array, sampling,
          num_samples: int, first_row: int, limits) -> Waves:
    """Prefill the first wave; the rest wait in the returned `Waves`."""
    per = tokens.shape[0] // engine.waves
    rows = per * num_samples
    parts = [(tokens[i * per:(i + 1) * per], mask[i * per:(i + 1) * per], first_row + i * rows,
              None if limits is None else limits[i * rows:(i + 1) * rows])
             for i in range(engine.waves)]
    t, m, f, lim = parts[0]
    first = engine.prefill_whole(weights, t, m, key, sampling, num_samples, f, lim)
    return Waves(first, parts[1:], weights, key, sampling, num_samples)


def run(engine, w: Waves) -> tuple:
    """Decode every wave in turn: the fields of one `Generation` (rows in the batch's order;
    `steps`: the decode steps of all waves together, what the chip ran)."""
    gens = [engine.decode(w.first)]
    for t, m, f, lim in w.rest:
        gens.append(engine.decode(engine.prefill_whole(w.weights, t, m, w.key, w.sampling,
                                                       w.num_samples, f, lim)))
    fields = [jnp.concatenate([getattr(g, name) for g in gens])
              for name in ("tokens", "mask", "logprobs", "lengths")]
    return (*fields, sum(g.steps for g in gens))
