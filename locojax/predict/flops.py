"""FLOPs and bytes of a dense decoder's programs: prefill, decode and the GRPO train step.

One token through a dense decoder costs, per layer (2 FLOPs per multiply-accumulate):
- projections: 2 (d (n h + 2 k h) + n h d + 3 d f), the q/k/v/o and gated-MLP matmuls;
- attention: 4 n h c for a query reading c keys (q·k, then p·v); in a sliding-window layer
  (Gemma 3's local layers) at most W of them, c_local = min(c, W);
and once per token the LM head, 2 d v, wherever logits are taken. Only matmuls count: the
families' elementwise differences (biases, extra norms, GELU) are not FLOPs that matter, and
their parameters are in the weight bytes. Backward is twice the forward's matmuls, so a
train step is 3x a forward, plus one with remat and one no-grad forward for the reference.

The totals follow what locojax's programs compute (`engine.py`, `train_step.py`), checked
against XLA's `cost_analysis()` of those programs (tests/test_predict_flops.py):
- prefill runs each prompt once (not once per sample), dense masked attention over its P
  columns (a local layer: over at most W), and the LM head on the last position only;
- a decode step runs every row of the call (finished rows too: shapes are static), each
  reading the keys `phases.cache_read` gives (`--kv-read static`: what locojax's engine
  reads of its fixed S = P + N - 1 slots; `actual`: the filled part, a paged engine's);
- the train step runs each group's prompt once (`logprobs.prefix_hidden`), the responses'
  N - 1 columns attending to the prompt's P keys and to each other, and the LM head on the
  N positions that predict response tokens.
Bytes are what a step must move at least: every weight once per call (per decode step),
the KV cache read (a local layer's at most its window), activations in and out.

Sliding windows: decode reads a local layer's cache from the first block inside the window
(`attention.CacheBlocks`), as the count does; prefill and the train step compute a local
layer's masked scores densely, which XLA counts and the model does not (it counts what a
block-skipping kernel computes, the accelerator case).

Reference: Kaplan et al. 2020 (C_forward ≈ 2N + 2 n_layer n_ctx d_attn); Chinchilla
appendix F; jax-ml "How to Scale Your Model", ch. "All about Transformer math".
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from locojax.model import lora
from locojax.model.config import SLIDING, ModelConfig
from locojax.model.params import is_decl

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float64": 8, "float16": 2, "float8": 1, "int8": 1}


@dataclasses.dataclass(frozen=True)
class Costs:
    """FLOPs (2 per multiply-accumulate) and the least bytes a program moves."""

    flops: float = 0.0
    bytes: float = 0.0


@dataclasses.dataclass(frozen=True)
class ModelCosts:
    """Per-token costs of one dense decoder, from its `ModelConfig`."""

    cfg: ModelConfig
    dtype: str = "bfloat16"
    """Dtype of weights and KV cache as the programs read them (compute dtype)."""
    kv_dtype: str = ""
    """The KV cache's dtype where it differs (`--rollout.cache-dtype`); "": `dtype`."""

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def kv_itemsize(self) -> int:
        return ITEMSIZE[self.kv_dtype or self.dtype]

    def proj_flops(self) -> float:
        """Matmul FLOPs of one token through one layer's projections (q, k, v, o, SwiGLU)."""
        c = self.cfg
        d, f, n, k, h = (c.hidden_size, c.intermediate_size, c.num_attention_heads,
                         c.num_key_value_heads, c.head_dim)
        return 2.0 * (d * (n * h + 2 * k * h) + n * h * d + 3 * d * f)

    def attn_flops(self, keys: float) -> float:
        """FLOPs of one query reading `keys` keys in one layer (scores, then the mix)."""
        c = self.cfg
        return 4.0 * c.num_attention_heads * c.head_dim * keys

    def layer_keys(self, keys):
        """Σ over layers of the keys a query reads when `keys` are visible: every one in a
        full-attention layer, at most W in a sliding-window layer (scalar or array)."""
        c = self.cfg
        local = sum(kind == SLIDING for kind in c.layer_types or ())
        full = c.num_hidden_layers - local
        return full * keys + (local * np.minimum(keys, c.sliding_window) if local else 0.0)

    def head_flops(self) -> float:
        return 2.0 * self.cfg.hidden_size * self.cfg.vocab_size

    def token_flops(self, keys: float, head: bool = True) -> float:
        """Forward FLOPs of one token attending to `keys` keys (at most W in local layers)."""
        body = (self.cfg.num_hidden_layers * self.proj_flops()
                + self.attn_flops(self.layer_keys(keys)))
        return body + (self.head_flops() if head else 0.0)

    def weight_bytes(self, itemsize: int | None = None) -> float:
        return float(self.cfg.num_params()) * (itemsize or self.itemsize)

    def kv_bytes_per_token(self) -> float:
        """Bytes of keys and values one token leaves in the cache (all layers)."""
        c = self.cfg
        return 2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * self.kv_itemsize

    def kv_read_bytes(self, keys):
        """Bytes of keys and values one query reads with `keys` cached (local layers: at most
        W of them)."""
        c = self.cfg
        return (2.0 * c.num_key_value_heads * c.head_dim * self.kv_itemsize
                * self.layer_keys(keys))

    # --- locojax's programs ----------------------------------------------------------------

    def prefill(self, prompts: float, prompt_len: int) -> Costs:
        """One prefill of `prompts` prompts of P columns (dense masked attention over P keys,
        the head on the last position only): every weight read once, the KV written."""
        p = prompt_len
        flops = prompts * (p * self.token_flops(p, head=False) + self.head_flops())
        moved = self.weight_bytes() + prompts * p * self.kv_bytes_per_token()
        return Costs(flops, moved)

    def decode_step(self, rows: float, keys: float) -> Costs:
        """One decode step of `rows` rows each reading `keys` cached keys: weights read once,
        every row's keys and values read."""
        flops = rows * self.token_flops(keys)
        moved = self.weight_bytes() + rows * self.kv_read_bytes(keys)
        return Costs(flops, moved)

    def train_forward(self, rows: float, group: int, prompt_len: int, new: int) -> float:
        """Forward FLOPs of `sequence_logprobs` over rows of P + N columns, the prompt shared
        by each group of G rows (G = 1: no sharing; the forward then runs every row's P + N - 1
        columns, causal over all of them, and the head on the N response positions)."""
        p, r = prompt_len, new - 1
        if group > 1:
            prompt = (rows / group) * p * self.token_flops(p, head=False)
            response = rows * r * self.token_flops(p + r, head=False)
        else:
            t = p + new - 1
            prompt, response = 0.0, rows * t * self.token_flops(t, head=False)
        return prompt + response + rows * new * self.head_flops()

    def lora_token_flops(self) -> float:
        """One token's forward FLOPs through the LoRA adapters of every layer: 2 r (in + out)
        per adapted matrix (x @ A, then @ B); the sampler's merged weights have none."""
        decls = jax.tree.leaves(lora.declare(self.cfg), is_leaf=is_decl)
        per_layer = sum(2 * float(np.prod(d.shape[1:])) for d in decls)  # A and B, 2 each
        return self.cfg.num_hidden_layers * per_layer

    def train_step(self, rows: float, group: int, prompt_len: int, new: int,
                   reference: bool = False, remat: bool = False) -> Costs:
        """One GRPO update: forward + backward (3 forwards), one more forward with remat,
        one no-grad reference forward with β > 0. Bytes: weights read in the forward and the
        backward, gradients written, AdamW reading params, both moments and the gradient and
        writing params and moments (all f32 master copies). Under LoRA the backward makes
        the activations' gradients (a forward's FLOPs) but no base weight's, the adapters
        add their own matmuls (`lora_token_flops`, three times: forward, and the backward's
        two), and the gradients and AdamW are the adapters'."""
        fwd = self.train_forward(rows, group, prompt_len, new)
        backward = 1 if lora.enabled(self.cfg) else 2
        flops = fwd * (1 + backward + (1 if remat else 0) + (1 if reference else 0))
        if lora.enabled(self.cfg):
            tokens = (rows / group * prompt_len + rows * (new - 1) if group > 1
                      else rows * (prompt_len + new - 1))
            flops += tokens * self.lora_token_flops() * (3 + (1 if remat else 0))
        n, t = float(self.cfg.num_params()), float(lora.num_trainable(self.cfg))
        moved = n * self.itemsize * (2 + (1 if reference else 0)) + t * 4 * (1 + 4 + 3)
        return Costs(flops, moved)
