"""Random-weight HF Qwen3 models built offline, converted to locojax weights.

Shared by every parity test: transformers is the reference implementation.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from locojax.model.config import ModelConfig
from locojax.model.hf_io import from_state_dict


def hf_config(cfg: ModelConfig) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        max_position_embeddings=cfg.max_position_embeddings,
    )


def random_hf_model(cfg: ModelConfig, seed: int = 0) -> Qwen3ForCausalLM:
    """An f32 HF model whose every weight, norms included, is random (so no weight is inert)."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(hf_config(cfg)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + 0.1 * torch.randn_like(p))
    return model


def hf_state_dict(model) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def paired(cfg: ModelConfig, seed: int = 0):
    """(hf_model, locojax_weights) holding the same random weights."""
    model = random_hf_model(cfg, seed)
    return model, from_state_dict(hf_state_dict(model), cfg)


def tiny_cfg(**kw) -> ModelConfig:
    from locojax.model.config import tiny
    return dataclasses.replace(tiny(), **kw)
