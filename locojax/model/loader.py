"""From a model spec string to (config, weights, tokenizer): the one place that decides.

Specs:
- `embedded`: the tiny character-level checkpoint shipped inside the package (made by
  `locojax sft`, see README) that mostly answers in a format the strict reward rejects;
  `embedded-strict`: one that answers in the `#### N` format but has only half learned the
  arithmetic (the `demo` preset's: its gain is the task); `embedded-calc`: a sibling that
  learned calculator tool use (the `calc-demo` preset);
- `tiny` / `small`: DESIGN.md's benchmark shapes with random weights and the char tokenizer;
- a directory: an HF Qwen3 checkpoint. Its tokenizer is `tokenizer.json` if present, else the
  one named in `locojax.json` (written by `locojax sft` for char-level checkpoints).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

import jax

from locojax.model import config as model_config
from locojax.model import hf_config, hf_io, params
from locojax.model.config import ModelConfig
from locojax.tokenizer import Tokenizer, load_tokenizer

EMBEDDED_DIR = Path(__file__).parent.parent / "assets" / "tiny-arith"
EMBEDDED = {"embedded": EMBEDDED_DIR,
            "embedded-strict": EMBEDDED_DIR.with_name("tiny-arith-strict"),
            "embedded-calc": EMBEDDED_DIR.with_name("tiny-calc")}
"""Checkpoints shipped in locojax/assets, by spec."""
META_FILE = "locojax.json"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


@dataclasses.dataclass
class LoadedModel:
    cfg: ModelConfig
    weights: params.Weights
    tokenizer: Tokenizer
    source: str
    meta: dict


def read_meta(model_dir: str | Path) -> dict:
    path = Path(model_dir) / META_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def tokenizer_for(model_dir: str | Path) -> Tokenizer:
    model_dir = Path(model_dir)
    if (model_dir / "tokenizer.json").exists():
        return load_tokenizer(model_dir)
    name = read_meta(model_dir).get("tokenizer")
    if name is None:
        raise ValueError(f"{model_dir} has neither tokenizer.json nor a {META_FILE} naming a "
                         "built-in tokenizer")
    return load_tokenizer(name)


def resolve_dir(spec: str) -> Path | None:
    """The checkpoint directory of a spec, or None for random-init presets."""
    if spec in EMBEDDED:
        return EMBEDDED[spec]
    if spec in model_config.PRESETS:
        return None
    path = Path(spec)
    if not path.is_dir():
        raise ValueError(f"model {spec!r} is neither a shipped checkpoint "
                         f"({', '.join(EMBEDDED)}), a preset "
                         f"({', '.join(model_config.PRESETS)}) nor a directory")
    return path


def load_config(spec: str, **overrides) -> ModelConfig:
    """The ModelConfig `load(spec, **overrides)` would give, without reading any weights."""
    path = resolve_dir(spec)
    if path is None:
        return model_config.PRESETS[spec](**overrides)
    return hf_config.load_config(path, **overrides)


def load_tokenizer_of(spec: str) -> Tokenizer:
    """The tokenizer `load(spec)` would give, without reading any weights."""
    path = resolve_dir(spec)
    return load_tokenizer("char") if path is None else tokenizer_for(path)


def load(spec: str, seed: int = 0, shardings=None, **overrides) -> LoadedModel:
    """Load `spec`; `shardings` may be a function of the config (see `hf_io.load_model`)."""
    path = resolve_dir(spec)
    if path is None:
        cfg = model_config.PRESETS[spec](**overrides)
        if callable(shardings):
            shardings = shardings(cfg)
        # Initialised inside jit straight into the shardings: works when they span processes.
        init = jax.jit(lambda k: params.init(cfg, k), out_shardings=shardings)
        weights = init(jax.random.key(seed))
        return LoadedModel(cfg, weights, load_tokenizer("char"), spec, {})
    cfg, weights = hf_io.load_model(path, shardings, **overrides)
    return LoadedModel(cfg, weights, tokenizer_for(path), str(path), read_meta(path))


def host_local(weights: params.Weights) -> params.Weights:
    """Numpy copies of replicated (possibly multi-process) weights, from this host's shards."""
    return jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data), weights)


def save(model_dir: str | Path, cfg: ModelConfig, weights: params.Weights, source: str,
         meta: dict | None = None, dtype: str | None = None) -> Path:
    """Write an HF checkpoint that `load` reads back with the same tokenizer as `source`.

    weights: replicated arrays or numpy. source: the spec the model was loaded from; its
    tokenizer files are copied, or (char-level models) `locojax.json` names the tokenizer.
    dtype: the stored dtype (default the config's param dtype; bfloat16 halves the file).
    """
    model_dir = Path(model_dir)
    hf_io.save_weights(host_local(weights), cfg, model_dir, dtype=dtype)
    src = resolve_dir(source)
    meta = dict(meta or {})
    if src is not None and (src / "tokenizer.json").exists():
        for name in TOKENIZER_FILES:
            if (src / name).exists():
                shutil.copy(src / name, model_dir / name)
    else:
        meta.setdefault("tokenizer", read_meta(src).get("tokenizer", "char") if src else "char")
    (model_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return model_dir
