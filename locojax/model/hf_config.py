"""HF `config.json` ↔ `ModelConfig`, for Qwen3 checkpoints.

Reads both spellings transformers has used:
- transformers 4: top-level `rope_theta`, optional `rope_scaling`, `torch_dtype`;
- transformers 5: `rope_parameters: {"rope_theta": ..., "rope_type": "default"}`, `dtype`.

Anything the locojax forward does not implement (another architecture, RoPE scaling, q/k/v
biases, sliding-window layers, another activation) is rejected here with the offending key,
rather than loading into a model that silently computes something else.

Missing optional keys take the defaults of HF `Qwen3Config` (not of `ModelConfig`), because
that is what transformers would run: e.g. an absent `tie_word_embeddings` means untied.

Reference: transformers `configuration_qwen3.py` (4.5x and 5.x), `modeling_rope_utils.py`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from locojax.jsonfile import read_object
from locojax.model.config import ModelConfig

CONFIG_NAME = "config.json"

# HF Qwen3Config defaults for the keys a checkpoint may leave out.
_HF_DEFAULTS = dict(
    head_dim=128, rope_theta=10_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
    max_position_embeddings=32768,
)
# Keys without which a config.json does not describe a model we could check against.
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads")
# Checkpoint dtypes we read, and the param dtype each loads as by default (ModelConfig has
# no float16, and f16 → f32 is exact).
_PARAM_DTYPE_FOR = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}


def _fail(source: str, msg: str):
    raise ValueError(f"{source}: {msg}")


def _rope_theta(d: dict, source: str) -> float:
    """RoPE base from either spelling; any scaling other than 'default' is unsupported."""
    params = d.get("rope_parameters")
    scaling = d.get("rope_scaling")
    for key, rp in (("rope_parameters", params), ("rope_scaling", scaling)):
        if rp is None:
            continue
        if not isinstance(rp, dict):
            _fail(source, f"{key} must be an object, got {rp!r}")
        kind = rp.get("rope_type", rp.get("type", "default"))
        if kind != "default":
            _fail(source, f"{key}.rope_type={kind!r} is not supported (only 'default' RoPE)")
    if params is not None and "rope_theta" in params:
        theta = params["rope_theta"]
        if "rope_theta" in d and float(d["rope_theta"]) != float(theta):
            _fail(source, f"rope_theta={d['rope_theta']} disagrees with "
                          f"rope_parameters.rope_theta={theta}")
        return float(theta)
    return float(d.get("rope_theta", _HF_DEFAULTS["rope_theta"]))


def _check_attention(d: dict, source: str, num_layers: int):
    if d.get("attention_bias", False):
        _fail(source, "attention_bias=true is not supported (Qwen3 has no q/k/v/o biases)")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        _fail(source, f"hidden_act={act!r} is not supported (only 'silu')")
    layer_types = d.get("layer_types")
    if layer_types is None and d.get("use_sliding_window") and d.get("sliding_window"):
        # transformers' own rule for configs without layer_types.
        first = int(d.get("max_window_layers", 28))
        layer_types = ["sliding_attention" if i >= first else "full_attention"
                       for i in range(num_layers)]
    for i, kind in enumerate(layer_types or ()):
        if kind != "full_attention":
            _fail(source, f"layer {i} uses {kind!r} (sliding window); only full attention "
                          "is supported")


def checkpoint_dtype(d: dict, source: str = CONFIG_NAME) -> str:
    """The weights' dtype named by a config dict (`dtype`, else `torch_dtype`, else float32)."""
    name = d.get("dtype", d.get("torch_dtype")) or "float32"
    name = str(name).removeprefix("torch.")
    if name not in _PARAM_DTYPE_FOR:
        _fail(source, f"dtype={name!r} is not supported (float32, bfloat16, float16)")
    return name


def config_from_dict(d: dict, source: str = CONFIG_NAME, **overrides) -> ModelConfig:
    """ModelConfig from a parsed config.json. `overrides` replace fields afterwards (e.g.
    `compute_dtype="bfloat16"`); `param_dtype` defaults to the checkpoint's dtype."""
    model_type = d.get("model_type")
    if model_type != "qwen3":
        _fail(source, f"model_type={model_type!r} is not supported (only 'qwen3')")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        _fail(source, f"missing required key(s) {missing}")
    num_layers = int(d["num_hidden_layers"])
    _check_attention(d, source, num_layers)
    heads = int(d["num_attention_heads"])
    kv_heads = d.get("num_key_value_heads")
    fields = dict(
        vocab_size=int(d["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads if kv_heads is None else int(kv_heads),
        head_dim=int(d.get("head_dim") or _HF_DEFAULTS["head_dim"]),
        rope_theta=_rope_theta(d, source),
        rms_norm_eps=float(d.get("rms_norm_eps", _HF_DEFAULTS["rms_norm_eps"])),
        tie_word_embeddings=bool(d.get("tie_word_embeddings",
                                       _HF_DEFAULTS["tie_word_embeddings"])),
        max_position_embeddings=int(d.get("max_position_embeddings",
                                          _HF_DEFAULTS["max_position_embeddings"])),
        param_dtype=_PARAM_DTYPE_FOR[checkpoint_dtype(d, source)],
    )
    unknown = set(overrides) - {f.name for f in dataclasses.fields(ModelConfig)}
    if unknown:
        raise TypeError(f"unknown ModelConfig field(s) {sorted(unknown)}")
    fields.update(overrides)
    try:
        return ModelConfig(**fields)
    except ValueError as e:
        _fail(source, str(e))


def load_config(model_dir: str | Path, **overrides) -> ModelConfig:
    """Parse `model_dir/config.json` (transformers 4 or 5 form) into a ModelConfig."""
    path = Path(model_dir) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {model_dir}")
    return config_from_dict(read_object(path), str(path), **overrides)


def config_to_dict(cfg: ModelConfig, dtype: str | None = None, **extra) -> dict:
    """A config.json dict that transformers 4 and 5 both load as this model.

    RoPE and dtype are written in both spellings: transformers 5 reads `rope_parameters`
    and `dtype`, transformers 4 reads `rope_theta` and `torch_dtype` and ignores the rest.
    `extra` adds keys such as `eos_token_id`.
    """
    dtype = dtype or cfg.param_dtype
    if dtype not in _PARAM_DTYPE_FOR:
        raise ValueError(f"dtype={dtype!r} is not supported (float32, bfloat16, float16)")
    d = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.num_hidden_layers,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    d.update(extra)
    return d


def save_config(cfg: ModelConfig, model_dir: str | Path, dtype: str | None = None,
                **extra) -> Path:
    """Write `model_dir/config.json` (see `config_to_dict`); returns its path."""
    path = Path(model_dir) / CONFIG_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(config_to_dict(cfg, dtype, **extra), f, indent=2, sort_keys=True)
        f.write("\n")
    return path
