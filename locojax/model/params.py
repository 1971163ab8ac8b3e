"""Every decoder weight of every family, declared once.

A `WeightDecl` gives a weight's shape, logical axes, init and its HF tensor name and layout.
Init, abstract shapes, shardings (`sharding.py`) and the HF loader/saver (`hf_io.py`) all
derive from `declare(cfg)`, so adding a weight means touching only this file.

Layers are stacked on a leading `layers` axis so the forward can `lax.scan` over them:
compile time then does not grow with depth (28 layers in Qwen3-0.6B).

Legend: L layers, d model, n q heads, k kv heads, h head dim, f ffn, v vocab.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from locojax.model.config import ModelConfig

Weights = dict  # nested dict of arrays; see `declare` for the tree


@dataclasses.dataclass(frozen=True)
class WeightDecl:
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    """Logical axis per dimension; `sharding.py` maps them onto mesh axes per role."""
    init: str
    """"normal" (std 0.02, HF initializer_range: matrices, decayed), "ones" (norm scales)
    or "zeros" (biases, and Gemma's norm scales, which are offsets from 1)."""
    hf_name: str
    """HF tensor name; `{i}` is the layer index for stacked weights."""
    from_hf: Callable[[np.ndarray], np.ndarray] = lambda x: x
    """HF (torch, [out, in]) layout of one layer → locojax layout of one layer."""
    to_hf: Callable[[np.ndarray], np.ndarray] = lambda x: x
    """Inverse of `from_hf`; exact (only reshapes and transposes)."""

    @property
    def stacked(self) -> bool:
        return "{i}" in self.hf_name


# nn.Linear stores [out, in]; we store [in, out] so activations contract on the left.
_TRANSPOSED = dict(from_hf=lambda x: x.T, to_hf=lambda x: x.T)


def declare(cfg: ModelConfig) -> dict:
    """The weight tree of `cfg`, as WeightDecls. Same structure as the weights themselves.

    The family (`cfg.family`) adds q/k/v biases, q/k norms, or Gemma's four norms per layer;
    HF names the norm before the MLP `post_attention_layernorm`, except in Gemma 3, where
    that is the norm after attention and the one before the MLP is `pre_feedforward_...`.
    """
    L, d, n, k, h, f, v = (
        cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
        cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size,
    )
    fam = cfg.family
    p = "model.layers.{i}."
    norm_init = "zeros" if fam.unit_offset_norm else "ones"

    def heads_in(heads):  # [heads*h, d] -> [d, heads, h]
        return dict(
            from_hf=lambda x: x.reshape(heads, h, d).transpose(2, 0, 1),
            to_hf=lambda x: x.transpose(1, 2, 0).reshape(heads * h, d),
        )

    def norm(width, name):
        return WeightDecl((L, width), ("layers", "norm"), norm_init, p + name + ".weight")

    def bias(heads, axis, name):  # [heads*h] -> [heads, h]
        return WeightDecl((L, heads, h), ("layers", axis, "head_dim"), "zeros",
                          p + f"self_attn.{name}.bias",
                          from_hf=lambda x: x.reshape(heads, h), to_hf=lambda x: x.reshape(-1))

    layers = {
        "attn_norm": norm(d, "input_layernorm"),
        "wq": WeightDecl((L, d, n, h), ("layers", "embed", "q_heads", "head_dim"), "normal",
                         p + "self_attn.q_proj.weight", **heads_in(n)),
        "wk": WeightDecl((L, d, k, h), ("layers", "embed", "kv_heads", "head_dim"), "normal",
                         p + "self_attn.k_proj.weight", **heads_in(k)),
        "wv": WeightDecl((L, d, k, h), ("layers", "embed", "kv_heads", "head_dim"), "normal",
                         p + "self_attn.v_proj.weight", **heads_in(k)),
    }
    if fam.qkv_bias:
        layers.update(bq=bias(n, "q_heads", "q_proj"), bk=bias(k, "kv_heads", "k_proj"),
                      bv=bias(k, "kv_heads", "v_proj"))
    if fam.qk_norm:
        layers.update(q_norm=norm(h, "self_attn.q_norm"), k_norm=norm(h, "self_attn.k_norm"))
    # o_proj is [d, n*h] in HF; ours is [n, h, d].
    layers["wo"] = WeightDecl((L, n, h, d), ("layers", "q_heads", "head_dim", "embed"), "normal",
                              p + "self_attn.o_proj.weight",
                              from_hf=lambda x: x.reshape(d, n, h).transpose(1, 2, 0),
                              to_hf=lambda x: x.transpose(2, 0, 1).reshape(d, n * h))
    if fam.sandwich_norms:
        layers.update(attn_out_norm=norm(d, "post_attention_layernorm"),
                      mlp_norm=norm(d, "pre_feedforward_layernorm"),
                      mlp_out_norm=norm(d, "post_feedforward_layernorm"))
    else:
        layers["mlp_norm"] = norm(d, "post_attention_layernorm")
    layers.update(
        w_gate=WeightDecl((L, d, f), ("layers", "embed", "mlp"), "normal",
                          p + "mlp.gate_proj.weight", **_TRANSPOSED),
        w_up=WeightDecl((L, d, f), ("layers", "embed", "mlp"), "normal",
                        p + "mlp.up_proj.weight", **_TRANSPOSED),
        w_down=WeightDecl((L, f, d), ("layers", "mlp", "embed"), "normal",
                          p + "mlp.down_proj.weight", **_TRANSPOSED),
    )
    tree = {
        "embed": WeightDecl((v, d), ("vocab", "embed"), "normal", "model.embed_tokens.weight"),
        "layers": layers,
        "final_norm": WeightDecl((d,), ("norm",), norm_init, "model.norm.weight"),
    }
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = WeightDecl((d, v), ("embed", "vocab"), "normal", "lm_head.weight",
                                     **_TRANSPOSED)
    return tree


def is_decl(x) -> bool:
    return isinstance(x, WeightDecl)


def abstract(cfg: ModelConfig) -> Weights:
    """ShapeDtypeStructs of the weights, for eval_shape-free planning and sharding."""
    return jax.tree.map(lambda w: jax.ShapeDtypeStruct(w.shape, cfg.weight_dtype),
                        declare(cfg), is_leaf=is_decl)


def init(cfg: ModelConfig, key: jax.Array) -> Weights:
    """Random weights: N(0, 0.02) matrices, unit norm scales, zero biases (as HF
    `_init_weights`; Gemma's norm scales are 0, i.e. unit)."""
    decls, treedef = jax.tree.flatten(declare(cfg), is_leaf=is_decl)
    keys = jax.random.split(key, len(decls))

    def one(w: WeightDecl, key):
        if w.init != "normal":
            return jnp.full(w.shape, w.init == "ones", cfg.weight_dtype)
        return (0.02 * jax.random.normal(key, w.shape, jnp.float32)).astype(cfg.weight_dtype)

    return jax.tree.unflatten(treedef, [one(w, k) for w, k in zip(decls, keys)])
