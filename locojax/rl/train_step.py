"""One learner step: μ passes of mini-batch updates, each summing micro-batch gradients.

`train_step(state, batch, ref_params, *, model_cfg, cfg, mesh) -> (state, metrics)` is
jitted at module level and donates the state. Its input batch is the global array (sharded over the
mesh's `data` axis); the params' sharding decides data parallel or FSDP. In order:

  1. reference logprobs, only when β > 0 and the batch lacks them (β = 0: no ref forward;
     `update` computes them before the step, as a program of their own: `with_reference`);
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

The pieces: `logprobs.py` (the forward, and the no-grad reference and π_old passes) and
`gradients.py` (one update's loss, gradient and metric sums over micro-batches and
devices); `split_step.py` runs this step's public pieces (`prepare`, `gradients.local_sums`,
`gradients.allreduce_sums`, `apply`, `stepped`) as programs of their own, inside `update`.

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

from locojax.model import lora
from locojax.model.config import ModelConfig
from locojax.model.invariant_jit import model_jit
from locojax.rl import batch as batch_lib
from locojax.rl import gradients, host_memory, logprob_gap, logprobs, micro_batches
from locojax.rl.aggregation import global_counts
from locojax.rl.algorithms import resolve
from locojax.rl.batch import TrainBatch, split_rows
from locojax.rl.config import LearnerConfig
from locojax.rl.losses import is_weight_quantiles
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
    batch, group = logprobs.for_split(batch, n_mini * k)
    rows = batch.tokens.shape[0]
    stale = (jnp.zeros((rows,), bool) if batch.staleness is None else batch.staleness > 0)
    fresh = ~stale
    if s.is_all_samples:
        stale = jnp.ones((rows,), bool)
    if not s.beta:
        batch = dataclasses.replace(batch, ref_logprobs=None)  # never read, never computed
    elif batch.ref_logprobs is None:
        ref = logprobs.scan_logprobs(ref_params, batch, n_mini * k, group, model_cfg, cfg)
        batch = dataclasses.replace(batch, ref_logprobs=ref)
    fresh_mask = batch.loss_mask & fresh[:, None]
    fresh_tokens = jnp.sum(fresh_mask.astype(jnp.float32))

    extra = {"rollout/logit_terms": logprob_gap.logit_terms(params, model_cfg)}  # its bound
    prox = None
    if cfg.updates_per_step > 1:  # later updates need π_old of the start-of-step params
        prox = logprobs.scan_logprobs(params, batch, n_mini * k, group, model_cfg, cfg)
        if batch.staleness is None:
            extra.update(logprob_gap.metrics(fresh_mask, batch.old_logprobs, prox, fresh_tokens))

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
    data, counts, fresh_tokens, extra, s = prepare(
        lora.policy(state.frozen, state.params, model_cfg), batch, ref_params, model_cfg, cfg)
    n_mini = cfg.algo.num_minibatches

    axis = gradients.flat_allreduce_axis(mesh, cfg)

    def update(state, i):
        m = i % n_mini
        pick = lambda x: x[m]  # noqa: E731
        args = (state.params, jax.tree.map(pick, data), jax.tree.map(pick, counts), i == 0,
                fresh_tokens, s, model_cfg, cfg)
        if axis is None:
            grads, loss, metrics = gradients.accumulate(*args, frozen=state.frozen)
        else:
            grads, loss, metrics = gradients.accumulate_flat(*args, mesh, axis, state.frozen)
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
    state, metrics = stepped(state, per_update, extra)
    return (state, metrics, grads) if return_grads else (state, metrics)


def stepped(state: TrainState, per_update: dict, extra: dict):
    """The step's end, after its updates: its metrics (`per_step`, the `prepare` extras,
    `actor/skipped_steps`) and the state's step count advanced. Traced inside `train_step`,
    or run on the host by `split_step`."""
    metrics = {**per_step(per_update), **extra,
               "actor/skipped_steps": state.skipped.astype(jnp.float32)}
    return dataclasses.replace(state, step=state.step + 1), metrics


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


train_step = model_jit(_train_step, static_argnames=("model_cfg", "cfg", "mesh", "return_grads"),
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
    Every caller that compiles or runs a step (`update`, for `split_step`'s programs too,
    and `compile_update`) passes its config through this."""
    return dataclasses.replace(cfg, skip_nonfinite=False)


def _reference(ref_params, batch: TrainBatch, *, model_cfg: ModelConfig, cfg: LearnerConfig,
               mesh=None):
    """The reference policy's logprobs of `batch`, [B, T], in the row-parts the step would
    use (bounded memory, `logprobs.scan_logprobs`)."""
    cfg = micro_batches.resolve(cfg, batch, model_cfg.vocab_size, mesh)
    parts = cfg.algo.num_minibatches * cfg.grad_accum
    split, group = logprobs.for_split(batch, parts)
    return logprobs.scan_logprobs(ref_params, split, parts, group, model_cfg, cfg)


reference_logprobs = model_jit(_reference, static_argnames=("model_cfg", "cfg", "mesh"))
"""(ref_params, batch, *, model_cfg, cfg, mesh=None) -> [B, T]: `with_reference`'s program."""


def _needs_reference(batch: TrainBatch, ref_params, cfg: LearnerConfig) -> bool:
    _, s = resolve(cfg.algo)
    return bool(s.beta) and batch.ref_logprobs is None and ref_params is not None


def compile_reference(batch: TrainBatch, ref_params, model_cfg: ModelConfig,
                      cfg: LearnerConfig, mesh=None) -> jax.stages.Compiled | None:
    """Compile, without running it, the reference program `update` runs before the step for
    arguments like these (`with_reference`); None where it runs none (β = 0, or the batch
    brings its own `ref_logprobs`). Its `cost_analysis()` is the reference forward's, which
    the step's own program no longer holds."""
    if not _needs_reference(batch, ref_params, cfg):
        return None
    return reference_logprobs.lower(ref_params, batch, model_cfg=model_cfg,
                                    cfg=program_cfg(cfg), mesh=mesh).compile()


def with_reference(batch: TrainBatch, ref_params, model_cfg: ModelConfig, cfg: LearnerConfig,
                   mesh=None) -> TrainBatch:
    """`batch` with its reference logprobs when β > 0 and it lacks them: computed by
    `reference_logprobs`, a program of its own, then given to `train_step` in the batch.

    Why not inside `train_step` (which can compute them): there the same forward cost 3x
    more at TINY (~16 ms for ~5 ms of work) and 1.15x the whole step at SMALL β 0.04
    (docs/peers_benchmark.md has the interleaved A/B). With ShapeDtypeStructs
    (`compile_update`) it compiles that program and returns the batch with an abstract
    `ref_logprobs` placed like `old_logprobs`, which is where the real one is put. A
    reference in host memory (`host_memory.py`) is copied onto the device for the program
    and freed after it."""
    if not _needs_reference(batch, ref_params, cfg):
        return batch
    like = batch.old_logprobs
    static = dict(model_cfg=model_cfg, cfg=program_cfg(cfg), mesh=mesh)
    if isinstance(like, jax.ShapeDtypeStruct):
        compile_reference(batch, ref_params, model_cfg, cfg, mesh)
        out = jax.eval_shape(functools.partial(reference_logprobs, **static), ref_params, batch)
        ref = jax.ShapeDtypeStruct(out.shape, out.dtype, sharding=like.sharding)
    else:  # a reference kept in host memory comes back for this program alone
        ref = reference_logprobs(host_memory.to_device(ref_params), batch, **static)
        if isinstance(like, jax.Array):  # where the step's compile expects it
            ref = jax.device_put(ref, like.sharding)
    return dataclasses.replace(batch, ref_logprobs=ref)


def compile_update(state, batch: TrainBatch, model_cfg: ModelConfig, cfg: LearnerConfig,
                   ref_params=None, mesh=None) -> jax.stages.Compiled:
    """Compile, without running it, the `train_step` that `update` calls for arguments like
    these (arrays, or ShapeDtypeStructs placed as the real ones will be), and the reference
    program before it (`with_reference`). They land in the jit caches `update` then hits;
    the step's `memory_analysis()` is its per-device need (the reference program's, a
    no-grad forward of one row-part at a time, is smaller). Returns the step's program:
    `compile_reference` gives the reference one (for its FLOPs)."""
    batch = with_reference(batch, ref_params, model_cfg, cfg, mesh)
    return train_step.lower(state, batch, None, model_cfg=model_cfg,
                            cfg=program_cfg(cfg), mesh=mesh).compile()


def update(state: TrainState, batch: TrainBatch, model_cfg: ModelConfig, cfg: LearnerConfig,
           ref_params=None, mesh=None, programs=None) -> tuple[TrainState, dict[str, float]]:
    """Check, add the reference logprobs (`with_reference`), run the step's programs
    (donating `state`), fetch metrics as floats.

    `programs(state, batch, None, *, model_cfg, cfg, mesh) -> (state, metrics)` runs the
    step on the checked batch (`train_step`'s signature, its reference already in the
    batch): by default `train_step`, one program, called as `compile_update` lowered it; `split_step.programs(timer)`
    runs the same step as separate programs, timed apart. Either way the checks, the
    reference and the metrics are this function's, so the two cannot drift apart.

    Raises `NonFiniteError` naming the step if an update was non-finite, unless
    `cfg.skip_nonfinite`; either way the rejected update changed neither params nor
    optimizer state, and `actor/skipped_steps` counts it.
    """
    check(batch, cfg, ref_params)
    batch = with_reference(batch, ref_params, model_cfg, cfg, mesh)
    state = host_memory.to_device(state)  # moments kept in host memory: for this step only
    state, metrics = (programs or train_step)(state, batch, None, model_cfg=model_cfg,
                                              cfg=program_cfg(cfg), mesh=mesh)
    return finish(state, metrics, cfg)


def finish(state: TrainState, metrics: dict, cfg: LearnerConfig):
    """Fetch a step's metrics as floats; raise `NonFiniteError` as `update` says."""
    metrics = jax.device_get(metrics)
    hist = metrics.pop("actor/is_weight_hist", None)
    gaps = metrics.pop("rollout/logprob_gap_hist", None)
    metrics = {k: float(v) for k, v in metrics.items()}
    if hist is not None:
        metrics.update(is_weight_quantiles(hist))
    if gaps is not None:
        metrics.update(logprob_gap.quantiles(gaps))
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
