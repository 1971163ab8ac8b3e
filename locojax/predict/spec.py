"""Which model to cost: a shipped config name, a preset, a checkpoint directory or a
`config.json`, read into a `ModelConfig` for its shapes only.

Any dense decoder whose layer is attention (GQA) plus a gated three-matrix MLP is costed:
the families locojax runs (`locojax/model/families.py`) and others of the same layer
(Mistral, ...) as a plain (Llama) layer. Nothing runs, so what `hf_config.py` refuses for
the forward (another `model_type`, a RoPE scaling, biases) is accepted where it changes a
FLOP count by at most a bias add; what would change the count unseen is refused, naming the
field: mixture-of-experts, a non-gated MLP, a layer other than full or sliding-window.
Sliding windows: a layer is local as HF decides (`hf_config.layer_kinds`); outside the
families, Mistral's bare `sliding_window` makes every layer local.
"""

from __future__ import annotations

import json
from pathlib import Path

from locojax.model import config as model_config
from locojax.model.config import FULL, SLIDING, ModelConfig
from locojax.model.families import FAMILIES
from locojax.model.hf_config import layer_kinds
from locojax.model.loader import EMBEDDED  # `--model` names of the shipped checkpoints

MODELS_DIR = Path(__file__).parent / "models"

_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "vocab_size")
# Fields whose presence (non-empty, non-zero) means the FLOPs per token are not a dense
# decoder's: experts route each token through a subset of MLPs.
_MOE = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size",
        "num_experts_per_tok")
_GATED_ACTS = ("silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new")
_PLAIN = "llama"  # the family a dense decoder outside FAMILIES is costed as


class UncostableModel(ValueError):
    """The config describes a model the cost model cannot cost; the message names the field."""


def shipped() -> list[str]:
    """Names `--model` accepts without a path: shipped configs, presets, embedded checkpoints."""
    return sorted([p.stem for p in MODELS_DIR.glob("*.json")] + list(model_config.PRESETS)
                  + list(EMBEDDED))


def _layer_types(d: dict, family: str, layers: int, source: str) -> tuple[str, ...] | None:
    """Per-layer attention kinds as HF decides them (module docstring); None: all full."""
    window = d.get("sliding_window")
    defaults = FAMILIES[family].hf_defaults
    kinds = tuple(layer_kinds(d, defaults, layers, bare_window=family == _PLAIN))
    if kinds and len(kinds) != layers:
        raise UncostableModel(f"{source}: cannot cost field layer_types: {len(kinds)} entries "
                              f"for {layers} layers")
    for i, kind in enumerate(kinds):
        if kind not in (FULL, SLIDING):
            raise UncostableModel(f"{source}: cannot cost field layer_types[{i}]={kind!r}: only "
                                  f"{FULL!r} and {SLIDING!r} layers are costed")
    if SLIDING not in kinds:
        return None
    if not (window or defaults.get("sliding_window")):
        raise UncostableModel(f"{source}: cannot cost field sliding_window={window!r}: "
                              "sliding-attention layers need a window")
    return kinds


def from_dict(d: dict, source: str = "config.json") -> ModelConfig:
    """A `ModelConfig` with the shapes of the config dict, or `UncostableModel` naming the
    field that stops it."""
    def refuse(field: str, why: str):
        raise UncostableModel(f"{source}: cannot cost field {field}={d.get(field)!r}: {why}")

    for field in _REQUIRED:
        if field not in d:
            raise UncostableModel(f"{source}: cannot cost without field {field!r} (needed: "
                                  f"{', '.join(_REQUIRED)})")
    for field in _MOE:
        if d.get(field):
            refuse(field, "mixture-of-experts; the cost model counts dense decoders only")
    family = d.get("model_type") if d.get("model_type") in FAMILIES else _PLAIN
    defaults = FAMILIES[family].hf_defaults
    act = d.get("hidden_act", d.get("hidden_activation", "silu"))
    if act not in _GATED_ACTS:
        refuse("hidden_act" if "hidden_act" in d else "hidden_activation",
               f"the MLP is costed as gated with three matrices ({', '.join(_GATED_ACTS)})")
    heads = int(d["num_attention_heads"])
    kv = int(d.get("num_key_value_heads") or heads)
    if heads % kv:
        refuse("num_key_value_heads", f"{heads} query heads do not share {kv} kv heads evenly")
    layers = int(d["num_hidden_layers"])
    kinds = _layer_types(d, family, layers, source)
    head_dim = d.get("head_dim") or defaults["head_dim"] or int(d["hidden_size"]) // heads
    dtype = str(d.get("torch_dtype", d.get("dtype")) or "bfloat16").removeprefix("torch.")
    dtype = dtype if dtype in ("float32", "bfloat16") else "float32"
    return ModelConfig(
        model_type=family, vocab_size=int(d["vocab_size"]), hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]), num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=int(head_dim),
        layer_types=kinds,
        sliding_window=int(d.get("sliding_window") or defaults.get("sliding_window") or 0)
        if kinds else None,
        tie_word_embeddings=bool(d.get("tie_word_embeddings",
                                       defaults["tie_word_embeddings"])),
        param_dtype=dtype, compute_dtype=dtype)


def load(name: str) -> tuple[ModelConfig, str]:
    """(config, what it was read from) for a `--model` value: a shipped config name
    (`qwen3-0.6b`), a preset (`tiny`, `small`), an embedded checkpoint name, a directory
    holding `config.json`, or a `.json` file."""
    if name in model_config.PRESETS:
        return model_config.PRESETS[name](), f"preset {name} (locojax.model.config)"
    path = Path(name)
    if name in EMBEDDED:
        path = EMBEDDED[name]
    elif (MODELS_DIR / f"{name}.json").is_file():
        path = MODELS_DIR / f"{name}.json"
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UncostableModel(f"model {name!r} is neither a shipped config, a preset nor a "
                              f"directory or file with a config.json; shipped: "
                              f"{', '.join(shipped())}")
    with open(path) as f:
        return from_dict(json.load(f), str(path)), str(path)
