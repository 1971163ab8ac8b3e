"""LoRA adapters ↔ PEFT's on-disk format: `adapter_config.json` + `adapter_model.safetensors`.

What `peft.PeftModel.from_pretrained(base, dir)` loads onto the base model, and what
`locojax eval --model DIR` (any command's `--model`: `loader.load`) reads back as the base
with the adapters merged. The tensor names and layouts come from the adapter declarations
(`lora.declare`: `hf_name`, `to_hf`), as the base's come from `params.declare`; this file
lists no weight by hand.

Reference: PEFT `LoraConfig` and `save_pretrained` (tensor names without the adapter name,
`lora_A.weight` [r, in], `lora_B.weight` [out, r], scaling lora_alpha / r without rsLoRA).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from locojax.model import lora
from locojax.model.config import LoraConfig, ModelConfig
from locojax.model.params import Weights, is_decl

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
                "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
"""`LoraConfig.targets` → PEFT's `target_modules` (the HF module names)."""


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def save(out_dir: str | Path, cfg: ModelConfig, adapters: Weights, base_model: str) -> Path:
    """Write `adapters` (numpy or replicated arrays) of `cfg.lora` for `base_model` (the
    base's directory, recorded as `base_model_name_or_path`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lcfg, tensors = cfg.lora, {}
    decls = jax.tree.leaves(lora.declare(cfg), is_leaf=is_decl)
    for d, x in zip(decls, jax.tree.leaves(adapters)):
        x = np.asarray(x, np.float32)
        for i in range(cfg.num_hidden_layers):
            tensors[d.hf_name.format(i=i)] = np.ascontiguousarray(d.to_hf(x[i]))
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": lcfg.rank, "lora_alpha": lcfg.alpha, "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(PEFT_MODULES[t] for t in lcfg.targets),
        "fan_in_fan_out": False, "inference_mode": True, "use_rslora": False,
        "use_dora": False, "init_lora_weights": True, "modules_to_save": None,
        "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {},
    }
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def read_config(adapter_dir: str | Path) -> tuple[str, LoraConfig]:
    """(The base model it was trained on, its `LoraConfig`); what locojax cannot apply
    (rsLoRA, DoRA, per-layer ranks, bias training, other modules) is refused by name."""
    path = Path(adapter_dir) / CONFIG_FILE
    cfg = json.loads(path.read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for key, off in (("use_rslora", False), ("use_dora", False), ("bias", "none"),
                     ("modules_to_save", None), ("layers_to_transform", None),
                     ("rank_pattern", {}), ("alpha_pattern", {}), ("fan_in_fan_out", False)):
        if cfg.get(key, off) not in (off, None) and cfg.get(key) != off:
            raise ValueError(f"{path}: {key}={cfg[key]!r} is not supported (only {off!r})")
    modules = cfg["target_modules"]
    modules = [modules] if isinstance(modules, str) else modules
    short = {v: k for k, v in PEFT_MODULES.items()}
    bad = [m for m in modules if m not in short]
    if bad:
        raise ValueError(f"{path}: target_modules {bad} are not decoder linear layers "
                         f"({sorted(short)})")
    targets = tuple(t for t in PEFT_MODULES if PEFT_MODULES[t] in modules)
    return cfg["base_model_name_or_path"], LoraConfig(rank=int(cfg["r"]),
                                                      alpha=float(cfg["lora_alpha"]),
                                                      targets=targets)


def load(adapter_dir: str | Path, cfg: ModelConfig) -> tuple[ModelConfig, Weights]:
    """(`cfg` with the directory's `LoraConfig`, its adapters as f32 numpy), every tensor
    checked by name and shape against the declarations."""
    _, lcfg = read_config(adapter_dir)
    cfg = dataclasses.replace(cfg, lora=lcfg)
    path = Path(adapter_dir) / WEIGHTS_FILE
    found = load_file(str(path))
    decls, treedef = jax.tree.flatten(lora.declare(cfg), is_leaf=is_decl)
    leaves = []
    for d in decls:
        layers = []
        for i in range(cfg.num_hidden_layers):
            name = d.hf_name.format(i=i)
            if name not in found:
                raise ValueError(f"{path}: tensor {name} is missing")
            x = d.from_hf(found.pop(name).astype(np.float32))
            if x.shape != d.shape[1:]:
                raise ValueError(f"{path}: {name} has the wrong shape for rank {lcfg.rank}")
            layers.append(x)
        leaves.append(np.stack(layers))
    if found:
        raise ValueError(f"{path}: tensors locojax does not apply: {sorted(found)[:4]}")
    return cfg, jax.tree.unflatten(treedef, leaves)
