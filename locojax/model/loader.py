"""From a model spec string to (config, weights, tokenizer): the one place that decides.

Specs:
- `embedded`: the tiny character-level checkpoint shipped inside the package (made by
  `locojax sft`, see README) that mostly answers in a format the strict reward rejects;
  `embedded-strict`: one that answers in the `#### N` format but has only half learned the
  arithmetic (the `demo` preset's: its gain is the task); `embedded-calc`: a sibling that
  learned calculator tool use (the `calc-demo` preset);
- `tiny` / `small`: docs/design.md's benchmark shapes with random weights and the char tokenizer;
- a directory: an HF checkpoint of a family in `families.py` (Qwen3, Qwen2/2.5, Llama 3.x,
  Gemma 3 text). Its tokenizer is `tokenizer.json` if present, else the one named in
  `locojax.json` (written by `locojax sft` for char-level checkpoints);
- a PEFT LoRA adapter directory (`adapter_config.json`, `lora_io.py`): its base model (the
  spec it names) with the adapters merged in, tokenizer and config the base's.

`save` writes a checkpoint whole or not at all (a temporary directory, renamed when
complete), and records the vocabulary's fingerprint in `locojax.json`, which `tokenizer_for`
checks on every later load: tokenizer files of the same size but another vocabulary are
refused by name (`tokenizer.fingerprint`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np

import jax

from locojax.jsonfile import read_object
from locojax.model import config as model_config
from locojax.model import hf_config, hf_io, lora, lora_io, params
from locojax.model.config import ModelConfig
from locojax.tokenizer import Tokenizer, fingerprint, load_tokenizer

EMBEDDED_DIR = Path(__file__).parent.parent / "assets" / "tiny-arith"
EMBEDDED = {"embedded": EMBEDDED_DIR,
            "embedded-strict": EMBEDDED_DIR.with_name("tiny-arith-strict"),
            "embedded-calc": EMBEDDED_DIR.with_name("tiny-calc")}
"""Checkpoints shipped in locojax/assets, by spec."""
META_FILE = "locojax.json"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                   "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")
"""Copied from the source model into an export as they are, so that transformers'
`AutoTokenizer` and `generate` load it exactly as the source (chat template, stop tokens)."""
MODEL_FILES = ("config.json", META_FILE, hf_io.INDEX_FILE, *TOKENIZER_FILES)
"""What a checkpoint directory holds besides its safetensors files (`save` replaces only
directories holding nothing else)."""
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
"""config.json keys an export keeps from its source's (generation defaults read them)."""


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
    """The checkpoint's tokenizer; refused if it is not the vocabulary `save` recorded."""
    model_dir = Path(model_dir)
    meta = read_meta(model_dir)
    trained_with = meta.get("tokenizer_fingerprint")
    if (model_dir / "tokenizer.json").exists():
        return load_tokenizer(model_dir, trained_with=trained_with)
    name = meta.get("tokenizer")
    if name is None:
        raise ValueError(f"{model_dir} has neither tokenizer.json nor a {META_FILE} naming a "
                         "built-in tokenizer")
    return load_tokenizer(name, trained_with=trained_with)


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


def base_of(spec: str) -> tuple[str, Path | None]:
    """(The spec of the model weights are read from, the PEFT adapter directory merged into
    them or None): an adapter directory names its base."""
    path = Path(spec)
    if spec in EMBEDDED or not lora_io.is_adapter_dir(path):
        return spec, None
    base, _ = lora_io.read_config(path)
    if lora_io.is_adapter_dir(base):
        raise ValueError(f"{path}: its base model {base} is itself an adapter directory")
    return base, path


def load_config(spec: str, **overrides) -> ModelConfig:
    """The ModelConfig `load(spec, **overrides)` would give, without reading any weights."""
    spec, _ = base_of(spec)
    path = resolve_dir(spec)
    if path is None:
        return model_config.PRESETS[spec](**overrides)
    return hf_config.load_config(path, **overrides)


def load_tokenizer_of(spec: str) -> Tokenizer:
    """The tokenizer `load(spec)` would give, without reading any weights."""
    path = resolve_dir(base_of(spec)[0])
    return load_tokenizer("char") if path is None else tokenizer_for(path)


def load(spec: str, seed: int = 0, shardings=None, **overrides) -> LoadedModel:
    """Load `spec`; `shardings` may be a function of the config (see `hf_io.load_model`)."""
    spec, adapters = base_of(spec)
    if adapters is not None:  # the base, then its adapters merged in (in the base's layout)
        loaded = load(spec, seed, shardings, **overrides)
        cfg, tree = lora_io.load(adapters, loaded.cfg)
        weights = lora.merge_jit(loaded.weights, tree, cfg)
        return dataclasses.replace(loaded, weights=weights, source=str(adapters))
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


def check_weights(spec: str, cfg: ModelConfig) -> None:
    """Refuse a checkpoint directory whose weight files cannot serve `cfg` (missing, not
    safetensors, a tensor missing or misshapen), reading only the files' headers: what a
    run checks before it starts processes that would each fail on it."""
    path = resolve_dir(base_of(spec)[0])
    if path is not None:
        with hf_io.Checkpoint(path) as ckpt:
            ckpt.check(cfg)


def is_complete(model_dir: str | Path) -> bool:
    """Whether `model_dir` holds a whole checkpoint as `save` writes it (its `locojax.json`
    is written last; `save` renames the directory into place only once it is whole)."""
    model_dir = Path(model_dir)
    return (model_dir / META_FILE).is_file() and (model_dir / "config.json").is_file() and (
        (model_dir / hf_io.SINGLE_FILE).is_file() or (model_dir / hf_io.INDEX_FILE).is_file())


def host_local(weights: params.Weights) -> params.Weights:
    """Numpy copies of replicated (possibly multi-process) weights, from this host's shards
    (numpy leaves as they are). Sharded weights are refused: a shard is not the weight."""

    def local(x):
        if not isinstance(x, jax.Array):
            return np.asarray(x)
        if not x.is_fully_replicated:
            raise ValueError(f"a {x.shape} weight is sharded ({x.sharding}); replicate it "
                             "first (train/meshes.py `replicated`)")
        return np.asarray(x.addressable_shards[0].data)

    return jax.tree.map(local, weights)


def save(model_dir: str | Path, cfg: ModelConfig, weights: params.Weights, source: str,
         meta: dict | None = None, dtype: str | None = None) -> Path:
    """Write an HF checkpoint that `load` reads back with the same tokenizer as `source`.

    weights: replicated arrays or numpy. source: the spec the model was loaded from; its
    tokenizer files (`TOKENIZER_FILES`) and config.json token ids are copied, so that
    transformers loads the export as it loads the source (`AutoModelForCausalLM`,
    `AutoTokenizer`), or (char-level models) `locojax.json` names the tokenizer; either way
    `locojax.json` records the vocabulary's fingerprint.
    dtype: the stored dtype (default the config's param dtype; bfloat16 halves the file).

    Whole or not at all: written to a temporary sibling directory, which replaces `model_dir`
    only once complete, so a process killed while exporting leaves the previous export (or
    none), never half of one. An existing `model_dir` must hold only a checkpoint's files.
    """
    model_dir = Path(model_dir)
    _check_replaceable(model_dir)
    for left in model_dir.parent.glob(f".{model_dir.name}.partial-*"):
        shutil.rmtree(left, ignore_errors=True)  # an export that was killed half-way
    tmp = model_dir.with_name(f".{model_dir.name}.partial-{os.getpid()}")
    src = resolve_dir(source)
    src_config = src / hf_config.CONFIG_NAME if src is not None else None
    token_ids = {}
    if src_config is not None and src_config.is_file():
        token_ids = {k: v for k, v in read_object(src_config).items() if k in TOKEN_ID_KEYS}
    hf_io.save_weights(host_local(weights), cfg, tmp, dtype=dtype, config_extra=token_ids)
    meta = dict(meta or {})
    if src is not None and (src / "tokenizer.json").exists():
        for name in TOKENIZER_FILES:
            if (src / name).exists():
                shutil.copy(src / name, tmp / name)
    else:
        meta.setdefault("tokenizer", read_meta(src).get("tokenizer", "char") if src else "char")
    meta["tokenizer_fingerprint"] = fingerprint(load_tokenizer_of(source))
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    old = model_dir.with_name(f".{model_dir.name}.old-{os.getpid()}")
    if model_dir.exists():
        os.replace(model_dir, old)
    os.replace(tmp, model_dir)
    shutil.rmtree(old, ignore_errors=True)
    return model_dir


def _check_replaceable(model_dir: Path) -> None:
    """`save` replaces the whole directory: refuse one that holds anything else."""
    if not model_dir.exists():
        return
    if not model_dir.is_dir():
        raise ValueError(f"{model_dir} exists and is not a directory")
    other = sorted(p.name for p in model_dir.iterdir()
                   if p.name not in MODEL_FILES and not p.name.endswith(".safetensors"))
    if other:
        raise ValueError(f"{model_dir} holds files that are not a checkpoint's ({', '.join(other)}"
                         "): saving a model there would replace them; choose another directory")
