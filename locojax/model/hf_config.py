"""HF `config.json` ↔ `ModelConfig`, for the families of `families.py`.

Reads both spellings transformers has used:
- transformers 4: top-level `rope_theta`, optional `rope_scaling`, `torch_dtype` (Gemma 3:
  `rope_local_base_freq`, `sliding_window_pattern`);
- transformers 5: `rope_parameters: {"rope_theta": ..., "rope_type": "default"}` (Gemma 3:
  one such dict per layer type), `layer_types`, `dtype`.

Anything the locojax forward does not implement (another architecture, a RoPE scaling other
than linear or llama3, biases the family does not have, sliding-window layers outside
Gemma 3, another activation, logit soft-capping) is rejected here with the offending key,
rather than loading into a model that silently computes something else.

Missing optional keys take the defaults of the family's HF config class (not of
`ModelConfig`), because that is what transformers would run: e.g. an absent
`tie_word_embeddings` means untied for Qwen and Llama, tied for Gemma 3.

Reference: transformers `configuration_{qwen3,qwen2,llama,gemma3}.py` (4.5x and 5.x),
`modeling_rope_utils.py`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from locojax.jsonfile import read_object
from locojax.model.config import FULL, SLIDING, ModelConfig, RopeScaling
from locojax.model.families import FAMILIES, Family

CONFIG_NAME = "config.json"

# Keys without which a config.json does not describe a model we could check against.
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads")
# Checkpoint dtypes we read, and the param dtype each loads as by default (ModelConfig has
# no float16, and f16 → f32 is exact).
_PARAM_DTYPE_FOR = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}
_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                 "original_max_position_embeddings")


def _fail(source: str, msg: str):
    raise ValueError(f"{source}: {msg}")


def _rope_entry(rp, key: str, source: str) -> tuple[float | None, RopeScaling | None]:
    """(rope_theta or None, scaling or None) of one `rope_parameters` / `rope_scaling` dict."""
    if rp is None:
        return None, None
    if not isinstance(rp, dict):
        _fail(source, f"{key} must be an object, got {rp!r}")
    kind = rp.get("rope_type", rp.get("type", "default"))
    theta = float(rp["rope_theta"]) if "rope_theta" in rp else None
    if kind == "default":
        return theta, None
    if kind not in ("linear", "llama3"):
        _fail(source, f"{key}.rope_type={kind!r} is not supported (default, linear, llama3)")
    need = _SCALING_KEYS if kind == "llama3" else _SCALING_KEYS[:1]
    missing = [k for k in need if k not in rp]
    if missing:
        _fail(source, f"{key} of rope_type {kind!r} lacks {missing}")
    values = {k: float(rp[k]) for k in need}
    if "original_max_position_embeddings" in values:  # a token count
        values["original_max_position_embeddings"] = int(rp["original_max_position_embeddings"])
    return theta, RopeScaling(kind, **values)


def _rope(d: dict, fam: Family, source: str) -> dict:
    """rope_theta, rope_scaling (and rope_local_theta for Gemma 3) from either spelling."""
    params = d.get("rope_parameters")
    local = None
    if fam.model_type == "gemma3_text" and isinstance(params, dict) and (
            FULL in params or SLIDING in params):
        local_theta, local_scaling = _rope_entry(params.get(SLIDING), f"rope_parameters."
                                                 f"{SLIDING}", source)
        if local_scaling is not None:
            _fail(source, f"rope_parameters.{SLIDING} is scaled; only the full-attention "
                          "layers' RoPE may be")
        local, params = local_theta, params.get(FULL)
        key = f"rope_parameters.{FULL}"
    else:
        key = "rope_parameters"
    theta, scaling = _rope_entry(params, key, source)
    old_theta, old_scaling = _rope_entry(d.get("rope_scaling"), "rope_scaling", source)
    if theta is not None and "rope_theta" in d and float(d["rope_theta"]) != theta:
        _fail(source, f"rope_theta={d['rope_theta']} disagrees with {key}.rope_theta={theta}")
    out = dict(rope_theta=theta or float(d.get("rope_theta", old_theta or
                                                fam.hf_defaults["rope_theta"])),
               rope_scaling=scaling or old_scaling)
    if "rope_local_base_freq" in fam.hf_defaults:
        out["rope_local_theta"] = float(local or d.get(
            "rope_local_base_freq", fam.hf_defaults["rope_local_base_freq"]))
    return out


def layer_kinds(d: dict, defaults: dict, num_layers: int, bare_window: bool = False) -> list:
    """Per-layer attention kinds as transformers decides them, unchecked ([]: all full):
    `layer_types`; else Gemma 3's `sliding_window_pattern` (every P-th layer global); else
    Qwen's `use_sliding_window` with `max_window_layers` (layers from that index on are
    local, transformers' own rule for Qwen configs without layer_types). `bare_window`: a
    `sliding_window` without `use_sliding_window` makes every layer local (Mistral's)."""
    kinds = d.get("layer_types")
    if kinds is None and "sliding_window_pattern" in defaults:
        every = int(d.get("sliding_window_pattern", defaults["sliding_window_pattern"]))
        kinds = [SLIDING if (i + 1) % every else FULL for i in range(num_layers)]
    elif kinds is None and d.get("sliding_window") and d.get("use_sliding_window", bare_window):
        first = int(d.get("max_window_layers", 0 if bare_window else 28))
        kinds = [SLIDING if i >= first else FULL for i in range(num_layers)]
    return list(kinds or ())


def _layer_types(d: dict, fam: Family, source: str, num_layers: int) -> tuple | None:
    """Per-layer attention kinds (`layer_kinds`), refused where the forward has no such
    layer; None when every layer is full."""
    kinds = layer_kinds(d, fam.hf_defaults, num_layers)
    if kinds and len(kinds) != num_layers:
        _fail(source, f"layer_types has {len(kinds)} entries for {num_layers} layers")
    for i, kind in enumerate(kinds):
        if kind not in (FULL, SLIDING):
            _fail(source, f"layer {i} uses {kind!r}; only {FULL!r} and {SLIDING!r} are "
                          "supported")
        if kind == SLIDING and "sliding_window_pattern" not in fam.hf_defaults:
            _fail(source, f"layer {i} uses {kind!r} (sliding window); only full attention "
                          f"is supported for model_type {fam.model_type!r}")
    return tuple(kinds) if SLIDING in kinds else None


def _check_features(d: dict, fam: Family, source: str):
    """Refuse what the family's forward does not compute."""
    if not fam.qkv_bias and d.get("attention_bias", False):
        _fail(source, f"attention_bias=true is not supported for model_type "
                      f"{fam.model_type!r} (no q/k/v/o biases)")
    if d.get("mlp_bias", False):
        _fail(source, "mlp_bias=true is not supported")
    act = d.get(fam.activation_key, fam.activation)
    if act != fam.activation:
        _fail(source, f"{fam.activation_key}={act!r} is not supported for model_type "
                      f"{fam.model_type!r} (only {fam.activation!r})")
    for key in ("attn_logit_softcapping", "final_logit_softcapping",
                "use_bidirectional_attention"):
        if d.get(key):
            _fail(source, f"{key}={d[key]!r} is not supported")


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
    fam = FAMILIES.get(model_type)
    if fam is None:
        _fail(source, f"model_type={model_type!r} is not supported ({', '.join(FAMILIES)})")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        _fail(source, f"missing required key(s) {missing}")
    defaults = fam.hf_defaults
    num_layers = int(d["num_hidden_layers"])
    _check_features(d, fam, source)
    layer_types = _layer_types(d, fam, source, num_layers)
    heads = int(d["num_attention_heads"])
    kv_heads = d.get("num_key_value_heads")
    fields = dict(
        model_type=model_type,
        vocab_size=int(d["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads if kv_heads is None else int(kv_heads),
        head_dim=int(d.get("head_dim") or defaults["head_dim"] or int(d["hidden_size"]) // heads),
        rms_norm_eps=float(d.get("rms_norm_eps", defaults["rms_norm_eps"])),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", defaults["tie_word_embeddings"])),
        max_position_embeddings=int(d.get("max_position_embeddings",
                                          defaults["max_position_embeddings"])),
        param_dtype=_PARAM_DTYPE_FOR[checkpoint_dtype(d, source)],
        layer_types=layer_types,
        **_rope(d, fam, source),
    )
    if layer_types is not None:
        fields["sliding_window"] = int(d.get("sliding_window") or defaults["sliding_window"])
    if "query_pre_attn_scalar" in defaults:
        fields["query_pre_attn_scalar"] = int(d.get("query_pre_attn_scalar",
                                                    defaults["query_pre_attn_scalar"]))
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


def _rope_dict(theta: float, scaling: RopeScaling | None) -> dict:
    """One transformers-5 `rope_parameters` entry."""
    if scaling is None:
        return {"rope_theta": theta, "rope_type": "default"}
    keys = _SCALING_KEYS if scaling.rope_type == "llama3" else _SCALING_KEYS[:1]
    return {"rope_theta": theta, "rope_type": scaling.rope_type,
            **{k: getattr(scaling, k) for k in keys}}


def config_to_dict(cfg: ModelConfig, dtype: str | None = None, **extra) -> dict:
    """A config.json dict that transformers 4 and 5 both load as this model.

    RoPE and dtype are written in both spellings: transformers 5 reads `rope_parameters`
    and `dtype`, transformers 4 reads `rope_theta` (`rope_local_base_freq`), `rope_scaling`
    and `torch_dtype`, and ignores the rest. `extra` adds keys such as `eos_token_id`.
    """
    dtype = dtype or cfg.param_dtype
    if dtype not in _PARAM_DTYPE_FOR:
        raise ValueError(f"dtype={dtype!r} is not supported (float32, bfloat16, float16)")
    fam = cfg.family
    rope = _rope_dict(cfg.rope_theta, cfg.rope_scaling)
    d = {
        "architectures": [fam.architecture],
        "model_type": fam.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        fam.activation_key: fam.activation,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None if cfg.rope_scaling is None else rope,
        "rope_parameters": rope,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_dropout": 0.0,
        "sliding_window": cfg.sliding_window,
        "layer_types": list(cfg.layer_types or [FULL] * cfg.num_hidden_layers),
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    if not fam.qkv_bias:
        d["attention_bias"] = False
    if fam.model_type == "llama":
        d["mlp_bias"] = False
    if fam.model_type in ("qwen3", "qwen2"):
        d.update(use_sliding_window=False, max_window_layers=cfg.num_hidden_layers)
    if fam.model_type == "gemma3_text":
        local = _rope_dict(cfg.rope_local_theta, None)
        d.update(rope_local_base_freq=cfg.rope_local_theta,
                 rope_parameters={FULL: rope, SLIDING: local},
                 query_pre_attn_scalar=cfg.query_pre_attn_scalar,
                 attn_logit_softcapping=None, final_logit_softcapping=None)
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
