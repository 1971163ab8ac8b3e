"""The train step as separate programs, so that its time splits three ways.

Fused (`train_step`), the gradient all-reduce is one collective inside one program, and its
time cannot be told from the compute around it. With `--profile-split`, each update of the
step runs instead as

    local       per device, its rows' gradients, loss and metric sums     compute
    barrier     a one-element psum over every device                       wait
    all-reduce  the sums packed in one flat buffer, psum over every device collective
    apply       AdamW                                                      compute

each program ended by `block_until_ready` in its own phase (`train_compute`, `train_wait`,
`train_collective`); the step's preparation (π_old and reference logprobs, global counts) is
compute too. The barrier's time is how long this host waited for the slowest host to finish
its local work (the straggler wait); the all-reduce then starts with every host present, so
its time is the collective's own: the pack and unpack of the buffer and the transfer.

The pieces are the fused step's own public functions (`train_step.prepare`,
`gradients.local_sums`, `gradients.allreduce_sums`, `train_step.apply`, `train_step.stepped`):
the same sums, but compiled in their own XLA modules, which may fuse and so round
differently, so the params agree with the fused step's within a few ulps, not bitwise
(tests/test_split_step.py). Use it to measure, not in runs that must be bitwise. What the
split costs is a program launch and a host round trip per piece and update (no benchmark
measures it against the fused step yet).

This module holds the programs only: `train_step.update` runs them in place of `train_step`
(`programs(timer)`), so the checks, the reference forward and the metrics' fetch are the
fused step's own, and `Trainer.step` (locojax/train/loop.py, `update`) decides which of the
two a step runs. Only the flat data-parallel layout splits (params replicated over a `data`
axis of more than one device: `splits`); elsewhere the loop runs the fused step as one
`train` phase.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from locojax.model.config import ModelConfig
from locojax.model.invariant_jit import model_jit
from locojax.profiler import StepTimer
from locojax.rl import gradients, micro_batches
from locojax.rl import train_step as ts
from locojax.rl.algorithms import resolve
from locojax.rl.batch import TrainBatch
from locojax.rl.config import LearnerConfig
from locojax.rl.train_state import TrainState, pin


def splits(mesh, cfg: LearnerConfig) -> bool:
    """Whether the step on `mesh` has a flat all-reduce to run apart (the module doc)."""
    return gradients.flat_allreduce_axis(mesh, cfg) is not None


def programs(timer: StepTimer):
    """The step's programs for `train_step.update(..., programs=...)`, each update's pieces
    timed in the phases of the module doc."""
    return functools.partial(run, timer=timer)


def run(state: TrainState, batch: TrainBatch, ref_params=None, *, model_cfg: ModelConfig,
        cfg: LearnerConfig, mesh, timer: StepTimer):
    """The fused step's `train_step`, as separately timed programs, called as `update` calls
    it: `cfg` as the program sees it (`train_step.program_cfg`), the batch checked and
    with its reference logprobs (`ref_params` None)."""
    cfg = micro_batches.resolve(cfg, batch, model_cfg.vocab_size, mesh)
    axis = gradients.flat_allreduce_axis(mesh, cfg)
    static = dict(model_cfg=model_cfg, cfg=cfg, mesh=mesh)
    with timer.phase("train_compute") as ph:
        data, counts, fresh_tokens, extra = _prepare(state.params, batch, ref_params,
                                                     **static)
        ph.sync(data)
    per_update = []
    for i in range(cfg.updates_per_step):
        with timer.phase("train_compute") as ph:
            parts = _local(state.params, data, counts, fresh_tokens, jnp.int32(i), **static)
            ph.sync(parts)
        with timer.phase("train_wait") as ph:
            ph.sync(_barrier(mesh=mesh, axis=axis))
        with timer.phase("train_collective") as ph:
            grads, loss, metrics = _allreduce(parts, mesh=mesh, axis=axis)
            ph.sync(grads)
        with timer.phase("train_compute") as ph:
            state, opt_metrics = _apply(state, grads, loss, **static)
            ph.sync(state.params)
        per_update.append({**metrics, **opt_metrics})
    stacked = {k: jnp.stack([m[k] for m in per_update]) for k in per_update[0]}
    return ts.stepped(state, stacked, extra)


_STATIC = ("model_cfg", "cfg", "mesh")


@model_jit(static_argnames=_STATIC)
def _prepare(params, batch, ref_params, *, model_cfg, cfg, mesh):
    data, counts, fresh_tokens, extra, _ = ts.prepare(params, batch, ref_params, model_cfg,
                                                      cfg)
    return data, counts, fresh_tokens, extra


@model_jit(static_argnames=_STATIC)
def _local(params, data, counts, fresh_tokens, i, *, model_cfg, cfg, mesh):
    """Update i's per-device sums, stacked over the devices ([D, ...] on `data`)."""
    _, s = resolve(cfg.algo)
    axis = gradients.flat_allreduce_axis(mesh, cfg)
    m = i % cfg.algo.num_minibatches
    micro, counts = jax.tree.map(lambda x: x[m], (data, counts))

    def local(params, micro, counts, first, fresh_tokens):
        sums = gradients.local_sums(params, micro, counts, first, fresh_tokens, s, model_cfg, cfg)
        return jax.tree.map(lambda x: x[None], sums)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, axis), P(), P(), P()),
                         out_specs=P(axis), check_vma=False)(params, micro, counts, i == 0,
                                                             fresh_tokens)


@functools.partial(jax.jit, static_argnames=("mesh", "axis"))
def _barrier(*, mesh, axis):
    return jax.shard_map(lambda: jax.lax.psum(jnp.ones((1,), jnp.int32), axis), mesh=mesh,
                         in_specs=(), out_specs=P(), check_vma=False)()


@functools.partial(jax.jit, static_argnames=("mesh", "axis"))
def _allreduce(parts, *, mesh, axis):
    def reduce(parts):
        return gradients.allreduce_sums(*jax.tree.map(lambda x: x[0], parts), axis)

    return jax.shard_map(reduce, mesh=mesh, in_specs=P(axis), out_specs=P(),
                         check_vma=False)(parts)


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames=("state",))
def _apply(state, grads, loss, *, model_cfg, cfg, mesh):
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    state, metrics = ts.apply(state, grads, loss, model_cfg, cfg)
    return pin(state, model_cfg, mesh, cfg.rules), metrics
