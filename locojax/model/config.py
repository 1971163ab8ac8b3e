"""Decoder config (Qwen3, Qwen2/2.5, Llama 3.x, Gemma 3 text); docs/design.md's benchmark shapes.

The field names follow the HF configs (`Qwen3Config`, ...) so that `config.json` maps onto
them directly (see `hf_config.py`); everything else in locojax reads only this dataclass.
What a family changes in the forward is declared once, in `families.py`; the fields below
that only some families use (sliding window, RoPE scaling, ...) default to "absent".
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from locojax.model.families import FAMILIES, Family

FULL, SLIDING = "full_attention", "sliding_attention"
"""Layer types, spelled as HF `layer_types` spells them."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling of the full-attention layers (HF `rope_parameters`)."""

    rope_type: str
    """"linear" (every frequency / factor) or "llama3" (low frequencies / factor, high ones
    kept, a smooth ramp between: Llama 3.1+)."""
    factor: float
    low_freq_factor: float = 1.0
    """llama3 only: wavelengths above original_max_position_embeddings / this are scaled."""
    high_freq_factor: float = 4.0
    """llama3 only: wavelengths below original_max_position_embeddings / this are kept."""
    original_max_position_embeddings: int = 8192
    """llama3 only: the context length the model was pre-trained at."""

    def __post_init__(self):
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(f"rope scaling type {self.rope_type!r} is not supported "
                             "(linear, llama3)")


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""The decoder's linear layers LoRA can adapt, by PEFT's short names (q_proj, ..., down_proj)."""


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (Hu et al. 2021) on the decoder's linear layers; `lora.py` applies them.
    A `ModelConfig` with one trains A and B only: the base weights are frozen."""

    rank: int = 0
    """r: the adapters' rank; 0 trains every weight (no LoRA)."""
    alpha: float = 16.0
    """α: the update is scaled by α / r (PEFT's `lora_alpha`)."""
    targets: tuple[str, ...] = LORA_TARGETS
    """Which linear layers get adapters: q, k, v, o, gate, up, down (default all)."""
    base_dtype: str = "float32"
    """Storage dtype of the frozen base: float32 or bfloat16 (adapters and their optimizer
    state stay in f32)."""

    def __post_init__(self):
        if self.rank < 0:
            raise ValueError(f"lora rank must be >= 0, got {self.rank}")
        if self.rank and not self.alpha > 0:
            raise ValueError(f"lora alpha must be > 0, got {self.alpha}")
        bad = [t for t in self.targets if t not in LORA_TARGETS]
        if bad or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"lora targets must be distinct names from {LORA_TARGETS}, got "
                             f"{self.targets}")
        if self.base_dtype not in ("float32", "bfloat16", "float64"):
            raise ValueError(f"lora base_dtype must be float32 or bfloat16, got "
                             f"{self.base_dtype!r}")

    @property
    def scale(self) -> float:
        """s = α / r, the factor on B A (PEFT's `scaling` without rsLoRA)."""
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A pre-norm decoder: RMSNorm, RoPE, GQA, a gated MLP; `model_type` names the family
    (`families.py`: biases, q/k norms, Gemma's norms and embedding scale, activation)."""

    model_type: str = "qwen3"
    """HF model_type of the family: qwen3, qwen2, llama or gemma3_text."""

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
    """RoPE base frequency (of the full-attention layers where local ones differ)."""
    rope_scaling: RopeScaling | None = None
    """RoPE scaling of the full-attention layers; None: plain RoPE."""
    layer_types: tuple[str, ...] | None = None
    """Per layer "full_attention" or "sliding_attention"; None: every layer is full."""
    sliding_window: int | None = None
    """W: a sliding-attention layer's query sees the keys less than W positions back
    (itself included), as HF's `sliding_window`."""
    rope_local_theta: float | None = None
    """RoPE base of the sliding-attention layers (Gemma 3's `rope_local_base_freq`)."""
    query_pre_attn_scalar: int | None = None
    """Attention scores are q·k / sqrt(this) (Gemma 3); None: the head dim."""
    rms_norm_eps: float = 1e-6
    """Epsilon inside every RMSNorm."""
    tie_word_embeddings: bool = True
    """Share the input embedding with the output projection (Qwen3 0.6B/1.7B/4B do)."""
    max_position_embeddings: int = 40960
    """Longest position the checkpoint was trained for; only checked, never allocated."""
    embedding_padding_idx: int | None = None
    """A token whose input-embedding row gets no gradient from its lookups, as transformers'
    `nn.Embedding(padding_idx=config.pad_token_id)` (so TRL and the HF Trainer) leave it; a
    tied row still trains as the output head. None: every row trains as its lookups ask
    (`OptimConfig.hf_padding_idx` sets it to the tokenizer's pad)."""
    param_dtype: str = "float32"
    """Storage dtype of the weights (the optimizer's master copy in training)."""
    lora: LoraConfig | None = None
    """LoRA adapters trained on a frozen base (`lora.py`); None: every weight trains."""
    compute_dtype: str = "float32"
    """Dtype of activations and matmuls: float32 or bfloat16. Softmax and norms stay in f32.
    float64 (both dtypes, under `jax_enable_x64`) computes everything in f64: what the
    tests use where f32 rounding would hide a bug."""

    batch_invariant: bool = False
    """Compute the forward with batch-invariant kernels (`invariant.py`): a token's logprob
    is bitwise the same whatever its batch, micro-batch, row position and padding, and the
    engine's equals the learner's. Slower (docs/design.md, "Batch-invariant logprobs")."""

    def __post_init__(self):
        if self.model_type not in FAMILIES:
            raise ValueError(f"model_type {self.model_type!r} is not supported "
                             f"({', '.join(FAMILIES)})")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers or not set(
                    self.layer_types) <= {FULL, SLIDING}:
                raise ValueError(f"layer_types must give {FULL!r} or {SLIDING!r} for each of "
                                 f"the {self.num_hidden_layers} layers, got {self.layer_types}")
            if SLIDING in self.layer_types and not (self.sliding_window or 0) > 0:
                raise ValueError("sliding-attention layers need a sliding_window > 0, got "
                                 f"{self.sliding_window}")
        if self.embedding_padding_idx is not None and not (
                0 <= self.embedding_padding_idx < self.vocab_size):
            raise ValueError(f"embedding_padding_idx={self.embedding_padding_idx} is not a token "
                             f"of the {self.vocab_size}-entry vocabulary")
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
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def windowed(self) -> bool:
        """Whether any layer attends within a sliding window."""
        return self.layer_types is not None and SLIDING in self.layer_types

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
        fam = self.family
        per_layer = d * (n * h + 2 * k * h) + n * h * d + 3 * d * f + 2 * d
        per_layer += (n * h + 2 * k * h) * fam.qkv_bias + 2 * h * fam.qk_norm
        per_layer += 2 * d * fam.sandwich_norms
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
    """docs/design.md TINY: 2 layers, d=64, ffn 128, 4 heads, 2 kv heads, head_dim 16, vocab
    512, tied."""
    return dataclasses.replace(ModelConfig(), **overrides)


def small(**overrides) -> ModelConfig:
    """docs/design.md SMALL: 4 layers, d=256, ffn 768, 8 heads, 4 kv heads, head_dim 32, vocab
    4096, tied."""
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
