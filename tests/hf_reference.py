"""Random-weight HF models built offline, converted to locojax weights.

Shared by every parity test: transformers is the reference implementation. `float64_model`
runs it in float64 throughout, so that parity can be checked far below f32 rounding;
`logit_tol` is the bound on two implementations' (or two programs') logits. Qwen3 models
are built from a `ModelConfig` (`paired`); every family from its published config.json
fields cut down to a tiny size (`published`, `cut_down`, `paired_from`), which
tests/data/hf_configs.json holds (copied from the model pages; see its entries' names).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import pathlib
import sys
from unittest import mock

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from locojax.model.config import ModelConfig
from locojax.model.hf_config import config_from_dict
from locojax.model.hf_io import from_state_dict
from tests.tolerance import probabilistic, x64

PUBLISHED = pathlib.Path(__file__).parent / "data" / "hf_configs.json"

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


def measured_logit_tol(dtype, weights, cfg: ModelConfig, hidden) -> float:
    """`logit_tol` without its premise: 2 · probabilistic(FWD_DEPTH) · max Σ_d |h_d e_vd|,
    the terms measured on these weights and final hidden states [..., D] (untied heads of
    other families reach 2.1 · max|logit|, past the premise's TERMS_PER_LOGIT = 2)."""
    head = weights["embed"] if cfg.tie_word_embeddings else weights["lm_head"].T  # [V, D]
    terms = np.abs(np.asarray(hidden, np.float64)).reshape(-1, cfg.hidden_size) @ np.abs(
        np.asarray(head, np.float64)).T
    return 2 * probabilistic(FWD_DEPTH, dtype) * terms.max()


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
    return _randomised(Qwen3ForCausalLM(hf_config(cfg)).float().eval())


def _randomised(model):
    """Every parameter N(0, 0.1) around its neutral value: 1 for norm scales, except
    Gemma's, which scale by (1 + w); 0 for matrices and biases."""
    offset = "Gemma" in type(model).__name__
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if "norm" in name and not offset else 0.0
            p.copy_(base + 0.1 * torch.randn_like(p))
    return model


def published(name: str) -> dict:
    """The published config.json fields of model `name` (a key of tests/data/hf_configs.json)."""
    return json.loads(PUBLISHED.read_text())[name]


def cut_down(d: dict, **overrides) -> dict:
    """`d` at TINY's sizes (2 layers, d=64, ffn 128, 4 heads, 2 kv heads, head dim 16, vocab
    512), f32, everything else (biases, RoPE scaling, norms, window, tying) as published;
    `overrides` last. A config without `head_dim` keeps deriving it (64 / 4 = 16)."""
    small = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, torch_dtype="float32")
    if "head_dim" in d:
        small["head_dim"] = 16
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids of the real vocabulary
        small[key] = None
    return {**d, **small, **overrides}


def random_hf_model_from(d: dict, seed: int = 0):
    """An f32 HF model of config dict `d`, built by transformers from the dict itself (so
    transformers, not locojax, reads its fields), every weight random (`_randomised`)."""
    fields = {k: v for k, v in d.items() if k not in ("architectures", "model_type")}
    hf = AutoConfig.for_model(d["model_type"], **fields)
    torch.manual_seed(seed)
    return _randomised(AutoModelForCausalLM.from_config(hf, dtype=torch.float32).eval())


def paired_from(d: dict, seed: int = 0):
    """(hf_model, locojax weights, locojax config) of config dict `d`: the config read by
    locojax's own reader, the weights converted from the HF model's."""
    cfg = config_from_dict(d)
    model = random_hf_model_from(d, seed)
    return model, from_state_dict(hf_state_dict(model), cfg), cfg


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
    """HF `Qwen3RMSNorm.forward` (and Qwen2's, Llama's) without its cast to f32 (a no-op for
    f32 input); Gemma's `(1 + w)` form likewise."""
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    normed = hidden_states * torch.rsqrt(variance + eps)
    if type(self).__name__.startswith("Gemma"):
        return normed * (1.0 + self.weight)
    return self.weight * normed


def _inv_freq(params: dict, dim: int, dtype) -> torch.Tensor:
    """HF's RoPE inverse frequencies (`_compute_default_rope_parameters`, `..._linear_...`,
    `_compute_llama3_parameters`, modeling_rope_utils.py 5.24) in `dtype` instead of f32."""
    inv = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=dtype) / dim))
    kind = params.get("rope_type", "default")
    if kind == "linear":
        return inv / params["factor"]
    if kind == "default":
        return inv
    assert kind == "llama3", kind
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def _rope_in_input_dtype(self, x, position_ids, layer_type=None):
    """HF `*RotaryEmbedding.forward` with inverse frequencies, angles, cos and sin in x's
    dtype instead of f32 (Gemma 3: `layer_type` picks the layer type's parameters)."""
    params = self.config.rope_parameters
    scaling = self.attention_scaling if layer_type is None else getattr(
        self, f"{layer_type}_attention_scaling")
    params = params if layer_type is None else params[layer_type]
    dim = getattr(self.config, "head_dim", None) or (self.config.hidden_size
                                                    // self.config.num_attention_heads)
    freqs = position_ids[..., None].to(x.dtype) * _inv_freq(params, dim, x.dtype)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


@contextlib.contextmanager
def computing_in(dtype: str, model, weights, cfg: ModelConfig):
    """(HF model, locojax weights, cfg) holding the same weights, computing in `dtype`; for
    float64, with jax's x64 on and HF's f32 islands widened (`float64_model`)."""
    if dtype == "float32":
        yield model, weights, cfg
        return
    cfg64 = dataclasses.replace(cfg, param_dtype="float64", compute_dtype="float64")
    with x64(), float64_model(model) as model64:
        yield model64, from_state_dict(hf_state_dict(model), cfg64), cfg64


@contextlib.contextmanager
def float64_model(model):
    """A float64 copy of `model` whose f32 islands (RMSNorm and RoPE compute in f32 whatever
    the model dtype) are widened to f64; everything else is HF's own code. Attention must be
    SDPA: the eager path's softmax also casts to f32."""
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    module = sys.modules[type(model).__module__]
    norm = next(v for k, v in vars(module).items() if k.endswith("RMSNorm"))
    rotary = next(v for k, v in vars(module).items() if k.endswith("RotaryEmbedding"))
    with mock.patch.object(norm, "forward", _rms_norm_in_input_dtype), \
            mock.patch.object(rotary, "forward", _rope_in_input_dtype):
        yield copy.deepcopy(model).double()
