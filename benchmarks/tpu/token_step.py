"""What a decode token step must read, the floor its time is judged against: shared by the
chip's decode probes (decode_blocks.py, decode_profile.py)."""

from __future__ import annotations

import jax


def step_bytes(cfg, weights, rows: int, slots: int, cache_itemsize: int = 2) -> int:
    """A token step's least bytes: every weight once (in its own dtype), and the K and V of
    `slots` written slots of `rows` rows in a cache of `cache_itemsize`-byte elements."""
    w = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(weights))
    kv = (2 * cfg.num_hidden_layers * rows * cfg.num_key_value_heads * cfg.head_dim * slots
          * cache_itemsize)
    return w + kv
