"""The learner's state (params, optimizer state, counters) and its optimizer.

AdamW (Loshchilov & Hutter 2019) after global-norm clipping, with linear warmup then a
cosine decay. Weight decay skips norm scales; which weights those are comes from the
weight declarations (`init == "ones"`), not from name matching.

Under LoRA (`ModelConfig.lora`) `params` are the adapters alone, and every piece here
(optimizer, moments, shardings) sees only them; the frozen base rides along in `frozen`
(donated with the state and returned untouched: no copy), read by the forward only.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from locojax.model.config import ModelConfig
from locojax.model import lora
from locojax.model.params import Weights, is_decl
from locojax.model.params import abstract as abstract_weights
from locojax.model.sharding import RULES, weight_shardings
from locojax.rl.config import OptimConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: Weights
    opt_state: optax.OptState
    step: jax.Array  # [] int32: train steps taken (each is μ × num_minibatches updates)
    skipped: jax.Array  # [] int32: optimizer updates rejected for a non-finite loss or grads
    frozen: Weights | None = None  # LoRA: the base weights, never updated; else None


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
    """True for weights that get weight decay: matrices, not norm scales or biases; under
    LoRA every adapter (A and B, as the HF Trainer decays PEFT's)."""
    decay = ("normal", "lora_a", "zeros") if lora.enabled(model_cfg) else ("normal",)
    return jax.tree.map(lambda d: d.init in decay, lora.trainable_declare(model_cfg),
                        is_leaf=is_decl)


def trainable_shardings(model_cfg: ModelConfig, mesh, rules: str):
    """The `rules` shardings of what the optimizer trains (`lora.trainable_declare`)."""
    return weight_shardings(model_cfg, mesh, RULES[rules], lora.trainable_declare(model_cfg))


def optimizer(cfg: OptimConfig, model_cfg: ModelConfig) -> optax.GradientTransformation:
    clip = optax.clip_by_global_norm(cfg.max_grad_norm) if cfg.max_grad_norm else optax.identity()
    adamw = optax.adamw(schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay, mask=decay_mask(model_cfg))
    return optax.chain(clip, adamw)


_COUNTED = (optax.ScaleByAdamState, optax.ScaleByScheduleState)


def apply_in_place(params: Weights, opt_state, grads: Weights, grad_norm, ok, cfg: OptimConfig,
                   model_cfg: ModelConfig):
    """`optimizer(cfg)`'s update then `optax.apply_updates`, or no change at all where `ok`
    is False; returns (params, opt_state) in `optimizer(cfg)`'s own state structure.

    The same arithmetic as optax's chain (clip_by_global_norm, scale_by_adam, masked
    add_decayed_weights, scale_by_schedule of -lr), written out so that every buffer is
    updated in place: each new moment is computed from its old value alone and the params
    from the new moments. Through optax, with a `where` keeping the old state on a
    non-finite step, XLA kept a copy of Adam's μ and a divided copy of the gradients: 2.7 GB
    more temporaries at Qwen3-0.6B (docs/real_size.md). Departure: the clip multiplies by
    max_norm / ‖g‖ (optax divides by ‖g‖, then multiplies), because XLA materialises a
    divided copy of every gradient that two consumers read.
    """
    is_counted = lambda x: isinstance(x, _COUNTED)  # noqa: E731
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=is_counted) if is_counted(x)]
    adam = next(x for x in found if isinstance(x, optax.ScaleByAdamState))
    sched = next(x for x in found if isinstance(x, optax.ScaleByScheduleState))
    keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
    if cfg.max_grad_norm:
        scale = cfg.max_grad_norm / grad_norm
        grads = jax.tree.map(lambda g: jax.lax.select(
            grad_norm < cfg.max_grad_norm, g, g * scale.astype(g.dtype)), grads)
    mu = jax.tree.map(lambda g, m: keep((1 - cfg.b1) * g + cfg.b1 * m, m), grads, adam.mu)
    nu = jax.tree.map(lambda g, v: keep((1 - cfg.b2) * (g ** 2) + cfg.b2 * v, v), grads, adam.nu)
    count = optax.safe_increment(adam.count)
    step_size = -1 * schedule(cfg)(sched.count)

    def new_param(p, m, v, decay):
        m_hat = optax.tree.bias_correction(m, cfg.b1, count)
        v_hat = optax.tree.bias_correction(v, cfg.b2, count)
        u = m_hat / (jnp.sqrt(v_hat + 0.0) + cfg.eps)
        if decay and cfg.weight_decay:
            u = u + cfg.weight_decay * p
        return keep(jnp.asarray(p + jnp.array(step_size, u.dtype) * u).astype(p.dtype), p)

    params = jax.tree.map(new_param, params, mu, nu, decay_mask(model_cfg))
    counts = {id(adam): adam._replace(count=keep(count, adam.count), mu=mu, nu=nu),
              id(sched): sched._replace(count=keep(optax.safe_increment(sched.count),
                                                   sched.count))}
    opt_state = jax.tree.map(lambda x: counts[id(x)] if is_counted(x) else x, opt_state,
                             is_leaf=is_counted)
    return params, opt_state


def adam_count(opt_state) -> jax.Array:
    """Optimizer updates applied so far (Adam's bias-correction count)."""
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(
        x, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)]
    if len(found) != 1:
        raise ValueError(f"expected one ScaleByAdamState in the optimizer state, found "
                         f"{len(found)}")
    return found[0].count


def init(params: Weights, cfg: OptimConfig, model_cfg: ModelConfig,
         frozen: Weights | None = None) -> TrainState:
    """A fresh state around `params` (under LoRA the adapters, `frozen` the base), placed
    like them.

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
    return TrainState(params=params, opt_state=opt_state, step=step, skipped=skipped,
                      frozen=frozen)


def abstract(model_cfg: ModelConfig, cfg: OptimConfig, mesh, rules: str = "train_dp"):
    """ShapeDtypeStructs of `init(params, cfg, model_cfg)` for params placed by the `rules`
    shardings on `mesh`, placed as `init` places them (moments like their params, scalars
    replicated): what lowering `train_step` for this state needs, without any weights."""
    shardings = trainable_shardings(model_cfg, mesh, rules)
    like = lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)  # noqa: E731
    trainable = lora.abstract(model_cfg) if lora.enabled(model_cfg) else abstract_weights(
        model_cfg)
    weights = jax.tree.map(like, trainable, shardings)
    shaped = jax.eval_shape(lambda p: optimizer(cfg, model_cfg).init(p), weights)
    treedef = jax.tree.structure(shardings)
    is_params = lambda x: jax.tree.structure(x) == treedef  # noqa: E731
    replicated = NamedSharding(mesh, P())

    def place(x):
        if is_params(x):
            return jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                                x, shardings)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)

    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
    frozen = None
    if lora.enabled(model_cfg):
        base = jax.tree.map(lambda a: a.update(dtype=model_cfg.lora.base_dtype),
                            abstract_weights(model_cfg))
        frozen = jax.tree.map(like, base, weight_shardings(model_cfg, mesh, RULES[rules]))
    return TrainState(params=weights, opt_state=jax.tree.map(place, shaped, is_leaf=is_params),
                      step=scalar, skipped=scalar, frozen=frozen)


def pin(state: TrainState, model_cfg: ModelConfig, mesh, rules: str) -> TrainState:
    """Inside a jit: constrain params and every params-shaped optimizer subtree (Adam's
    moments) to the rules' shardings, scalars to replicated. Without this XLA may choose
    different output shardings (seen: a norm scale coming back sharded over `fsdp`), which
    defeats donation and recompiles the next step for the new input shardings."""
    shardings = trainable_shardings(model_cfg, mesh, rules)
    treedef = jax.tree.structure(shardings)
    wsc = jax.lax.with_sharding_constraint
    replicated = NamedSharding(mesh, P())
    is_params = lambda x: jax.tree.structure(x) == treedef  # noqa: E731

    def one(x):
        return jax.tree.map(wsc, x, shardings) if is_params(x) else wsc(x, replicated)

    return TrainState(params=jax.tree.map(wsc, state.params, shardings),
                      opt_state=jax.tree.map(one, state.opt_state, is_leaf=is_params),
                      step=wsc(state.step, replicated), skipped=wsc(state.skipped, replicated),
                      frozen=None if state.frozen is None else jax.tree.map(
                          wsc, state.frozen, weight_shardings(model_cfg, mesh, RULES[rules])))
