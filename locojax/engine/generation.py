"""What a generate hands its caller: the `Generation` it returns, and the `Pending` handle
between its prefill and its decode (split from `engine.py`, which re-exports both)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from locojax.engine.decode import Turn
from locojax.engine.sampling import SamplingConfig
from locojax.model import decoder
from locojax.model.params import Weights


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Generation:
    """What one `generate` call returns (rows prompt-major: row r is prompt r // G)."""

    tokens: jax.Array  # [R, N] int32; pad_token_id after a row stopped
    mask: jax.Array  # [R, N] bool; True for generated tokens, the stop token included
    logprobs: jax.Array  # [R, N] f32; log π(token), π the τ-scaled untruncated policy; 0 on pad
    lengths: jax.Array  # [R] int32; number of True in mask
    steps: jax.Array  # [] int32; decode steps run after prefill (early exit makes it < N - 1)


@jax.jit
def generation_jit(turn: Turn, order, out) -> Generation:
    """A finished single-turn `Turn` as the `Generation` it returns (one small program);
    order, out: as `compact` gives them, or None if no row was compacted out."""
    tokens, logprobs, length = turn.tokens, turn.logprobs, turn.length
    if out is not None:
        tokens, logprobs, length = (o.at[order].set(x) for o, x in
                                    zip(out, (tokens, logprobs, length)))
    mask = jnp.arange(tokens.shape[1])[None, :] < length[:, None]
    return Generation(tokens, mask, logprobs, length, turn.step - 1)


def without_cache(turn: Turn) -> tuple[decoder.KVCache, Turn]:
    """The cache, and `turn` with its cache taken out: `decode_jit`'s two arguments."""
    return turn.cache, dataclasses.replace(turn, cache=None)


@dataclasses.dataclass
class Pending:
    """A prefilled batch waiting for `Engine.decode` (host-side handle, decoded once)."""

    weights: Weights
    prefilled: Turn | None
    sampling: SamplingConfig
