"""The model families locojax runs, each declared once: what it changes in the shared decoder.

Every family is the same pre-norm decoder (`decoder.py`: RMSNorm, RoPE, GQA attention, gated
MLP); a `Family` switches on the few parts that differ, and names the HF class and config
defaults its `config.json` is read with (`hf_config.py`). Weight declarations (`params.py`),
the forward, the HF loader and saver all read these switches; nothing else names a family.

References: transformers `modeling_qwen3.py`, `modeling_qwen2.py`, `modeling_llama.py`,
`modeling_gemma3.py` (5.24).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str
    """HF `model_type`."""
    architecture: str
    """HF class written to `config.json` `architectures`."""
    qkv_bias: bool = False
    """q/k/v projections have biases (Qwen2); o_proj never does."""
    qk_norm: bool = False
    """Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)."""
    unit_offset_norm: bool = False
    """Gemma's RMSNorm: x̂ · (1 + w), the scale applied in f32 before the cast back
    (others: w · cast(x̂)); its scales are stored (and initialised) around 0."""
    sandwich_norms: bool = False
    """Gemma 3: the attention and MLP outputs are normed again before the residual add, so
    a layer has four norms (HF input, post_attention, pre_feedforward, post_feedforward)."""
    scaled_embedding: bool = False
    """Gemma: the embedding is multiplied by sqrt(d), rounded to the weights' dtype."""
    activation: str = "silu"
    """Gate activation: "silu" or "gelu_pytorch_tanh" (tanh-approximated GELU)."""
    activation_key: str = "hidden_act"
    """The config.json key naming the activation."""
    hf_defaults: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)
    """HF config class defaults of keys a checkpoint may leave out (`head_dim` None: d / n)."""


_COMMON = dict(rope_theta=10_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
               max_position_embeddings=32768, head_dim=None)

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("qwen3", "Qwen3ForCausalLM", qk_norm=True, hf_defaults=dict(_COMMON, head_dim=128)),
    Family("qwen2", "Qwen2ForCausalLM", qkv_bias=True, hf_defaults=_COMMON),
    Family("llama", "LlamaForCausalLM",
           hf_defaults=dict(_COMMON, max_position_embeddings=2048)),
    Family("gemma3_text", "Gemma3ForCausalLM", qk_norm=True, unit_offset_norm=True,
           sandwich_norms=True, scaled_embedding=True, activation="gelu_pytorch_tanh",
           activation_key="hidden_activation",
           hf_defaults=dict(_COMMON, rope_theta=1_000_000.0, tie_word_embeddings=True,
                            max_position_embeddings=131072, head_dim=256,
                            rope_local_base_freq=10_000.0, query_pre_attn_scalar=256,
                            sliding_window=4096, sliding_window_pattern=6)),
)}
