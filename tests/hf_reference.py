"""Random-weight HF Qwen3 models built offline, converted to locojax weights.

Shared by every parity test: transformers is the reference implementation. `float64_model`
runs it in float64 throughout, so that parity can be checked far below f32 rounding;
`logit_tol` is the bound on two implementations' (or two programs') logits.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from unittest import mock

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3 import modeling_qwen3

from locojax.model.config import ModelConfig
from locojax.model.hf_io import from_state_dict
from tests.tolerance import probabilistic

# `logit_tol`: each implementation is off by rounding along a chain of FWD_DEPTH = 2048 ≥
# ~1.2k reduction terms in sequence for TINY-shaped models (2 layers × (norm 64,
# projections 64, q/k norm 16, scores 16, softmax ≤ 20, p·v ≤ 20, o-proj 64, norm 64,
# gate/up 64, down 128), final norm 64, logits 64), relative to a logit's Σ_d |h_d e_vd|,
# which is ≤ TERMS_PER_LOGIT · max|logit| for weights at this module's scale (N(0, 0.1)
# matrices, 1 + N(0, 0.1) norms: 1.8, a property of the weights, not of the CPU; checked
# in test_model_parity).
FWD_DEPTH = 2048
TERMS_PER_LOGIT = 2.0


def logit_tol(dtype, ref) -> float:
    """Absolute bound on |a - b| between two computations of logits `ref` in `dtype`:
    2 · probabilistic(FWD_DEPTH) · TERMS_PER_LOGIT · max|ref| (f32: ~1e-4 · max|logit|)."""
    return 2 * probabilistic(FWD_DEPTH, dtype) * TERMS_PER_LOGIT * float(np.abs(ref).max())


def logprob_tol(dtype, logits, temperature: float = 1.0) -> float:
    """Absolute bound on |a - b| between two computations of log softmax(logits / τ): the
    token's logit and the log-sum-exp each move by ≤ logit_tol / τ, and the sum of V ≤
    FWD_DEPTH positive terms adds its own rounding (relative to the sum, so absolute on its
    log) in each computation."""
    return 2 * logit_tol(dtype, logits) / temperature + 2 * probabilistic(FWD_DEPTH, dtype)


def assert_decisive_argmax(logits, dtype="float32"):
    """Every position's top logit leads the runner-up by more than two programs (or two
    implementations) can disagree (2 · logit_tol), so its argmax is the same in every
    program on every CPU: what makes greedy tokens comparable exactly."""
    top2 = np.sort(np.asarray(logits, np.float64), axis=-1)[..., -2:]
    gap = (top2[..., 1] - top2[..., 0]).min()
    assert gap > 2 * logit_tol(dtype, logits), (gap, 2 * logit_tol(dtype, logits))


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


def _rms_norm_in_input_dtype(self, hidden_states):
    """HF `Qwen3RMSNorm.forward` without its cast to f32 (a no-op for f32 input)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rope_in_input_dtype(self, x, position_ids):
    """HF `Qwen3RotaryEmbedding.forward` (default RoPE) with inverse frequencies, angles,
    cos and sin in x's dtype instead of f32."""
    base = self.config.rope_parameters["rope_theta"]
    dim = self.config.head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=x.dtype) / dim))
    freqs = position_ids[..., None].to(x.dtype) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


@contextlib.contextmanager
def float64_model(model):
    """A float64 copy of `model` whose f32 islands (RMSNorm and RoPE compute in f32 whatever
    the model dtype) are widened to f64; everything else is HF's own code. Attention must be
    SDPA: the eager path's softmax also casts to f32."""
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    assert model.config.rope_parameters["rope_type"] == "default"
    with mock.patch.object(modeling_qwen3.Qwen3RMSNorm, "forward", _rms_norm_in_input_dtype), \
            mock.patch.object(modeling_qwen3.Qwen3RotaryEmbedding, "forward",
                              _rope_in_input_dtype):
        yield copy.deepcopy(model).double()
