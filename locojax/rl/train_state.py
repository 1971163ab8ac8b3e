"""The learner's state (params, optimizer state, counters) and its optimizer.

AdamW (Loshchilov & Hutter 2019) after global-norm clipping, with linear warmup then a
cosine decay. Weight decay skips norm scales; which weights those are comes from the
weight declarations (`init == "ones"`), not from name matching.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from locojax.model.config import ModelConfig
from locojax.model.params import Weights, declare, is_decl
from locojax.model.sharding import RULES, weight_shardings
from locojax.rl.config import OptimConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: Weights
    opt_state: optax.OptState
    step: jax.Array  # [] int32: train steps taken (each is μ × num_minibatches updates)
    skipped: jax.Array  # [] int32: optimizer updates rejected for a non-finite loss or grads


def schedule(cfg: OptimConfig):
    """lr as a function of the optimizer's update count n (updates already applied).

    Update n (0-based) uses lr·min(1, (n+1)/warmup), so the first update is not wasted at
    lr 0, times a cosine from 1 down to `min_lr_ratio` between warmup and `decay_steps`.
    """

    def lr(count):
        n = jnp.asarray(count, jnp.float32) + 1.0
        warm = jnp.minimum(1.0, n / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        if not cfg.decay_steps:
            return jnp.asarray(cfg.lr * warm, jnp.float32)
        span = cfg.decay_steps - cfg.warmup_steps
        progress = jnp.clip((n - cfg.warmup_steps) / span, 0.0, 1.0)
        cosine = 0.5 * (1.0 + jnp.cos(math.pi * progress))
        return cfg.lr * warm * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)

    return lr


def decay_mask(model_cfg: ModelConfig):
    """True for weights that get weight decay: matrices, not norm scales."""
    return jax.tree.map(lambda d: d.init != "ones", declare(model_cfg), is_leaf=is_decl)


def optimizer(cfg: OptimConfig, model_cfg: ModelConfig) -> optax.GradientTransformation:
    clip = optax.clip_by_global_norm(cfg.max_grad_norm) if cfg.max_grad_norm else optax.identity()
    adamw = optax.adamw(schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay, mask=decay_mask(model_cfg))
    return optax.chain(clip, adamw)


def adam_count(opt_state) -> jax.Array:
    """Optimizer updates applied so far (Adam's bias-correction count)."""
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(
        x, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)]
    if len(found) != 1:
        raise ValueError(f"expected one ScaleByAdamState in the optimizer state, found "
                         f"{len(found)}")
    return found[0].count


def init(params: Weights, cfg: OptimConfig, model_cfg: ModelConfig) -> TrainState:
    """A fresh state around `params`, placed like them.

    Adam's moments inherit each param's sharding; scalars are replicated over the params'
    mesh, so the state is a valid input to a jit over that mesh in multi-process runs too.
    """
    opt_state = optimizer(cfg, model_cfg).init(params)
    step, skipped = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)
    sharding = jax.tree.leaves(params)[0].sharding
    if isinstance(sharding, NamedSharding):
        replicated = NamedSharding(sharding.mesh, P())
        put = lambda x: jax.device_put(x, replicated) if x.ndim == 0 else x  # noqa: E731
        opt_state = jax.tree.map(put, opt_state)
        step, skipped = put(step), put(skipped)
    return TrainState(params=params, opt_state=opt_state, step=step, skipped=skipped)


def pin(state: TrainState, model_cfg: ModelConfig, mesh, rules: str) -> TrainState:
    """Inside a jit: constrain params and every params-shaped optimizer subtree (Adam's
    moments) to the rules' shardings, scalars to replicated. Without this XLA may choose
    different output shardings (seen: a norm scale coming back sharded over `fsdp`), which
    defeats donation and recompiles the next step for the new input shardings."""
    shardings = weight_shardings(model_cfg, mesh, RULES[rules])
    treedef = jax.tree.structure(shardings)
    wsc = jax.lax.with_sharding_constraint
    replicated = NamedSharding(mesh, P())
    is_params = lambda x: jax.tree.structure(x) == treedef  # noqa: E731

    def one(x):
        return jax.tree.map(wsc, x, shardings) if is_params(x) else wsc(x, replicated)

    return TrainState(params=jax.tree.map(wsc, state.params, shardings),
                      opt_state=jax.tree.map(one, state.opt_state, is_leaf=is_params),
                      step=wsc(state.step, replicated), skipped=wsc(state.skipped, replicated))
