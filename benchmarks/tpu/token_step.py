"""What the chip's decode probes (decode_blocks.py, decode_profile.py, decode_parts.py) share:
the random decoder of a published config they decode with, what its token step must read,
the floor its time is judged against, and the decode knobs an arm sets."""

from __future__ import annotations

import json
from pathlib import Path

import jax

from benchmarks.tpu import random_model
from locojax.model import attention, params
from locojax.model.hf_config import config_from_dict

DTYPES = {"bf16": "bfloat16", "f32": "float32"}
DEFAULT_KNOBS = {"DECODE_AS_DOTS": None, "HALF_AS_BITS": None, "DECODE_KERNEL": "xla"}
"""The `attention` module's decode knobs as the engine sets them: by backend."""
CPU_KNOBS = {**DEFAULT_KNOBS, **attention.decode_settings("no-dots,bits")}
"""XLA:CPU's settings of those knobs, on any backend."""


def set_knobs(knobs: dict) -> None:
    """Sets the `attention` module's decode knobs (an arm's settings)."""
    for knob, value in knobs.items():
        setattr(attention, knob, value)
    jax.clear_caches()  # the knobs are read at trace time: no program of another arm is reused


def random_decoder(config: str, toy: bool, precision: str = "bf16"):
    """(config, random weights) of a published config's JSON in `precision` (its compute and
    parameter dtype); `toy`: the chip scripts' tiny cut with a small vocabulary, for a CPU
    dry run."""
    d = json.loads(Path(config).read_text())
    if toy:
        d = {**d, **random_model.TINY, "vocab_size": 512}
    cfg = config_from_dict(d, param_dtype=DTYPES[precision], compute_dtype=DTYPES[precision])
    return cfg, jax.jit(lambda k: params.init(cfg, k))(jax.random.key(0))


def step_bytes(cfg, weights, rows: int, slots: int, cache_itemsize: int = 2) -> int:
    """A token step's least bytes: every weight once (in its own dtype), and the K and V of
    `slots` written slots of `rows` rows in a cache of `cache_itemsize`-byte elements."""
    w = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(weights))
    kv = (2 * cfg.num_hidden_layers * rows * cfg.num_key_value_heads * cfg.head_dim * slots
          * cache_itemsize)
    return w + kv
