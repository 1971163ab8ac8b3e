"""Learner configuration: the algorithm, the optimizer, and how one update is laid out.

Three frozen dataclasses, composed into `LearnerConfig`. Field docstrings give the paper
symbol where there is one (β, ε_low, ε_high, μ, G), and become `--help` through tyro.

Algorithm-specific fields default to `None`, meaning "what the named algorithm uses"
(e.g. DAPO's ε_high = 0.28, Dr.GRPO's `seq-mean-token-sum-norm`); `algorithms.resolve`
turns an `AlgoConfig` into concrete settings in one place.

References: Tunix `GRPOConfig` (paper symbols in docstrings), verl `actor` config names.
"""

from __future__ import annotations

import dataclasses

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
    """The RL objective. `name` picks a registry entry in `algorithms.py`."""

    name: str = "grpo"
    """Algorithm: grpo, dr_grpo, dapo, gspo, rloo or reinforce."""
    group_size: int = 4
    """G: responses sampled per prompt; the advantage baselines are computed within a group."""
    beta: float = 0.0
    """β: weight of the KL penalty to the reference policy. 0 skips the reference forward."""
    kl_estimator: str = "k3"
    """Per-token KL estimator (Schulman 2020): k1 = log r, k2 = (log r)²/2, k3 = r⁻¹ - 1 + log r."""
    eps_low: float | None = None
    """ε_low: lower clip range, ratio ≥ 1 - ε_low. None: the algorithm's (0.2; GSPO 3e-4)."""
    eps_high: float | None = None
    """ε_high: upper clip range, ratio ≤ 1 + ε_high. None: the algorithm's (0.2; DAPO 0.28)."""
    dual_clip: float = 0.0
    """c: dual-clip constant (Ye et al. 2020); for A < 0 the loss is capped at -c·A. 0 = off."""
    loss_agg: str | None = None
    """Loss aggregation mode (see docs/objectives.md). None: the algorithm's default."""
    max_response_len: int = 0
    """L_max: the Dr.GRPO constant normaliser of `seq-mean-token-sum-norm` (the sampler's
    max new tokens). Required by that mode; a constant, so padding never changes it."""
    scale_by_std: bool | None = None
    """Divide group advantages by the group std. None: the algorithm's (GRPO yes, Dr.GRPO no)."""
    adv_eps: float = 1e-6
    """ε added to the std in the advantage denominator."""
    ppo_epochs: int = 1
    """μ: passes over the batch per train step (GRPO's inner iterations)."""
    num_minibatches: int = 1
    """Optimizer updates per pass: the batch is split into this many mini-batches."""
    is_cap: float = 2.0
    """C: cap of the truncated importance weight min(π_old / π_behav, C) applied to stale
    samples (see losses.py). 0 = off."""
    is_all_samples: bool = False
    """Also weight staleness-0 samples (corrects sampler/trainer numeric mismatch, as Yao et
    al. 2025 do for vLLM vs FSDP). Off by default: locojax's sampler shares the trainer forward."""

    def __post_init__(self):
        if self.loss_agg is not None and self.loss_agg not in AGG_MODES:
            raise ValueError(f"loss_agg={self.loss_agg!r} is not one of {AGG_MODES}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator={self.kl_estimator!r} is not one of {KL_ESTIMATORS}")
        for field in ("group_size", "ppo_epochs", "num_minibatches"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be >= 1, got {getattr(self, field)}")
        for field in ("beta", "is_cap", "max_response_len", "adv_eps"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must be >= 0, got {getattr(self, field)}")
        if self.dual_clip and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or 0 for off), got {self.dual_clip}")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay, after global-norm gradient clipping.

    Schedule lengths count optimizer updates (train steps × μ × num_minibatches).
    """

    lr: float = 1e-6
    """Peak learning rate (after warmup)."""
    warmup_steps: int = 0
    """Optimizer updates of linear warmup from 0 to `lr`."""
    decay_steps: int = 0
    """Total optimizer updates of the schedule, warmup included; the cosine runs to
    `lr * min_lr_ratio` at this count. 0 = constant `lr` after warmup."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of `lr`."""
    b1: float = 0.9
    """Adam β₁."""
    b2: float = 0.999
    """Adam β₂."""
    eps: float = 1e-8
    """Adam ε."""
    weight_decay: float = 0.01
    """Decoupled weight decay, on matrices only (not norm scales)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this before Adam. 0 = no clipping."""
    hf_padding_idx: bool = False
    """Train the input embedding as transformers builds it (TRL, the HF Trainer): the pad
    token's row gets no gradient from its lookups (`ModelConfig.embedding_padding_idx`).
    Where the pad is a real token (SmolLM2's is <|im_end|>, in every chat turn) that leaves
    how it is read untrained; off by default (on the real model's task it changed no
    measured accuracy: docs/real_model.md)."""

    def __post_init__(self):
        if self.lr < 0 or self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError(f"lr, warmup_steps and decay_steps must be >= 0: {self}")
        if self.decay_steps and self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"decay_steps={self.decay_steps} must exceed warmup_steps={self.warmup_steps}")


AUTO_ACCUM = 0
"""`LearnerConfig.grad_accum`: let the train step choose (`rl.micro_batches`)."""


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Everything `train_step` needs besides the model config. Hashable: a jit static arg."""

    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    """The objective."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """The optimizer."""
    grad_accum: int = 0
    """Micro-batches per mini-batch; gradients are summed over them (the objective is
    unchanged: every denominator is a global count of the whole mini-batch). 0 (AUTO_ACCUM,
    the default): chosen per step from its shapes, on CPU so a micro-batch's logits stay in
    cache, elsewhere 1 (`rl.micro_batches`)."""
    temperature: float = 1.0
    """Sampling temperature; must equal the sampler's so logprobs are of the same policy."""
    logprob_chunk: int = -1
    """Compute logits in chunks of this many positions, each rematerialised in the backward,
    so no step holds more than one chunk's [B, chunk, V] logits. -1 (default): automatic,
    chunks of at most 64 MiB once a micro-batch's whole [B, T, V] f32 logits would exceed
    256 MiB (large vocabularies; `decoder.logprob_chunk_size`); 0 = never chunk."""
    remat: bool = False
    """Rematerialise each decoder layer in the backward (activation checkpointing): keep
    only each layer's input, recompute the rest; about one more forward of compute."""
    rules: str = "train_dp"
    """How params are sharded in training (`model.sharding.RULES`): train_dp replicates them,
    train_fsdp also shards them over the mesh's `fsdp` axis. With a mesh given to
    `train_step`, the new state is pinned to these shardings."""
    skip_nonfinite: bool = False
    """On NaN/inf in the loss or gradients: False stops the run with `NonFiniteError`;
    True leaves params and optimizer state unchanged and counts `actor/skipped_steps`."""

    def __post_init__(self):
        if self.grad_accum < 0:
            raise ValueError(f"grad_accum must be >= 1, or {AUTO_ACCUM} (auto), got "
                             f"{self.grad_accum}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.logprob_chunk < -1:
            raise ValueError(f"logprob_chunk must be >= 0 or -1 (auto), got {self.logprob_chunk}")
        if self.rules not in ("train_dp", "train_fsdp"):
            raise ValueError(f"rules must be 'train_dp' or 'train_fsdp', got {self.rules!r}")

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates in one train step: μ × num_minibatches."""
        return self.algo.ppo_epochs * self.algo.num_minibatches

    @property
    def rows_multiple(self) -> int:
        """The global batch size must be a multiple of this (mini- × micro-batches)."""
        return self.algo.num_minibatches * max(1, self.grad_accum)  # auto picks a divisor
