"""The training batch: one pytree of [B, T] arrays, aligned with `tokens`.

Row b is prompt (left-padded) then response (right-padded). Every per-token array is
aligned with `tokens`: `old_logprobs[b, t]` is log π_behav(tokens[b, t] | tokens[b, :t]),
and `loss_mask[b, t]` says tokens[b, t] is a response token, i.e. a target of the loss.
Column 0 is therefore never a target. Values under a False mask are ignored, NaN included.

Building the global batch: a single controller calls `shard`; in multi-host runs each host
passes its own rows to `from_process_local` (`jax.make_array_from_process_local_data`).

`shared_prefix` (static) records what a GRPO rollout guarantees: its first P columns hold the
prompt, never a target, and rows come in consecutive groups of G that share that prompt.
The trainer then skips the logits of the first P - 1 positions (none of them predicts a
target) and, when a micro-batch holds whole groups, runs the prompt's forward and backward
once per group rather than G times. Both leave the objective and its gradient unchanged.
Legend: B rows, T columns, P prompt columns, R response columns, G rows per group.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from locojax.model.sharding import TRAIN_DP, Rules, batch_sharding

@dataclasses.dataclass(frozen=True)
class SharedPrefix:
    """Rows come in consecutive groups of `group` with identical first `columns` columns
    (tokens, positions, attn_mask), and no loss target lies in those columns."""

    columns: int  # P
    group: int  # G


def logit_positions(columns: int, prefix: SharedPrefix | None = None) -> int:
    """Positions per row whose logits the train step computes: all T - 1 that predict a
    token, or with a shared prefix of P columns only the T - P that predict the response."""
    return columns - prefix.columns if prefix is not None else columns - 1


def split_group(prefix: SharedPrefix | None, rows: int, parts: int) -> int:
    """Rows per block that splitting `rows` rows into `parts` parts keeps together: the
    prefix's G when the parts can hold whole groups (rows a multiple of parts x G; always so
    for one part), else 1 (single rows interleaved, every group broken)."""
    if prefix is None or rows % (parts * prefix.group):
        return 1
    return prefix.group


PER_TOKEN = ("tokens", "positions", "attn_mask", "loss_mask", "old_logprobs", "ref_logprobs")
PER_ROW = ("group_id", "staleness")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainBatch:
    tokens: jax.Array  # [B, T] int32: prompt then response
    positions: jax.Array  # [B, T] int32: RoPE positions (0 at the first real prompt token)
    attn_mask: jax.Array  # [B, T] bool: a real token (prompt or response), not padding
    loss_mask: jax.Array  # [B, T] bool: a response token, i.e. a target of the loss
    advantages: jax.Array  # [B] (outcome) or [B, T] (per token) f32
    old_logprobs: jax.Array  # [B, T] f32: the sampler's (behaviour) logprob of each token
    group_id: jax.Array  # [B] int32: rows of one prompt share an id
    ref_logprobs: jax.Array | None = None  # [B, T] f32: reference policy; only read when β > 0
    staleness: jax.Array | None = None  # [B] int32: policy versions between sampler and learner
    shared_prefix: SharedPrefix | None = dataclasses.field(default=None,
                                                           metadata={"static": True})

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens.shape)


def validate(batch: TrainBatch) -> None:
    """Shape and dtype checks, on shapes only (no device transfer). Raises naming the field."""
    if batch.tokens.ndim != 2:
        raise ValueError(f"TrainBatch.tokens must be [B, T], got shape {batch.tokens.shape}")
    b, t = batch.tokens.shape
    for name in PER_TOKEN:
        x = getattr(batch, name)
        if x is not None and tuple(x.shape) != (b, t):
            raise ValueError(f"TrainBatch.{name} has shape {tuple(x.shape)}, expected [B, T] = "
                             f"{(b, t)} like tokens")
    for name in PER_ROW:
        x = getattr(batch, name)
        if x is not None and tuple(x.shape) != (b,):
            raise ValueError(f"TrainBatch.{name} has shape {tuple(x.shape)}, expected [B] = {(b,)}")
    if tuple(batch.advantages.shape) not in ((b,), (b, t)):
        raise ValueError(f"TrainBatch.advantages has shape {tuple(batch.advantages.shape)}, "
                         f"expected [B] = {(b,)} or [B, T] = {(b, t)}")
    for name in ("tokens", "positions", "group_id"):
        if not jnp.issubdtype(getattr(batch, name).dtype, jnp.integer):
            raise ValueError(f"TrainBatch.{name} must be integer, got {getattr(batch, name).dtype}")
    for name in ("attn_mask", "loss_mask"):
        if getattr(batch, name).dtype != jnp.bool_:
            raise ValueError(f"TrainBatch.{name} must be bool, got {getattr(batch, name).dtype}")
    sp = batch.shared_prefix
    if sp is not None and not (0 < sp.columns < t and sp.group >= 1 and b % sp.group == 0):
        raise ValueError(f"TrainBatch.shared_prefix {sp} does not fit a batch of shape {(b, t)}: "
                         "need 0 < columns < T and group dividing B")
    if sp is not None and isinstance(batch.loss_mask, np.ndarray):
        check_shared_prefix(batch.tokens, batch.positions, batch.attn_mask, batch.loss_mask, sp)


def check_shared_prefix(tokens, positions, attn_mask, loss_mask, sp: SharedPrefix) -> None:
    """Host-side (numpy): raise unless the rows really have the prefix `sp` promises."""
    if np.any(np.asarray(loss_mask)[:, :sp.columns]):
        raise ValueError(f"shared_prefix: a loss target lies in the first {sp.columns} columns")
    for name, x in (("tokens", tokens), ("positions", positions), ("attn_mask", attn_mask)):
        head = np.asarray(x)[:, :sp.columns]
        grouped = head.reshape(-1, sp.group, sp.columns)
        if not (grouped == grouped[:, :1]).all():
            raise ValueError(f"shared_prefix: {name} differ within a group of {sp.group} rows "
                             f"in the first {sp.columns} columns")


def from_rollout(prompt_tokens, prompt_mask, response_tokens, response_mask, response_logprobs,
                 advantages, group_id, staleness=None, ref_logprobs=None,
                 group_size: int = 0, context_mask=None) -> TrainBatch:
    """Host-side (numpy) assembly from the sampler's outputs.

    prompt_*: [B, P], left-padded. response_*: [B, R], right-padded; response_logprobs[b, j]
    is the sampler's log π(response_tokens[b, j]). ref_logprobs, if given, is [B, P + R].
    Positions count real tokens, so a left-padded prompt starts at 0 (as the sampler's do).
    group_size: G of a GRPO rollout (rows r·G .. r·G + G - 1 repeat one prompt). The batch
    then records its `shared_prefix`, which is checked here, so a wrong G is an error.
    context_mask [B, R] (multi-turn): response columns that are real tokens but not the
    model's (environment output): attended to, never targets, so no loss, KL or count
    sees them. A trajectory's positions run on through its environment tokens.
    """
    pm = np.asarray(prompt_mask, bool)
    rm = np.asarray(response_mask, bool)
    real = rm if context_mask is None else rm | np.asarray(context_mask, bool)
    attn = np.concatenate([pm, real], axis=1)
    positions = np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)
    resp_lp = np.where(rm, np.asarray(response_logprobs, np.float32), 0.0)
    shared = None
    if pm.shape[1] and group_size >= 1:
        if pm.shape[0] % group_size:
            raise ValueError(f"{pm.shape[0]} rows do not split into groups of {group_size}")
        shared = SharedPrefix(columns=pm.shape[1], group=group_size)
        tokens = np.asarray(prompt_tokens)
        check_shared_prefix(tokens, positions[:, :pm.shape[1]], pm, np.zeros_like(pm), shared)
    return TrainBatch(
        tokens=np.concatenate([np.asarray(prompt_tokens), np.asarray(response_tokens)], 1)
        .astype(np.int32),
        positions=positions,
        attn_mask=attn,
        loss_mask=np.concatenate([np.zeros_like(pm), rm], axis=1),
        advantages=np.asarray(advantages, np.float32),
        old_logprobs=np.concatenate([np.zeros(pm.shape, np.float32), resp_lp], 1),
        group_id=np.asarray(group_id, np.int32),
        staleness=None if staleness is None else np.asarray(staleness, np.int32),
        ref_logprobs=None if ref_logprobs is None else np.asarray(ref_logprobs, np.float32),
        shared_prefix=shared,
    )


def pad_rows(batch: TrainBatch, multiple: int) -> TrainBatch:
    """Append inert rows (no tokens, no targets, group -1) up to a multiple of `multiple`.

    Inert rows change nothing: counts only see rows with a response token.
    """
    b = batch.tokens.shape[0]
    extra = -b % multiple
    if not extra:
        return batch

    def pad(x):
        x = np.asarray(x)
        return np.concatenate([x, np.zeros((extra,) + x.shape[1:], x.dtype)], axis=0)

    padded = jax.tree.map(pad, batch)
    if batch.shared_prefix is not None and extra % batch.shared_prefix.group:
        # The inert rows share the (empty) prefix only among themselves: keep the skipped
        # prompt logits, drop the group structure.
        padded = dataclasses.replace(padded, shared_prefix=SharedPrefix(
            batch.shared_prefix.columns, 1))
    return dataclasses.replace(padded, group_id=np.concatenate(
        [np.asarray(batch.group_id), np.full((extra,), -1, np.int32)]).astype(np.int32))


def shard(batch: TrainBatch, mesh: Mesh, rules: Rules = TRAIN_DP) -> TrainBatch:
    """Place a whole (host-resident) batch on the mesh, rows over the rules' batch axis."""
    b = batch.tokens.shape[0]
    return jax.tree.map(
        lambda x: jax.device_put(x, batch_sharding(mesh, rules, np.ndim(x), b)), batch)


def from_process_local(local: TrainBatch, mesh: Mesh, rules: Rules = TRAIN_DP) -> TrainBatch:
    """The global batch from each process's own rows (process p holds rows of its devices).

    Every process must pass the same number of rows and the same T.
    """
    b = local.tokens.shape[0] * jax.process_count()

    def one(x):
        x = np.asarray(x)
        sharding = batch_sharding(mesh, rules, x.ndim, b)
        return jax.make_array_from_process_local_data(sharding, x, (b,) + x.shape[1:])

    return jax.tree.map(one, local)


def split_rows(x: jax.Array, parts: int, group: int = 1) -> jax.Array:
    """[B, ...] → [parts, B / parts, ...], part i holding blocks i, i + parts, i + 2·parts, ...
    of `group` consecutive rows (group 1: rows i, i + parts, ...).

    Strided, so each device's contiguous block of rows splits locally (when it holds a
    multiple of parts · group rows): micro-batch i is a slice of every device's shard and no
    rows move between devices. With `group` = G, every part holds whole groups.
    """
    b = x.shape[0]
    if b % (parts * group):
        raise ValueError(f"batch of {b} rows does not split into {parts} equal parts of "
                         f"whole {group}-row blocks")
    x = x.reshape(b // (parts * group), parts, group, *x.shape[1:]).swapaxes(0, 1)
    return x.reshape(parts, b // parts, *x.shape[3:])


def unsplit_rows(x: jax.Array, group: int = 1) -> jax.Array:
    """Inverse of `split_rows`: [parts, B / parts, ...] → [B, ...]."""
    parts, rows = x.shape[:2]
    x = x.reshape(parts, rows // group, group, *x.shape[2:]).swapaxes(0, 1)
    return x.reshape(parts * rows, *x.shape[3:])


def abstract(rows: int, columns: int, mesh: Mesh, rules: Rules = TRAIN_DP,
             shared_prefix: SharedPrefix | None = None, staleness: bool = False) -> TrainBatch:
    """ShapeDtypeStructs of the global batch that `from_rollout` then `shard` or
    `from_process_local` make (outcome advantages, no reference logprobs; per-row staleness
    only if `staleness`, as the buffered modes' batches carry it): what lowering
    `train_step` for a run's batch needs. `shared_prefix` is static, so it must be the one
    the run's batches carry for a compile to be reused."""
    def one(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype,
                                    sharding=batch_sharding(mesh, rules, len(shape), rows))

    per_token = lambda dtype: one((rows, columns), dtype)  # noqa: E731
    return TrainBatch(tokens=per_token(jnp.int32), positions=per_token(jnp.int32),
                      attn_mask=per_token(jnp.bool_), loss_mask=per_token(jnp.bool_),
                      advantages=one((rows,), jnp.float32), old_logprobs=per_token(jnp.float32),
                      group_id=one((rows,), jnp.int32),
                      staleness=one((rows,), jnp.int32) if staleness else None,
                      shared_prefix=shared_prefix)
