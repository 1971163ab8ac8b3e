"""Supervised fine-tuning on (prompt, completion) demonstrations.

Used to make the tiny checkpoint that ships with locojax (`locojax sft`), and by users to
warm-start a model on a new task format before GRPO. Cross-entropy on completion tokens
only, mean over the batch's completion tokens. Same forward as rollout and RL training.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from locojax.model import decoder, invariant_jit
from locojax.model.config import ModelConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning hyper-parameters."""

    steps: int = 600
    """Optimizer steps."""
    batch_size: int = 64
    """Demonstrations per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (after linear warmup, cosine to 10%)."""
    warmup_steps: int = 30
    """Linear warmup steps."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Global-norm gradient clip."""
    seed: int = 0
    """Seed for init and batch order."""
    schedule_steps: int = 0
    """Length of the lr schedule, if not `steps` (0): with schedule_steps > steps the run
    stops early on a longer run's schedule, and its weights equal that run's at step `steps`
    (the data order depends only on the seed)."""

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {self}")
        if self.schedule_steps and self.schedule_steps < self.steps:
            raise ValueError(f"schedule_steps={self.schedule_steps} is shorter than "
                             f"steps={self.steps}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


def make_optimizer(cfg: SFTConfig) -> optax.GradientTransformation:
    total = cfg.schedule_steps or cfg.steps
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, cfg.warmup_steps, max(total, cfg.warmup_steps + 1), cfg.lr * 0.1)
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                       optax.adamw(schedule, weight_decay=cfg.weight_decay))


Sequence_ = tuple[list[int], list[bool]]
"""A demonstration as token ids and, per id, whether it is trained on (model-written text)."""


def demo_sequence(tokenizer, demo) -> Sequence_:
    """Token ids of a Demo (prompt, then its segments, then EOS) and the loss mask: only the
    model-written segments and the final EOS are trained on, never prompt or tool output."""
    prompt = demo.prompt
    if not isinstance(prompt, str):
        prompt = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
    ids = tokenizer.encode(prompt)
    mask = [False] * len(ids)
    for seg in demo.segments:
        seg_ids = tokenizer.encode(seg.text)
        ids += seg_ids
        mask += [seg.is_model] * len(seg_ids)
    return ids + [tokenizer.eos_id], mask + [True]


def pack(seqs: Sequence[Sequence_], pad_id: int, length: int | None = None):
    """Right-padded [B, T] tokens, attention mask and loss mask (truncated to `length`)."""
    length = length or max(len(ids) for ids, _ in seqs)
    tokens = np.full((len(seqs), length), pad_id, np.int32)
    loss_mask = np.zeros((len(seqs), length), np.float32)
    attn = np.zeros((len(seqs), length), bool)
    for i, (ids, mask) in enumerate(seqs):
        n = min(len(ids), length)
        tokens[i, :n] = ids[:n]
        attn[i, :n] = True
        loss_mask[i, :n] = mask[:n]
    return tokens, attn, loss_mask


def sft_loss(weights, tokens, attn, loss_mask, model_cfg: ModelConfig):
    """Mean next-token cross-entropy over completion positions. tokens: [B, T]."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, _ = decoder.forward(weights, tokens, positions, model_cfg, mask=attn,
                                unroll=decoder.unroll_for_grad(model_cfg))
    # hidden at t predicts token t+1
    logp, _ = decoder.token_logprobs(weights, hidden[:, :-1], tokens[:, 1:], model_cfg)
    m = loss_mask[:, 1:]
    return -jnp.sum(logp * m) / jnp.maximum(jnp.sum(m), 1.0)


def make_step(model_cfg: ModelConfig, optimizer: optax.GradientTransformation):
    @functools.partial(jax.jit, compiler_options=invariant_jit.compiler_options(model_cfg))
    def step(weights, opt_state, tokens, attn, loss_mask):
        log.info("compiling sft step for tokens %s", tokens.shape)
        loss, grads = jax.value_and_grad(sft_loss)(weights, tokens, attn, loss_mask, model_cfg)
        updates, opt_state = optimizer.update(grads, opt_state, weights)
        return optax.apply_updates(weights, updates), opt_state, loss

    return step


def train(weights, model_cfg: ModelConfig, cfg: SFTConfig, sample_batch, pad_id: int,
          on_step=None):
    """Run `cfg.steps` steps; `sample_batch(rng, n)` returns n (ids, loss_mask) sequences.

    Sequences are padded to the longest seen in the first batch, rounded up to 8, so the
    step compiles once (longer ones are truncated, which only drops trailing tokens).
    """
    optimizer = make_optimizer(cfg)
    opt_state = optimizer.init(weights)
    step = make_step(model_cfg, optimizer)
    rng = np.random.default_rng(cfg.seed)
    length = None
    for i in range(cfg.steps):
        seqs = sample_batch(rng, cfg.batch_size)
        if length is None:
            length = -(-max(len(ids) for ids, _ in seqs) // 8) * 8 + 8
        tokens, attn, loss_mask = pack(seqs, pad_id, length)
        weights, opt_state, loss = step(weights, opt_state, tokens, attn, loss_mask)
        if on_step is not None:
            on_step(i, float(loss), weights)
    return weights
