"""Qwen3 architecture config, and the canonical benchmark shapes of DESIGN.md.

The field names follow HF `Qwen3Config` so that `config.json` maps onto them directly
(see `hf_config.py`); everything else in locojax reads only this dataclass.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Qwen3 decoder: RMSNorm, per-head q/k RMSNorm, RoPE, GQA, SwiGLU, no biases."""

    vocab_size: int = 512
    """v: vocabulary size."""
    hidden_size: int = 64
    """d: model width."""
    intermediate_size: int = 128
    """f: SwiGLU inner width."""
    num_hidden_layers: int = 2
    """Number of decoder layers."""
    num_attention_heads: int = 4
    """n: query heads."""
    num_key_value_heads: int = 2
    """k: key/value heads (GQA); must divide the query heads."""
    head_dim: int = 16
    """h: width of one attention head (Qwen3 sets it independently of d / n)."""
    rope_theta: float = 1_000_000.0
    """RoPE base frequency."""
    rms_norm_eps: float = 1e-6
    """Epsilon inside every RMSNorm."""
    tie_word_embeddings: bool = True
    """Share the input embedding with the output projection (Qwen3 0.6B/1.7B/4B do)."""
    max_position_embeddings: int = 40960
    """Longest position the checkpoint was trained for; only checked, never allocated."""
    param_dtype: str = "float32"
    """Storage dtype of the weights (the optimizer's master copy in training)."""
    compute_dtype: str = "float32"
    """Dtype of activations and matmuls: float32 or bfloat16. Softmax and norms stay in f32.
    float64 (both dtypes, under `jax_enable_x64`) computes everything in f64: what the
    tests use where f32 rounding would hide a bug."""

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        for name in ("param_dtype", "compute_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float64"):
                raise ValueError(f"{name} must be float32, bfloat16 or float64, got "
                                 f"{getattr(self, name)!r}")

    @property
    def q_per_kv(self) -> int:
        """g: query heads that share one key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def dtype(self):
        return _available(self.compute_dtype, "compute_dtype")

    @property
    def weight_dtype(self):
        return _available(self.param_dtype, "param_dtype")

    def num_params(self) -> int:
        d, f, n, k, h, v = (
            self.hidden_size, self.intermediate_size, self.num_attention_heads,
            self.num_key_value_heads, self.head_dim, self.vocab_size,
        )
        per_layer = d * (n * h + 2 * k * h) + n * h * d + 3 * d * f + 2 * d + 2 * h
        embed = v * d * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embed + d

    def flops_per_token(self, context: int = 0) -> int:
        """Forward matmul FLOPs for one token attending to `context` positions (2 per MAC)."""
        d, f, n, k, h, v = (
            self.hidden_size, self.intermediate_size, self.num_attention_heads,
            self.num_key_value_heads, self.head_dim, self.vocab_size,
        )
        proj = d * (n * h + 2 * k * h) + n * h * d + 3 * d * f
        attn = 2 * n * h * context  # q.k and p.v
        return 2 * (self.num_hidden_layers * (proj + attn) + d * v)


def _available(name: str, field: str):
    """The dtype, refusing float64 where jax would silently compute in float32 instead."""
    if name == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(f"{field}=float64 needs jax_enable_x64 "
                         "(e.g. `with jax.enable_x64(True):`)")
    return jnp.dtype(name)


def tiny(**overrides) -> ModelConfig:
    """DESIGN.md TINY: 2 layers, d=64, ffn 128, 4 heads, 2 kv heads, head_dim 16, vocab 512, tied."""
    return dataclasses.replace(ModelConfig(), **overrides)


def small(**overrides) -> ModelConfig:
    """DESIGN.md SMALL: 4 layers, d=256, ffn 768, 8 heads, 4 kv heads, head_dim 32, vocab 4096, tied."""
    base = ModelConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, head_dim=32,
    )
    return dataclasses.replace(base, **overrides)


def char_demo(**overrides) -> ModelConfig:
    """The embedded demo model: a char-level Qwen3 (~0.8M params) that SFTs in a few minutes
    on two CPU cores. Vocab 128 covers the 100-id CharTokenizer."""
    base = ModelConfig(
        vocab_size=128, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=10_000.0,
    )
    return dataclasses.replace(base, **overrides)


PRESETS = {"tiny": tiny, "small": small, "char_demo": char_demo}
