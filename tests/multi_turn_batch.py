"""A multi-turn version of any training batch: part of each response becomes environment
tokens (tool output), which are context: attended to, never targets.

Shared by test_multi_turn_loss.py and the multi-turn case of test_layout_invariance.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def env_spans(loss_mask: np.ndarray) -> np.ndarray:
    """[B, T] bool: for each row with ≥ 4 response tokens, one run of its response tokens
    (from its 2nd, a third of them, at least one) and, for rows with ≥ 8, also its
    second-to-last token: observations inside the response, as between model turns."""
    env = np.zeros(loss_mask.shape, bool)
    for b, row in enumerate(np.asarray(loss_mask, bool)):
        cols = np.flatnonzero(row)
        if len(cols) >= 4:
            env[b, cols[1:1 + max(1, len(cols) // 3)]] = True
        if len(cols) >= 8:
            env[b, cols[-2]] = True
    return env


def to_multi_turn(batch):
    """`batch` with `env_spans` of its responses turned into environment tokens: the loss
    mask drops them and their behaviour logprobs are 0 (the sampler never scored them);
    tokens, positions and the attention mask are unchanged."""
    loss = np.asarray(batch.loss_mask, bool)
    env = env_spans(loss)
    old = np.asarray(batch.old_logprobs)
    old = np.where(env, 0.0, old).astype(old.dtype)
    return dataclasses.replace(batch, loss_mask=loss & ~env, old_logprobs=old)


def compact_rows(values: np.ndarray, mask: np.ndarray, width: int) -> np.ndarray:
    """[B, width]: each row's masked entries, in order, left-aligned (zeros after)."""
    out = np.zeros((values.shape[0], width) + values.shape[2:], values.dtype)
    for b in range(values.shape[0]):
        v = values[b][np.asarray(mask[b], bool)]
        out[b, :len(v)] = v
    return out
