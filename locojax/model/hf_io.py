"""HF Qwen3 tensors ↔ locojax weights, driven by the declarations in `params.py`.

This module holds the in-memory conversion (a dict of numpy tensors keyed by HF name).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from locojax.model.config import ModelConfig
from locojax.model.params import WeightDecl, Weights, declare, is_decl


def _hf_names(w: WeightDecl, cfg: ModelConfig) -> list[str]:
    if w.stacked:
        return [w.hf_name.format(i=i) for i in range(cfg.num_hidden_layers)]
    return [w.hf_name]


def from_state_dict(state: dict[str, np.ndarray], cfg: ModelConfig) -> Weights:
    """Weights from an HF state dict of numpy arrays (e.g. `{k: v.numpy() for k, v in sd}`)."""

    def one(w: WeightDecl):
        parts = [w.from_hf(np.asarray(state[name])) for name in _hf_names(w, cfg)]
        arr = np.stack(parts) if w.stacked else parts[0]
        return jnp.asarray(arr, cfg.weight_dtype)

    return jax.tree.map(one, declare(cfg), is_leaf=is_decl)


def to_state_dict(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """HF-named numpy tensors from weights (the inverse of `from_state_dict`)."""
    out = {}
    decls = jax.tree.leaves(declare(cfg), is_leaf=is_decl)
    for w, arr in zip(decls, jax.tree.leaves(weights)):
        arr = np.asarray(arr)
        for i, name in enumerate(_hf_names(w, cfg)):
            out[name] = np.ascontiguousarray(w.to_hf(arr[i] if w.stacked else arr))
    return out
