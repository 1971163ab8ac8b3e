"""LoRA adapters on the decoder's linear layers: a frozen base tree and a trainable adapter tree.

A targeted weight W [*in, *out] (our [in, out] layout) gains A [*in, r] and B [r, *out]:

    y = x @ W + s · (x @ A) @ B,    s = α / r    (Hu et al. 2021; PEFT's `LoraLayer`)

A is drawn as PEFT draws it (Kaiming-uniform, bound 1/sqrt(fan_in)); B starts at zero, so a
fresh adapter is the base model exactly. The adapter tree mirrors the weight tree
(`{"layers": {"wq": {"a": [L, d, r], "b": [L, r, n, h]}, ...}}`), stacked on the same
leading layer axis so the layer scan carries it, and declared once (`declare`) as the base
weights are (`params.py`): init, abstract shapes, shardings and the PEFT names derive from it.

Training sees `view(base, adapters)`: the weight tree with each targeted matrix replaced by
a `Lora` leaf, which `decoder.dense` applies unmerged; only `adapters` is an input of the
differentiated function, so neither the gradient nor the optimizer state ever has the
base's size. Sampling sees `merge(base, adapters)`: a plain weight tree (W + s A B, one
matmul per target per version), so the engine runs the model it always runs.

Bitwise at B = 0: `dense` adds s · (x @ A) @ B to x @ W after both are computed; with B = 0
that term is an exact zero, and y + 0 = y (tests/test_lora.py).

Legend: L layers, r rank, in / out a weight's input and output dims.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from locojax.model.config import LoraConfig, ModelConfig
from locojax.model.params import WeightDecl, Weights, declare as declare_base, is_decl

WEIGHT = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w_gate", "up": "w_up",
          "down": "w_down"}
"""A target's name (`LoraConfig.targets`) → its weight in the layer tree."""
INPUT_DIMS = {"wo": 2}
"""Input dims of a weight (after the layer axis) where more than one: wo is [n, h, d]."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Lora:
    """A targeted weight inside `view`: the frozen base `w` and its adapters, applied as
    x @ w + scale · (x @ a) @ b by `decoder.dense`. `scale` is static (part of the tree
    structure), so it is a constant of the compiled program, not a traced input."""

    w: jax.Array
    a: jax.Array
    b: jax.Array
    scale: float = dataclasses.field(metadata=dict(static=True))


def enabled(cfg: ModelConfig) -> bool:
    return cfg.lora is not None and cfg.lora.rank > 0


def declare(cfg: ModelConfig) -> dict:
    """The adapter tree of `cfg` (which must have `cfg.lora`), as WeightDecls. `hf_name` is
    the tensor's name in PEFT's `adapter_model.safetensors`; `to_hf` its [r, in] or
    [out, r] layout there (PEFT's `lora_A.weight`, `lora_B.weight`)."""
    lcfg, base = cfg.lora, declare_base(cfg)["layers"]
    r, out = lcfg.rank, {}
    for target in lcfg.targets:
        name = WEIGHT[target]
        w = base[name]
        k = INPUT_DIMS.get(name, 1)
        ins, outs = w.shape[1:1 + k], w.shape[1 + k:]
        n_in, n_out = int(np.prod(ins)), int(np.prod(outs))
        peft = "base_model.model." + w.hf_name.removesuffix(".weight")
        out[name] = {
            "a": WeightDecl((w.shape[0], *ins, r), ("layers", *w.axes[1:1 + k], None),
                            "lora_a", peft + ".lora_A.weight",
                            from_hf=lambda x, ins=ins: x.T.reshape(*ins, r),
                            to_hf=lambda x, n_in=n_in: x.reshape(n_in, r).T),
            "b": WeightDecl((w.shape[0], r, *outs), ("layers", None, *w.axes[1 + k:]),
                            "zeros", peft + ".lora_B.weight",
                            from_hf=lambda x, outs=outs: x.T.reshape(r, *outs),
                            to_hf=lambda x, n_out=n_out: x.reshape(r, n_out).T),
        }
    return {"layers": out}


def num_trainable(cfg: ModelConfig) -> int:
    """Parameters the optimizer trains: the adapters' under LoRA, else every weight's."""
    if not enabled(cfg):
        return cfg.num_params()
    return int(sum(np.prod(d.shape) for d in jax.tree.leaves(declare(cfg), is_leaf=is_decl)))


def trainable_declare(cfg: ModelConfig) -> dict:
    """What the optimizer trains: the adapters under LoRA, else every weight."""
    return declare(cfg) if enabled(cfg) else declare_base(cfg)


def abstract(cfg: ModelConfig) -> Weights:
    """ShapeDtypeStructs of the adapters: always f32 (f64 under an f64 model), whatever the
    base's dtype, so the optimizer's moments and updates keep their precision."""
    dtype = jnp.promote_types(cfg.weight_dtype, jnp.float32)
    return jax.tree.map(lambda d: jax.ShapeDtypeStruct(d.shape, dtype), declare(cfg),
                        is_leaf=is_decl)


def init(cfg: ModelConfig, key: jax.Array) -> Weights:
    """Fresh adapters: A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) per layer (PEFT's default,
    `kaiming_uniform_(a=sqrt(5))`), B = 0."""
    decls, treedef = jax.tree.flatten(declare(cfg), is_leaf=is_decl)
    dtype = jnp.promote_types(cfg.weight_dtype, jnp.float32)

    def one(d: WeightDecl, key):
        if d.init == "zeros":
            return jnp.zeros(d.shape, dtype)
        bound = 1.0 / np.sqrt(np.prod(d.shape[1:-1]))  # fan_in: the dims A contracts
        return jax.random.uniform(key, d.shape, dtype, -bound, bound)

    keys = jax.random.split(key, len(decls))
    return jax.tree.unflatten(treedef, [one(d, k) for d, k in zip(decls, keys)])


def base_copy(cfg: ModelConfig, weights: Weights) -> Weights:
    """The frozen base as LoRA stores it: `weights` in `LoraConfig.base_dtype`."""
    dtype = jnp.dtype(cfg.lora.base_dtype)
    return jax.tree.map(lambda w: w if w.dtype == dtype else w.astype(dtype), weights)


def view(base: Weights, adapters: Weights, cfg: ModelConfig) -> Weights:
    """The weight tree the forward reads: `base` with each adapted matrix a `Lora` leaf."""
    scale = cfg.lora.scale
    layers = dict(base["layers"])
    for name, ab in adapters["layers"].items():
        layers[name] = Lora(layers[name], ab["a"], ab["b"], scale)
    return {**base, "layers": layers}


def delta(a: jax.Array, b: jax.Array, scale: float, k: int) -> jax.Array:
    """s · A @ B, [L, *in, *out], for stacked A [L, *in, r] and B [L, r, *out] (`k` input
    dims), computed in the adapters' dtype."""
    lead = a.shape[:1 + k]
    a2 = a.reshape(a.shape[0], -1, a.shape[-1])  # [L, IN, r]
    b2 = b.reshape(b.shape[0], b.shape[1], -1)  # [L, r, OUT]
    return (scale * jnp.einsum("lir,lro->lio", a2, b2)).reshape(*lead, *b.shape[2:])


def merge(base: Weights, adapters: Weights, cfg: ModelConfig) -> Weights:
    """A plain weight tree, W + s · A B for each adapted matrix (the sum in the adapters'
    f32), every leaf in the model's weight dtype as an untouched model's: what the engine
    samples from (one version's copy; its `--rollout.weights-dtype` copy is made from it)."""
    scale, dtype = cfg.lora.scale, cfg.weight_dtype
    out = jax.tree.map(lambda w: w.astype(dtype), base)
    for name, ab in adapters["layers"].items():
        d = delta(ab["a"], ab["b"], scale, INPUT_DIMS.get(name, 1))
        out["layers"][name] = (base["layers"][name].astype(d.dtype) + d).astype(dtype)
    return out


merge_jit = jax.jit(merge, static_argnames=("cfg",))
"""`merge` as one program: per version, the rollout side's one extra matmul per target."""


def describe(cfg: ModelConfig, rollout_dtype=None) -> str:
    """The memory plan's LoRA line: what trains, what is frozen, what the sampler reads."""
    lcfg = cfg.lora
    copy = f"its {jnp.dtype(rollout_dtype).name} rollout copy" if rollout_dtype is not None \
        else f"a {jnp.dtype(cfg.weight_dtype).name} copy"
    return (f"  lora             rank {lcfg.rank} (alpha {lcfg.alpha:g}) on "
            f"{' '.join(lcfg.targets)}: {num_trainable(cfg):,} parameters train (f32); the "
            f"base's {cfg.num_params():,} are frozen ({lcfg.base_dtype}); the sampler reads "
            f"them merged per version into {copy}")


def policy(base: Weights | None, params: Weights, cfg: ModelConfig) -> Weights:
    """The forward's weights of a train state's (frozen, params): the LoRA view, or `params`
    themselves when nothing is frozen."""
    return params if base is None else view(base, params, cfg)
