"""One learner step: μ passes of mini-batch updates, each summing micro-batch gradients.

`train_step(state, batch, ref_params, *, model_cfg, cfg, mesh) -> (state, metrics)` is
jitted at module level and donates the state. Its input batch is the global array (sharded over the
mesh's `data` axis); the params' sharding decides data parallel or FSDP. In order:

  1. reference logprobs, only when β > 0 and the batch lacks them (β = 0: no ref forward);
  2. π_old logprobs, only when the step takes more than one update (μ > 1 or several
     mini-batches); with one update π_old is exactly sg(π_θ) and needs no extra forward;
  3. per mini-batch, the global `Counts`, computed once before micro-batching;
  4. the μ × M updates (a `lax.scan` when there are several): each sums the gradients of
     its micro-batches' (partial sum / global count) losses (a `lax.scan` when
     grad_accum > 1), then applies AdamW, unless the loss or the gradient norm is
     non-finite, in which case params and optimizer state are kept (`where`);
  5. given the `mesh`, the new state is pinned to the params' sharding rules, so the
     donated buffers are reused and the next step sees the same input shardings.

The first update of a step always uses π_old = sg(π_θ), bitwise the same params, so its
ratio is exactly 1 and nothing is clipped. `update` is the host-side wrapper that checks
the batch, calls `train_step`, fetches metrics and raises `NonFiniteError` unless
`skip_nonfinite` is set.

References: PPO epochs/mini-batches as in Schulman et al. 2017 and verl's `dp_actor.py`;
global-count normalisation is `aggregation.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax

from locojax.model import qwen3
from locojax.model.config import ModelConfig
from locojax.model.params import Weights
from locojax.rl import batch as batch_lib
from locojax.rl.aggregation import Counts, global_counts
from locojax.rl.algorithms import resolve
from locojax.rl.batch import TrainBatch, split_rows
from locojax.rl.config import LearnerConfig
from locojax.rl.losses import LossSettings, is_weight_histogram, is_weight_quantiles, objective
from locojax.rl.train_state import TrainState, adam_count, optimizer, pin, schedule

logger = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """The loss or the gradients of a train step were NaN or inf.

    `state` is the state after the step, with the rejected updates not applied (the input
    state was donated), e.g. for a last checkpoint.
    """

    def __init__(self, state, message: str):
        super().__init__(message)
        self.state = state


def sequence_logprobs(params: Weights, tokens, positions, attn_mask, model_cfg: ModelConfig,
                      temperature: float = 1.0, chunk: int = 0, unroll: bool = False):
    """log π(tokens[b, t] | tokens[b, :t]) and the entropy of that distribution, [B, T] each.

    Aligned with `tokens`; column 0 (no context to predict it from) is 0. The hidden state
    at t predicts token t + 1, so the forward runs on tokens[:, :-1]. `unroll`: see
    `qwen3.forward` (set where the result is differentiated).
    """
    hidden, _ = qwen3.forward(params, tokens[:, :-1], positions[:, :-1], model_cfg,
                              mask=attn_mask[:, :-1], unroll=unroll)  # [B, T-1, D]
    logp, ent = qwen3.token_logprobs(params, hidden, tokens[:, 1:], model_cfg, temperature, chunk)
    zero = jnp.zeros((tokens.shape[0], 1), jnp.float32)
    return jnp.concatenate([zero, logp], axis=1), jnp.concatenate([zero, ent], axis=1)


compute_logprobs = jax.jit(sequence_logprobs,
                           static_argnames=("model_cfg", "temperature", "chunk"))
"""Jitted `sequence_logprobs`, e.g. for reference logprobs outside the step."""


def _unsplit(x):
    """Inverse of `split_rows`: [parts, B / parts, ...] → [B, ...]."""
    return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _scan_logprobs(params, batch: TrainBatch, parts: int, model_cfg, cfg: LearnerConfig):
    """No-grad logprobs of the whole batch, `parts` rows-chunks at a time (bounded memory)."""
    def one(rows):
        tokens, positions, attn = rows
        return sequence_logprobs(params, tokens, positions, attn, model_cfg, cfg.temperature,
                                 cfg.logprob_chunk)[0]

    rows = tuple(split_rows(x, parts) for x in (batch.tokens, batch.positions, batch.attn_mask))
    return jax.lax.stop_gradient(_unsplit(jax.lax.map(one, rows)))


def _micro_loss(params, data, counts: Counts, first, fresh_tokens, s: LossSettings,
                model_cfg: ModelConfig, cfg: LearnerConfig):
    """Loss share and metric shares of one micro-batch (global denominators throughout)."""
    b: TrainBatch = data["batch"]
    logp, ent = sequence_logprobs(params, b.tokens, b.positions, b.attn_mask, model_cfg,
                                  cfg.temperature, cfg.logprob_chunk,
                                  unroll=qwen3.unroll_for_grad(model_cfg))
    own = jax.lax.stop_gradient(logp)  # π_θ before any update of this step, bitwise
    old = own if data["prox"] is None else jnp.where(first, own, data["prox"])
    loss, metrics, extremes = objective(logp, ent, old, b.old_logprobs, b.ref_logprobs,
                                        b.advantages, b.loss_mask, data["stale"], counts, s)
    if b.staleness is not None:  # asynchronous modes: the distribution of the IS weights
        metrics["actor/is_weight_hist"] = is_weight_histogram(
            old, b.old_logprobs, b.loss_mask, data["stale"], counts, s.is_cap, s.ratio_level)
    if data["prox"] is None:  # one update per step: `old` is the trainer's start-of-step π
        fresh = b.loss_mask & data["fresh"][:, None]
        gap = jnp.where(fresh, jnp.abs(jnp.where(fresh, b.old_logprobs, 0.0) - old), 0.0)
        metrics["rollout/logprob_mismatch"] = jnp.sum(gap) / jnp.maximum(fresh_tokens, 1.0)
    return loss, (metrics, extremes)


def _accumulate(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg):
    """Σ over micro-batches (leading axis of `micro`) of loss, gradients and metric shares."""
    loss_fn = functools.partial(_micro_loss, counts=counts, first=first,
                                fresh_tokens=fresh_tokens, s=s, model_cfg=model_cfg, cfg=cfg)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    one = jax.tree.map(lambda x: x[0], micro)
    (_, (m_shape, e_shape)), _ = jax.eval_shape(grad_fn, params, one)
    init = (
        jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
        jnp.zeros((), jnp.float32),
        jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), m_shape),
        {k: jnp.full((), -jnp.inf if k.endswith("_max") else jnp.inf) for k in e_shape},
    )

    def body(acc, data):
        grads, loss, metrics, extremes = acc
        (l, (m, e)), g = grad_fn(params, data)
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        metrics = jax.tree.map(jnp.add, metrics, m)
        extremes = {k: (jnp.maximum if k.endswith("_max") else jnp.minimum)(v, e[k])
                    for k, v in extremes.items()}
        return (grads, loss + l, metrics, extremes), None

    if jax.tree.leaves(micro)[0].shape[0] == 1:  # no loop: the common case compiles smaller
        (grads, loss, metrics, extremes), _ = body(init, one)
    else:
        (grads, loss, metrics, extremes), _ = jax.lax.scan(body, init, micro)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return grads, loss, {**metrics, **extremes}


def _apply(state: TrainState, grads, loss, model_cfg, cfg: LearnerConfig):
    """AdamW on `grads`, or no change at all if the loss or gradients are non-finite."""
    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    lr = schedule(cfg.optim)(adam_count(state.opt_state))
    updates, opt_state = optimizer(cfg.optim, model_cfg).update(grads, state.opt_state,
                                                                  state.params)
    params = optax.apply_updates(state.params, updates)
    keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(ok, new, old))
    state = dataclasses.replace(state, params=keep(params, state.params),
                                opt_state=keep(opt_state, state.opt_state),
                                skipped=state.skipped + (~ok).astype(jnp.int32))
    metrics = {"actor/grad_norm": grad_norm, "actor/lr": lr,
               "actor/nonfinite_loss": (~jnp.isfinite(loss)).astype(jnp.float32),
               "actor/nonfinite_grad": (~jnp.isfinite(grad_norm)).astype(jnp.float32)}
    return state, metrics


def _prepare(params, batch: TrainBatch, ref_params, model_cfg, cfg: LearnerConfig):
    """Everything computed once per step, before any update: ref / π_old logprobs, row
    flags, and the per-mini-batch global counts. Returns per-update data laid out
    [M, k, B / (M k), ...] (mini-batch, micro-batch, rows)."""
    _, s = resolve(cfg.algo)
    n_mini, k = cfg.algo.num_minibatches, cfg.grad_accum
    rows = batch.tokens.shape[0]
    stale = (jnp.zeros((rows,), bool) if batch.staleness is None else batch.staleness > 0)
    fresh = ~stale
    if s.is_all_samples:
        stale = jnp.ones((rows,), bool)
    if not s.beta:
        batch = dataclasses.replace(batch, ref_logprobs=None)  # never read, never computed
    elif batch.ref_logprobs is None:
        ref = _scan_logprobs(ref_params, batch, n_mini * k, model_cfg, cfg)
        batch = dataclasses.replace(batch, ref_logprobs=ref)
    fresh_mask = batch.loss_mask & fresh[:, None]
    fresh_tokens = jnp.sum(fresh_mask.astype(jnp.float32))

    extra = {}
    prox = None
    if cfg.updates_per_step > 1:  # later updates need π_old of the start-of-step params
        prox = _scan_logprobs(params, batch, n_mini * k, model_cfg, cfg)
        gap = jnp.where(fresh_mask, jnp.abs(jnp.where(fresh_mask, batch.old_logprobs, 0) - prox),
                        0.0)
        extra["rollout/logprob_mismatch"] = jnp.sum(gap) / jnp.maximum(fresh_tokens, 1.0)

    def layout(x):  # [B, ...] → [M, k, B/(M k), ...]; both splits strided, so device-local
        x = split_rows(x, n_mini)
        return jax.vmap(lambda y: split_rows(y, k))(x)

    data = jax.tree.map(layout, {"batch": batch, "prox": prox, "stale": stale, "fresh": fresh})
    counts = jax.vmap(global_counts)(split_rows(batch.loss_mask, n_mini))  # [M] each
    return data, counts, fresh_tokens, extra, s


def _train_step(state: TrainState, batch: TrainBatch, ref_params=None, *,
                model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None,
                return_grads: bool = False):
    logger.info("compiling train_step: batch %s, algo %s, %d update(s) x %d micro-batch(es)",
                batch.tokens.shape, cfg.algo.name, cfg.updates_per_step, cfg.grad_accum)
    data, counts, fresh_tokens, extra, s = _prepare(state.params, batch, ref_params, model_cfg,
                                                    cfg)
    n_mini = cfg.algo.num_minibatches

    def update(state, i):
        m = i % n_mini
        pick = lambda x: x[m]  # noqa: E731
        grads, loss, metrics = _accumulate(state.params, jax.tree.map(pick, data),
                                           jax.tree.map(pick, counts), i == 0, fresh_tokens, s,
                                           model_cfg, cfg)
        state, opt_metrics = _apply(state, grads, loss, model_cfg, cfg)
        if mesh is not None:
            state = pin(state, model_cfg, mesh, cfg.rules)
        return state, ({**metrics, **opt_metrics}, grads if return_grads else None)

    if cfg.updates_per_step == 1:  # no loop: the common case compiles smaller
        state, (metrics, grads) = update(state, jnp.int32(0))
        per_update = jax.tree.map(lambda x: jnp.asarray(x)[None], metrics)
    else:
        state, (per_update, grads) = jax.lax.scan(update, state,
                                                  jnp.arange(cfg.updates_per_step))
        grads = jax.tree.map(lambda g: g[0], grads)
    metrics = {}
    for name, v in per_update.items():  # [U] each → one number per step
        if name.endswith("_max"):
            metrics[name] = v.max()
        elif name.endswith("_min"):
            metrics[name] = v.min()
        elif name.endswith("_hist"):
            metrics[name] = v.mean(axis=0)  # [U, bins] → [bins]
        elif name.startswith("actor/nonfinite") or name == "rollout/logprob_mismatch":
            metrics[name] = v.sum()  # counts; and the mismatch share of the one update
        else:
            metrics[name] = v.mean()
    metrics.update(extra)
    metrics["actor/skipped_steps"] = state.skipped.astype(jnp.float32)
    state = dataclasses.replace(state, step=state.step + 1)
    return (state, metrics, grads) if return_grads else (state, metrics)


train_step = jax.jit(_train_step, static_argnames=("model_cfg", "cfg", "mesh", "return_grads"),
                     donate_argnames=("state",))
"""(state, batch, ref_params=None, *, model_cfg, cfg, mesh=None, return_grads=False)
-> (state, metrics). Donates `state`. Given the `mesh` the params live on, the new state
is pinned to `cfg.rules`' shardings (pass it whenever params are sharded). With
`return_grads` it also returns the first update's gradients as they entered the optimizer
(before clipping): what the layout-invariance harness compares."""


def check(batch: TrainBatch, cfg: LearnerConfig, ref_params=None) -> None:
    """Host-side checks with clear messages, before anything is traced."""
    batch_lib.validate(batch)
    _, s = resolve(cfg.algo)
    rows = batch.tokens.shape[0]
    if rows % cfg.rows_multiple:
        raise ValueError(
            f"batch of {rows} rows does not split into num_minibatches="
            f"{cfg.algo.num_minibatches} x grad_accum={cfg.grad_accum} equal micro-batches; "
            f"pad it with batch.pad_rows(batch, {cfg.rows_multiple})")
    if s.beta and batch.ref_logprobs is None and ref_params is None:
        raise ValueError(f"beta={s.beta} needs reference logprobs: set TrainBatch.ref_logprobs "
                         "or pass ref_params")


def _kind(x: float) -> str:
    return "nan" if np.isnan(x) else "inf" if np.isinf(x) else "non-finite"


def update(state: TrainState, batch: TrainBatch, model_cfg: ModelConfig, cfg: LearnerConfig,
           ref_params=None, mesh=None) -> tuple[TrainState, dict[str, float]]:
    """Check, run one `train_step` (donating `state`), fetch metrics as floats.

    Raises `NonFiniteError` naming the step if an update was non-finite, unless
    `cfg.skip_nonfinite`; either way the rejected update changed neither params nor
    optimizer state, and `actor/skipped_steps` counts it.
    """
    check(batch, cfg, ref_params)
    # The policy is applied here, not in the program: one compiled step serves both.
    traced_cfg = dataclasses.replace(cfg, skip_nonfinite=False)
    state, metrics = train_step(state, batch, ref_params, model_cfg=model_cfg, cfg=traced_cfg,
                                mesh=mesh)
    metrics = jax.device_get(metrics)
    hist = metrics.pop("actor/is_weight_hist", None)
    metrics = {k: float(v) for k, v in metrics.items()}
    if hist is not None:
        metrics.update(is_weight_quantiles(hist))
    bad_loss, bad_grad = metrics["actor/nonfinite_loss"], metrics["actor/nonfinite_grad"]
    if (bad_loss or bad_grad) and not cfg.skip_nonfinite:
        step = int(np.asarray(jax.device_get(state.step))) - 1
        n = cfg.updates_per_step
        what = []
        if bad_loss:
            what.append(f"loss is {_kind(metrics['actor/pg_loss'])} in {bad_loss:.0f} of {n} "
                        "update(s)")
        if bad_grad:
            what.append(f"gradient norm is {_kind(metrics['actor/grad_norm'])} in "
                        f"{bad_grad:.0f} of {n} update(s)")
        raise NonFiniteError(state, f"step {step}: {'; '.join(what)}. Those updates were not "
                             "applied (params and optimizer state unchanged). Set "
                             "LearnerConfig.skip_nonfinite=True to skip and count them instead.")
    return state, metrics
