"""One update's sums: gradients, loss and metrics over micro-batches and devices.

`accumulate` sums, over a mini-batch's micro-batches (a `lax.scan` when there are several),
each micro-batch's loss share (partial sum / global count: `aggregation.py`) and its
gradient, so every split gives the same objective. Data parallel over a `data`-only mesh,
`accumulate_flat` runs that per device (`local_sums`) and then ONE all-reduce of a flat
buffer (`allreduce_sums`) rather than XLA's one per gradient leaf; `split_step.py` runs the
same two pieces as programs of their own. The sampler-learner gap's metrics are
`logprob_gap.py`'s.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.flatten_util
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from locojax.model import decoder, lora
from locojax.model.config import ModelConfig
from locojax.rl import batch as batch_lib
from locojax.rl import logprob_gap
from locojax.rl.aggregation import Counts
from locojax.rl.batch import TrainBatch
from locojax.rl.config import LearnerConfig
from locojax.rl.logprobs import sequence_logprobs
from locojax.rl.losses import LossSettings, is_weight_histogram, objective


def _micro_loss(params, data, counts: Counts, first, fresh_tokens, s: LossSettings,
                model_cfg: ModelConfig, cfg: LearnerConfig, frozen=None, layer_grads=None):
    """Loss share and metric shares of one micro-batch (global denominators throughout).
    `frozen`: a LoRA run's base, read by the forward, never differentiated (`lora.py`);
    `layer_grads`: the running sum the layers' gradients go into (`in_place`)."""
    b: TrainBatch = data["batch"]
    logp, ent = sequence_logprobs(lora.policy(frozen, params, model_cfg), b.tokens, b.positions,
                                  b.attn_mask, model_cfg,
                                  cfg.temperature, cfg.logprob_chunk,
                                  unroll=decoder.unroll_for_grad(model_cfg), remat=cfg.remat,
                                  prefix=b.shared_prefix,  # as `logprobs.for_split` left it
                                  layer_grads=layer_grads)
    own = jax.lax.stop_gradient(logp)  # π_θ before any update of this step, bitwise
    old = own if data["prox"] is None else jnp.where(first, own, data["prox"])
    loss, metrics, extremes = objective(logp, ent, old, b.old_logprobs, b.ref_logprobs,
                                        b.advantages, b.loss_mask, data["stale"], counts, s)
    if b.staleness is not None:  # asynchronous modes: the distribution of the IS weights
        metrics["actor/is_weight_hist"] = is_weight_histogram(
            old, b.old_logprobs, b.loss_mask, data["stale"], counts, s.is_cap, s.ratio_level)
    if data["prox"] is None and b.staleness is None:  # `old`: the start-of-step π
        # The sampler-learner gap, measured only where rollouts are made inline (no
        # staleness in the batch); rollout workers measure their own rows (`fleet/`).
        gap = logprob_gap.metrics(b.loss_mask & data["fresh"][:, None], b.old_logprobs, old,
                                  fresh_tokens)
        extremes["rollout/logprob_gap_max"] = gap.pop("rollout/logprob_gap_max")
        metrics.update(gap)
    return loss, (metrics, extremes)


def in_place(cfg: LearnerConfig, model_cfg: ModelConfig) -> bool:
    """Whether the layers' gradients are summed into the f32 accumulator in place, inside
    the backward (`model/accumulating_scan.py`): with remat, whose backward that is. Then a
    step holds one f32 gradient buffer of the layers whatever its micro-batches; without
    remat, a micro-batch's own besides the sum when there are several. Not under LoRA: what
    trains there is the adapters, whose gradients are a small fraction of the base's, and
    the layer scan's accumulator is the base weights' shape."""
    return cfg.remat and not lora.enabled(model_cfg)


def accumulate(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg,
               keep_f32: bool = False, frozen=None):
    """Σ over micro-batches (leading axis of `micro`) of loss, gradients and metric shares.

    Gradients come back in the params' dtype, or in the f32 accumulator with `keep_f32`.
    With `in_place` the layers' gradients are added into the accumulator inside each
    micro-batch's backward; the other weights' (embedding, final norm) after it."""
    loss_fn = functools.partial(_micro_loss, counts=counts, first=first,
                                fresh_tokens=fresh_tokens, s=s, model_cfg=model_cfg, cfg=cfg,
                                frozen=frozen)
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

    def grads_of(grads, data):
        """(loss, aux, the sum with this micro-batch's gradients added)."""
        add = lambda acc, g: jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc, g)  # noqa: E731
        if not in_place(cfg, model_cfg):
            (l, aux), g = grad_fn(params, data)
            return l, aux, add(grads, g)
        rest = {k: v for k, v in params.items() if k != "layers"}

        def loss_of(rest, layer_grads):  # the layers' cotangent arrives in layer_grads
            return loss_fn({**rest, "layers": params["layers"]}, data, layer_grads=layer_grads)

        (l, aux), (g, layers) = jax.value_and_grad(loss_of, argnums=(0, 1), has_aux=True)(
            rest, grads["layers"])
        return l, aux, {**add({k: grads[k] for k in rest}, g), "layers": layers}

    def body(acc, data):
        grads, loss, metrics, extremes = acc
        l, (m, e), grads = grads_of(grads, data)
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
    round trip each across hosts. `accumulate_flat` sends one flat buffer instead. Also
    the layout `split_step` can split (its all-reduce is this one, as its own program).
    """
    if mesh is None or cfg.rules != "train_dp" or tuple(mesh.shape) != ("data",):
        return None
    return "data" if mesh.shape["data"] > 1 else None


def accumulate_flat(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg, mesh,
                    axis: str, frozen=None):
    """`accumulate` per device on its own rows, then ONE psum of a flat buffer holding every
    gradient, the loss and the metric sums (and one pmax for the extremes).

    Exactly the sums XLA's partitioner would take (every share is already divided by the
    global counts), only packed: gradients and metrics are those of `accumulate`."""
    def local(params, micro, counts, first, fresh_tokens, frozen):
        return allreduce_sums(*local_sums(params, micro, counts, first, fresh_tokens, s,
                                          model_cfg, cfg, frozen), axis)

    rows = P(None, axis)  # micro leaves are [k, rows, ...]
    # check_vma off: the grad-accum scan starts from replicated zeros and carries per-device
    # sums; the outputs are replicated by the psum / pmax above, which out_specs P() states.
    grads, loss, metrics = jax.shard_map(
        local, mesh=mesh, in_specs=(P(), rows, P(), P(), P(), P()), out_specs=P(),
        check_vma=False,
    )(params, micro, counts, first, fresh_tokens, frozen)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return grads, loss, metrics


def local_sums(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg, frozen=None):
    """One device's share of an update, inside `shard_map`: its rows' f32 gradient, loss and
    metric sums (and extremes), before any cross-device reduction."""
    rows = jax.tree.leaves(micro)[0].shape[1]
    sp = micro["batch"].shared_prefix
    if sp is not None and rows % sp.group:  # a device holding part of a group
        micro = {**micro, "batch": dataclasses.replace(
            micro["batch"], shared_prefix=batch_lib.SharedPrefix(sp.columns, 1))}
    return accumulate(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg,
                      keep_f32=True, frozen=frozen)


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
