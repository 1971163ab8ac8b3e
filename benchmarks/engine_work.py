"""The engine benchmarks' shapes and the work a generation does: FLOPs, bytes, the roofline.

What bench_engine.py, bench_extend.py, profile_generate.py, engine_sweeps.py and the peers'
locojax worker count alike, in one leaf: a shape (B prompts x G, P prompt tokens, N new
tokens, exact or long-tailed lengths), its model, and the matmul FLOPs and bytes a generate
of it must do, which the roofline prices at the measured peak and bandwidth.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from benchmarks import harness
from locojax.model import config as model_config
from locojax.model import loader, params

HERE = os.path.dirname(os.path.abspath(__file__))
MEDIAN_LENGTH, SIGMA = 200, 1.0


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    model: str  # a model_config preset
    prompts: int  # B
    group: int  # G
    prompt_tokens: int  # P
    new_tokens: int  # N
    long_tail: bool  # lengths drawn (else exactly N)

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    def lengths(self) -> np.ndarray:
        """[R] tokens per row, prompt-major."""
        if not self.long_tail:
            return np.full(self.rows, self.new_tokens)
        z = np.random.default_rng(0).normal(size=self.rows)
        return np.clip(np.ceil(MEDIAN_LENGTH * np.exp(SIGMA * z)), 1, self.new_tokens).astype(int)


REAL = os.path.join(os.path.dirname(HERE), "models", "SmolLM2-135M-Instruct")
"""The converted real model (`locojax convert`, docs/real_model.md): the `real-*` shapes'."""

SHAPES = {s.name: s for s in [
    Shape("tiny", "tiny", 8, 4, 16, 32, False),
    Shape("small", "small", 16, 8, 32, 64, False),
    *(Shape(f"small-{n}", "small", 16, 8, 32, n, True) for n in (512, 1024, 4096)),
    # The real model's decode at 8, 32 and 128 rows (G 4, as the real-model run's groups):
    # a 128-token prompt (GSM8K's are ~60-115), exactly 128 new tokens.
    *(Shape(f"real-{r}", REAL, r // 4, 4, 128, 128, False) for r in (8, 32, 128)),
    # ... and its long generation: 32 rows, exactly 512 new tokens (issue 40's real-512).
    Shape("real-512", REAL, 8, 4, 128, 512, False),
]}


def model(s: Shape):
    """(cfg, weights) of a shape: a preset's random f32 weights (key 0), or the checkpoint
    at a path (`loader.load`)."""
    if s.model in model_config.PRESETS:
        cfg = model_config.PRESETS[s.model]()
        return cfg, params.init(cfg, jax.random.key(0))
    if not os.path.isdir(s.model):
        raise SystemExit(f"{s.name}: no converted model at {s.model} (docs/real_model.md "
                         "says how to make it)")
    loaded = loader.load(s.model)
    return loaded.cfg, loaded.weights


def prefill_flops(cfg, prompts: int, prompt_tokens: int, written: int = 0) -> int:
    """Matmul FLOPs of prefilling `prompts` prompts of `prompt_tokens` tokens each after
    `written` cached slots (an extend): every position's layers at its exact causal context,
    the LM head at the last position only."""
    head = 2 * cfg.hidden_size * cfg.vocab_size
    return prompts * (sum(cfg.flops_per_token(written + t + 1) - head
                          for t in range(prompt_tokens)) + head)


def slot_bytes(cfg, itemsize: int = 4) -> int:
    """Bytes of one KV cache slot: its key and value at every layer."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize


def generate_flops(cfg, s, lengths=None) -> float:
    """Matmul FLOPs of one generate: prefill B·P tokens, then each row's L_r - 1 decode
    tokens (L_r: `lengths`, default the shape's own, `Shape.lengths`: N for every row of an
    exact-length shape; `peers/locojax_worker.py` reports a GRPO step's generation by it).

    Prefill runs the LM head on the last position only; attention context is counted
    exactly (a token at position t attends to t + 1 keys). A long-tail shape's rows are
    counted to their own ends: counted to N each, small-4096's FLOPs came out 21x the
    work and its roofline above its measured time.
    """
    prefill = prefill_flops(cfg, s.prompts, s.prompt_tokens)
    lengths = np.asarray(s.lengths() if lengths is None else lengths)
    per_step = [float(cfg.flops_per_token(s.prompt_tokens + i + 1))
                for i in range(int(lengths.max()) - 1)]
    upto = np.concatenate([[0.0], np.cumsum(per_step)])  # upto[n]: a row's first n steps
    decode = float(np.sum(upto[np.maximum(lengths - 1, 0)]))
    return float(prefill + decode)


def weight_bytes(weights) -> int:
    """Bytes of every weight: what one decode step (or prefill) reads of them."""
    return sum(x.nbytes for x in jax.tree.leaves(weights))


def generate_bytes(cfg, weights, s: Shape) -> int:
    """Bytes a generate must read: the weights once per program step (prefill and each
    decode step up to the longest row's) and the KV cache its attention reads (`cache_bytes`)."""
    return weight_bytes(weights) * int(s.lengths().max()) + cache_bytes(cfg, s)


def roofline(seconds: float, flops: float, nbytes: float, peak: float, bandwidth: float) -> str:
    """'x% (bytes|FLOPs)': the roofline's share of a measured time, and which side bounds it."""
    side = "bytes" if nbytes / bandwidth >= flops / peak else "FLOPs"
    share = harness.roofline_share(seconds, flops, nbytes, peak, bandwidth)
    return f"{100 * share:.0f}% ({side})"


def cache_bytes(cfg, s: Shape, itemsize: int = 4) -> int:
    """KV bytes attention must read: at decode step t a live row reads its P + t - 1 written
    slots, keys and values, every layer."""
    per_slot = slot_bytes(cfg, itemsize)
    steps = s.lengths() - 1  # decode steps per row (token 0 comes from prefill)
    return int(per_slot * np.sum(steps * s.prompt_tokens + steps * (steps - 1) // 2))
