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
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from locojax.model import decoder
from locojax.model.config import ModelConfig
from locojax.model.params import Weights
from locojax.rl import batch as batch_lib
from locojax.rl import micro_batches
from locojax.rl.aggregation import Counts, global_counts
from locojax.rl.algorithms import resolve
from locojax.rl.batch import TrainBatch, split_rows, unsplit_rows
from locojax.rl.config import LearnerConfig
from locojax.rl.losses import LossSettings, is_weight_histogram, is_weight_quantiles, objective
from locojax.rl.train_state import TrainState, adam_count, apply_in_place, pin, schedule

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
                      temperature: float = 1.0, chunk: int = decoder.AUTO_CHUNK,
                      unroll: bool = False, remat: bool = False,
                      prefix: batch_lib.SharedPrefix | None = None):
    """log π(tokens[b, t] | tokens[b, :t]) and the entropy of that distribution, [B, T] each.

    Aligned with `tokens`; column 0 (no context to predict it from) is 0. The hidden state
    at t predicts token t + 1, so the forward runs on tokens[:, :-1]. `unroll`, `remat`: see
    `decoder.forward` (set where the result is differentiated); `chunk`: `decoder.token_logprobs`.

    `prefix` (a `TrainBatch.shared_prefix`, P columns): columns 1..P-1 hold no target, so
    their logits are skipped and they read 0. With groups of G > 1 rows the prompt's forward
    runs once per group (`prefix_hidden`): same objective, same gradients, a third fewer
    FLOPs at SMALL. Only valid for whole groups: the caller passes None otherwise.
    """
    b = tokens.shape[0]
    if prefix is None:
        hidden, _ = decoder.forward(params, tokens[:, :-1], positions[:, :-1], model_cfg,
                                    mask=attn_mask[:, :-1], unroll=unroll,
                                    remat=remat)  # [B, T-1, D]
        logp, ent = decoder.token_logprobs(params, hidden, tokens[:, 1:], model_cfg, temperature,
                                           chunk)
        zero = jnp.zeros((b, 1), logp.dtype)
        return jnp.concatenate([zero, logp], axis=1), jnp.concatenate([zero, ent], axis=1)
    p = prefix.columns
    if prefix.group > 1:
        hidden = prefix_hidden(params, tokens, positions, attn_mask, model_cfg, p,
                               prefix.group, unroll, remat)
    else:
        hidden, _ = decoder.forward(params, tokens[:, :-1], positions[:, :-1], model_cfg,
                                    mask=attn_mask[:, :-1], unroll=unroll, remat=remat)
        hidden = hidden[:, p - 1:]  # [B, T-P, D]: the positions that predict targets
    logp, ent = decoder.token_logprobs(params, hidden, tokens[:, p:], model_cfg, temperature,
                                       chunk)
    zero = jnp.zeros((b, p), logp.dtype)
    return jnp.concatenate([zero, logp], axis=1), jnp.concatenate([zero, ent], axis=1)


def prefix_hidden(params, tokens, positions, attn_mask, model_cfg, p: int, g: int, unroll,
                  remat: bool = False):
    """Hidden states [B, T-P, D] of positions P-1 .. T-2, the prompt run once per group.

    The first row of each group holds the group's prompt. One scan over the layers runs, per
    layer, the prompt's rows [B/G, P], then the responses [B, T-P-1], which attend to that
    layer's prompt keys and values (repeated G times, so the backward sums the G rows'
    cotangents into one prompt backward), then causally to each other. One scan, not a
    prompt scan then a response scan: two scans over the same layers each stacked a gradient
    of every layer's weights before their sum (1.76 GB more at 0.6B, docs/real_size.md), and
    the repeated keys and values of all layers at once. The hidden state at P - 1 predicts
    every row's first response token. Reshapes keep groups inside a device's rows.
    """
    cfg, b = model_cfg, tokens.shape[0]
    first = lambda x: x.reshape(b // g, g, *x.shape[1:])[:, 0, :p]  # noqa: E731  [B/G, P]

    def rows(x):  # [B/G, ...] → [B, ...], each group's entry G times
        return jnp.broadcast_to(x[:, None], (x.shape[0], g, *x.shape[1:])).reshape(b, *x.shape[1:])

    pos_p, mask_p = first(positions), first(attn_mask)  # [B/G, P]
    pos_r, mask_r = positions[:, p:-1], attn_mask[:, p:-1]  # [B, R-1]
    r = pos_r.shape[1]
    causal_p = jnp.tril(jnp.ones((p, p), bool))[None] & mask_p[:, None, :]  # [B/G, P, P]
    causal_r = jnp.tril(jnp.ones((r, r), bool))[None] & mask_r[:, None, :]  # [B, R-1, R-1]
    visible_r = (jnp.broadcast_to(rows(mask_p)[:, None], (b, r, p)), causal_r)

    def body(carry, xs):
        (x_p, x_r), (w, kind) = carry, xs
        x_p, (k, v) = decoder.layer(cfg, x_p, w, pos_p, (None, causal_p), kind=kind)
        x_r, _ = decoder.layer(cfg, x_r, w, pos_r, visible_r, (rows(k), rows(v), rows(pos_p)),
                               kind)
        return (x_p, x_r), None

    if remat:  # prevent_cse is needed only where the scan is unrolled into straight code
        body = jax.checkpoint(body, prevent_cse=unroll)
    embed = lambda t: decoder.embed(params, t, cfg)  # noqa: E731  [., ., D]
    kinds = decoder.layer_kinds(cfg, decoder.wide_dtype(cfg.dtype))
    (x_p, x_r), _ = jax.lax.scan(body, (embed(first(tokens)), embed(tokens[:, p:-1])),
                                 (params["layers"], kinds), unroll=unroll)
    norm = lambda x: decoder.final_norm(params, x, cfg)  # noqa: E731
    return jnp.concatenate([rows(norm(x_p[:, -1:])), norm(x_r)], axis=1)


compute_logprobs = jax.jit(sequence_logprobs,
                           static_argnames=("model_cfg", "temperature", "chunk", "unroll", "remat",
                                            "prefix"))
"""Jitted `sequence_logprobs`, e.g. for reference logprobs outside the step."""


def _for_split(batch: TrainBatch, parts: int) -> tuple[TrainBatch, int]:
    """The batch as a split into `parts` row-parts leaves it, and the rows per block that the
    split keeps together (`split_rows`' group).

    With a shared prefix, a split of whole groups (B a multiple of parts · G) keeps it: every
    part still runs each prompt once per group. Otherwise the split interleaves single rows,
    which breaks the groups, so the prefix is kept for its skipped logits alone (group 1)."""
    sp = batch.shared_prefix
    group = batch_lib.split_group(sp, batch.tokens.shape[0], parts)
    if sp is None or group > 1:
        return batch, group
    return dataclasses.replace(batch, shared_prefix=batch_lib.SharedPrefix(sp.columns, 1)), 1


def _scan_logprobs(params, batch: TrainBatch, parts: int, group: int, model_cfg,
                   cfg: LearnerConfig):
    """No-grad logprobs of the whole batch, `parts` rows-chunks at a time (bounded memory);
    `batch` and `group` as `_for_split` gives them."""
    def one(rows):
        tokens, positions, attn = rows
        return sequence_logprobs(params, tokens, positions, attn, model_cfg, cfg.temperature,
                                 cfg.logprob_chunk, prefix=batch.shared_prefix)[0]

    rows = tuple(split_rows(x, parts, group)
                 for x in (batch.tokens, batch.positions, batch.attn_mask))
    return jax.lax.stop_gradient(unsplit_rows(jax.lax.map(one, rows), group))


def _micro_loss(params, data, counts: Counts, first, fresh_tokens, s: LossSettings,
                model_cfg: ModelConfig, cfg: LearnerConfig):
    """Loss share and metric shares of one micro-batch (global denominators throughout)."""
    b: TrainBatch = data["batch"]
    logp, ent = sequence_logprobs(params, b.tokens, b.positions, b.attn_mask, model_cfg,
                                  cfg.temperature, cfg.logprob_chunk,
                                  unroll=decoder.unroll_for_grad(model_cfg), remat=cfg.remat,
                                  prefix=b.shared_prefix)  # as `_for_split` left it
    own = jax.lax.stop_gradient(logp)  # π_θ before any update of this step, bitwise
    old = own if data["prox"] is None else jnp.where(first, own, data["prox"])
    loss, metrics, extremes = objective(logp, ent, old, b.old_logprobs, b.ref_logprobs,
                                        b.advantages, b.loss_mask, data["stale"], counts, s)
    if b.staleness is not None:  # asynchronous modes: the distribution of the IS weights
        metrics["actor/is_weight_hist"] = is_weight_histogram(
            old, b.old_logprobs, b.loss_mask, data["stale"], counts, s.is_cap, s.ratio_level)
    if data["prox"] is None and b.staleness is None:  # `old`: the start-of-step π
        metrics["rollout/logprob_mismatch"] = _mismatch(b.loss_mask & data["fresh"][:, None],
                                                        b.old_logprobs, old, fresh_tokens)
    return loss, (metrics, extremes)


def _mismatch(mask, sampler, trainer, tokens):
    """`rollout/logprob_mismatch`: mean |sampler − trainer| logprob over the tokens the
    sampler drew with this step's params. Measured here only where rollouts are made inline
    (no staleness in the batch); rollout workers measure their own rows (`fleet/`)."""
    gap = jnp.where(mask, jnp.abs(jnp.where(mask, sampler, 0.0) - trainer), 0.0)
    return jnp.sum(gap) / jnp.maximum(tokens, 1.0)


def _accumulate(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg,
                keep_f32: bool = False):
    """Σ over micro-batches (leading axis of `micro`) of loss, gradients and metric shares.

    Gradients come back in the params' dtype, or in the f32 accumulator with `keep_f32`."""
    loss_fn = functools.partial(_micro_loss, counts=counts, first=first,
                                fresh_tokens=fresh_tokens, s=s, model_cfg=model_cfg, cfg=cfg)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    one = jax.tree.map(lambda x: x[0], micro)
    (l_shape, (m_shape, e_shape)), _ = jax.eval_shape(grad_fn, params, one)
    wide = lambda p: jnp.promote_types(p.dtype, jnp.float32)  # noqa: E731  (f64 stays f64)
    init = (
        jax.tree.map(lambda p: jnp.zeros(p.shape, wide(p)), params),
        jnp.zeros((), l_shape.dtype),
        jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), m_shape),
        {k: jnp.full((), -jnp.inf if k.endswith("_max") else jnp.inf, e.dtype)
         for k, e in e_shape.items()},
    )

    def body(acc, data):
        grads, loss, metrics, extremes = acc
        (l, (m, e)), g = grad_fn(params, data)
        grads = jax.tree.map(lambda a, b: a + b.astype(a.dtype), grads, g)
        metrics = jax.tree.map(jnp.add, metrics, m)
        extremes = {k: (jnp.maximum if k.endswith("_max") else jnp.minimum)(v, e[k])
                    for k, v in extremes.items()}
        return (grads, loss + l, metrics, extremes), None

    if jax.tree.leaves(micro)[0].shape[0] == 1:  # no loop: the common case compiles smaller
        (grads, loss, metrics, extremes), _ = body(init, one)
    else:
        (grads, loss, metrics, extremes), _ = jax.lax.scan(body, init, micro)
    if not keep_f32:
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return grads, loss, {**metrics, **extremes}


def flat_allreduce_axis(mesh, cfg: LearnerConfig) -> str | None:
    """The mesh axis to all-reduce gradients over by hand, or None to leave it to XLA.

    Data parallel with replicated params (train_dp) on a mesh whose only axis is `data`,
    of more than one device. XLA would all-reduce every gradient leaf (and metric) as its
    own operand, and XLA:CPU's AllReduceThunk runs a tuple operand by operand: one gloo
    round trip each across hosts. `_accumulate_flat` sends one flat buffer instead. Also
    the layout `split_step` can split (its all-reduce is this one, as its own program).
    """
    if mesh is None or cfg.rules != "train_dp" or tuple(mesh.shape) != ("data",):
        return None
    return "data" if mesh.shape["data"] > 1 else None


def _accumulate_flat(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg, mesh,
                     axis: str):
    """`_accumulate` per device on its own rows, then ONE psum of a flat buffer holding every
    gradient, the loss and the metric sums (and one pmax for the extremes).

    Exactly the sums XLA's partitioner would take (every share is already divided by the
    global counts), only packed: gradients and metrics are those of `_accumulate`."""
    def local(params, micro, counts, first, fresh_tokens):
        return allreduce_sums(*local_sums(params, micro, counts, first, fresh_tokens, s,
                                          model_cfg, cfg), axis)

    rows = P(None, axis)  # micro leaves are [k, rows, ...]
    # check_vma off: the grad-accum scan starts from replicated zeros and carries per-device
    # sums; the outputs are replicated by the psum / pmax above, which out_specs P() states.
    grads, loss, metrics = jax.shard_map(
        local, mesh=mesh, in_specs=(P(), rows, P(), P(), P()), out_specs=P(), check_vma=False,
    )(params, micro, counts, first, fresh_tokens)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return grads, loss, metrics


def local_sums(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg):
    """One device's share of an update, inside `shard_map`: its rows' f32 gradient, loss and
    metric sums (and extremes), before any cross-device reduction."""
    rows = jax.tree.leaves(micro)[0].shape[1]
    sp = micro["batch"].shared_prefix
    if sp is not None and rows % sp.group:  # a device holding part of a group
        micro = {**micro, "batch": dataclasses.replace(
            micro["batch"], shared_prefix=batch_lib.SharedPrefix(sp.columns, 1))}
    return _accumulate(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg,
                       keep_f32=True)


def allreduce_sums(grads, loss, metrics, axis: str):
    """Every device's shares summed over `axis`, inside `shard_map`: one psum of one flat
    buffer (gradients, loss, metric sums) and one pmax of the extremes."""
    lo = [k for k in metrics if k.endswith("_min")]
    hi = [k for k in metrics if k.endswith("_max")]
    sums = {k: v for k, v in metrics.items() if k not in lo and k not in hi}
    flat, unflatten = jax.flatten_util.ravel_pytree((grads, loss, sums))
    grads, loss, sums = unflatten(jax.lax.psum(flat, axis))
    ext = jax.lax.pmax(jnp.stack([metrics[k] for k in hi] + [-metrics[k] for k in lo]), axis)
    sums.update({k: ext[i] for i, k in enumerate(hi)})
    sums.update({k: -ext[len(hi) + i] for i, k in enumerate(lo)})
    return grads, loss, sums


def apply(state: TrainState, grads, loss, model_cfg, cfg: LearnerConfig):
    """AdamW on `grads` (already summed over every device and micro-batch), or no change at
    all if the loss or gradients are non-finite; returns (state, `actor/*` optimizer
    metrics). The step's last piece: `split_step` runs it as a program of its own."""
    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    lr = schedule(cfg.optim)(adam_count(state.opt_state))
    params, opt_state = apply_in_place(state.params, state.opt_state, grads, grad_norm, ok,
                                       cfg.optim, model_cfg)
    state = dataclasses.replace(state, params=params, opt_state=opt_state,
                                skipped=state.skipped + (~ok).astype(jnp.int32))
    metrics = {"actor/grad_norm": grad_norm, "actor/lr": lr,
               "actor/nonfinite_loss": (~jnp.isfinite(loss)).astype(jnp.float32),
               "actor/nonfinite_grad": (~jnp.isfinite(grad_norm)).astype(jnp.float32)}
    return state, metrics


def prepare(params, batch: TrainBatch, ref_params, model_cfg, cfg: LearnerConfig):
    """Everything computed once per step, before any update: ref / π_old logprobs, row
    flags, and the per-mini-batch global counts. Returns (data, counts, fresh_tokens,
    extra metrics, `LossSettings`), data laid out per update [M, k, B / (M k), ...]
    (mini-batch, micro-batch, rows) and counts [M]. Traced inside `train_step`, or as a
    program of its own by `split_step`."""
    _, s = resolve(cfg.algo)
    n_mini, k = cfg.algo.num_minibatches, cfg.grad_accum
    batch, group = _for_split(batch, n_mini * k)
    rows = batch.tokens.shape[0]
    stale = (jnp.zeros((rows,), bool) if batch.staleness is None else batch.staleness > 0)
    fresh = ~stale
    if s.is_all_samples:
        stale = jnp.ones((rows,), bool)
    if not s.beta:
        batch = dataclasses.replace(batch, ref_logprobs=None)  # never read, never computed
    elif batch.ref_logprobs is None:
        ref = _scan_logprobs(ref_params, batch, n_mini * k, group, model_cfg, cfg)
        batch = dataclasses.replace(batch, ref_logprobs=ref)
    fresh_mask = batch.loss_mask & fresh[:, None]
    fresh_tokens = jnp.sum(fresh_mask.astype(jnp.float32))

    extra = {}
    prox = None
    if cfg.updates_per_step > 1:  # later updates need π_old of the start-of-step params
        prox = _scan_logprobs(params, batch, n_mini * k, group, model_cfg, cfg)
        if batch.staleness is None:
            extra["rollout/logprob_mismatch"] = _mismatch(fresh_mask, batch.old_logprobs, prox,
                                                          fresh_tokens)

    def layout(x):  # [B, ...] → [M, k, B/(M k), ...]; both splits strided, so device-local
        x = split_rows(x, n_mini, group)
        return jax.vmap(lambda y: split_rows(y, k, group))(x)

    data = jax.tree.map(layout, {"batch": batch, "prox": prox, "stale": stale, "fresh": fresh})
    counts = jax.vmap(global_counts)(split_rows(batch.loss_mask, n_mini, group))  # [M] each
    return data, counts, fresh_tokens, extra, s


def _train_step(state: TrainState, batch: TrainBatch, ref_params=None, *,
                model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None,
                return_grads: bool = False):
    cfg = micro_batches.resolve(cfg, batch, model_cfg.vocab_size, mesh)
    logger.info("compiling train_step: batch %s, algo %s, %d update(s) x %d micro-batch(es)",
                batch.tokens.shape, cfg.algo.name, cfg.updates_per_step, cfg.grad_accum)
    data, counts, fresh_tokens, extra, s = prepare(state.params, batch, ref_params, model_cfg,
                                                   cfg)
    n_mini = cfg.algo.num_minibatches

    axis = flat_allreduce_axis(mesh, cfg)

    def update(state, i):
        m = i % n_mini
        pick = lambda x: x[m]  # noqa: E731
        args = (state.params, jax.tree.map(pick, data), jax.tree.map(pick, counts), i == 0,
                fresh_tokens, s, model_cfg, cfg)
        if axis is None:
            grads, loss, metrics = _accumulate(*args)
        else:
            grads, loss, metrics = _accumulate_flat(*args, mesh, axis)
        state, opt_metrics = apply(state, grads, loss, model_cfg, cfg)
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
    metrics = {**per_step(per_update), **extra,
               "actor/skipped_steps": state.skipped.astype(jnp.float32)}
    state = dataclasses.replace(state, step=state.step + 1)
    return (state, metrics, grads) if return_grads else (state, metrics)


def per_step(per_update: dict) -> dict:
    """The step's metrics from its updates' ([U] each, [U, bins] for histograms)."""
    metrics = {}
    for name, v in per_update.items():
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
    return metrics


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


def program_cfg(cfg: LearnerConfig) -> LearnerConfig:
    """`cfg` as the compiled step sees it: the policy on non-finite steps is applied by
    `update` (`finish`), not in the program, so one compiled step serves both settings.
    Every caller that compiles or runs a step (`update`, `compile_update`, `split_step`)
    passes its config through this."""
    return dataclasses.replace(cfg, skip_nonfinite=False)


def compile_update(state, batch: TrainBatch, model_cfg: ModelConfig, cfg: LearnerConfig,
                   ref_params=None, mesh=None) -> jax.stages.Compiled:
    """Compile, without running it, the `train_step` that `update` calls for arguments like
    these (arrays, or ShapeDtypeStructs placed as the real ones will be). It lands in the
    jit cache `update` then hits; its `memory_analysis()` is the step's per-device need."""
    return train_step.lower(state, batch, ref_params, model_cfg=model_cfg,
                            cfg=program_cfg(cfg), mesh=mesh).compile()


def update(state: TrainState, batch: TrainBatch, model_cfg: ModelConfig, cfg: LearnerConfig,
           ref_params=None, mesh=None) -> tuple[TrainState, dict[str, float]]:
    """Check, run one `train_step` (donating `state`), fetch metrics as floats.

    Raises `NonFiniteError` naming the step if an update was non-finite, unless
    `cfg.skip_nonfinite`; either way the rejected update changed neither params nor
    optimizer state, and `actor/skipped_steps` counts it.
    """
    check(batch, cfg, ref_params)
    state, metrics = train_step(state, batch, ref_params, model_cfg=model_cfg,
                                cfg=program_cfg(cfg), mesh=mesh)
    return finish(state, metrics, cfg)


def finish(state: TrainState, metrics: dict, cfg: LearnerConfig):
    """Fetch a step's metrics as floats; raise `NonFiniteError` as `update` says."""
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
