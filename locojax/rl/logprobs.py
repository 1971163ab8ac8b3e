"""Per-token logprobs of a batch under a policy: the forward every learner pass shares.

`sequence_logprobs` is what the train step differentiates and what the engine's sampler
logprobs must equal (docs/design.md, "Sampler logprobs equal trainer logprobs"); with a
shared prompt (`TrainBatch.shared_prefix`) it runs each group's prompt once
(`prefix_hidden`). `scan_logprobs` is its no-grad form over row-parts, for the reference
and π_old passes of a step (`train_step.prepare`); `for_split` says how a batch splits into
row-parts without breaking its groups. Legend: B rows, T columns, P prompt columns, R
response columns, G rows per group, D model width.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from locojax.model import accumulating_scan, decoder
from locojax.model.config import ModelConfig
from locojax.model.invariant_jit import model_jit
from locojax.model.params import Weights
from locojax.rl import batch as batch_lib
from locojax.rl.batch import TrainBatch, split_rows, unsplit_rows
from locojax.rl.config import LearnerConfig


def sequence_logprobs(params: Weights, tokens, positions, attn_mask, model_cfg: ModelConfig,
                      temperature: float = 1.0, chunk: int = decoder.AUTO_CHUNK,
                      unroll: bool = False, remat: bool = False,
                      prefix: batch_lib.SharedPrefix | None = None, layer_grads=None):
    """log π(tokens[b, t] | tokens[b, :t]) and the entropy of that distribution, [B, T] each.

    Aligned with `tokens`; column 0 (no context to predict it from) is 0. The hidden state
    at t predicts token t + 1, so the forward runs on tokens[:, :-1]. `unroll`, `remat`: see
    `decoder.forward` (set where the result is differentiated); `chunk`: `decoder.token_logprobs`;
    `layer_grads` (with remat): the running sum the layers' gradients are added into, in place
    (`decoder.forward`).

    `prefix` (a `TrainBatch.shared_prefix`, P columns): columns 1..P-1 hold no target, so
    their logits are skipped and they read 0. With groups of G > 1 rows the prompt's forward
    runs once per group (`prefix_hidden`): same objective, same gradients, a third fewer
    FLOPs at SMALL. Only valid for whole groups: the caller passes None otherwise.
    """
    b = tokens.shape[0]
    if prefix is None:
        hidden, _ = decoder.forward(params, tokens[:, :-1], positions[:, :-1], model_cfg,
                                    mask=attn_mask[:, :-1], unroll=unroll, remat=remat,
                                    layer_grads=layer_grads)  # [B, T-1, D]
        logp, ent = decoder.token_logprobs(params, hidden, tokens[:, 1:], model_cfg, temperature,
                                           chunk)
        zero = jnp.zeros((b, 1), logp.dtype)
        return jnp.concatenate([zero, logp], axis=1), jnp.concatenate([zero, ent], axis=1)
    p = prefix.columns
    if prefix.group > 1:
        hidden = prefix_hidden(params, tokens, positions, attn_mask, model_cfg, p,
                               prefix.group, unroll, remat, layer_grads)
    else:
        hidden, _ = decoder.forward(params, tokens[:, :-1], positions[:, :-1], model_cfg,
                                    mask=attn_mask[:, :-1], unroll=unroll, remat=remat,
                                    layer_grads=layer_grads)
        hidden = hidden[:, p - 1:]  # [B, T-P, D]: the positions that predict targets
    logp, ent = decoder.token_logprobs(params, hidden, tokens[:, p:], model_cfg, temperature,
                                       chunk)
    zero = jnp.zeros((b, p), logp.dtype)
    return jnp.concatenate([zero, logp], axis=1), jnp.concatenate([zero, ent], axis=1)


def prefix_hidden(params, tokens, positions, attn_mask, model_cfg, p: int, g: int, unroll,
                  remat: bool = False, layer_grads=None):
    """Hidden states [B, T-P, D] of positions P-1 .. T-2, the prompt run once per group.

    The first row of each group holds the group's prompt. One scan over the layers runs, per
    layer, the prompt's rows [B/G, P], then the responses [B, T-P-1], which attend to that
    layer's prompt keys and values (repeated G times, so the backward sums the G rows'
    cotangents into one prompt backward), then causally to each other. One scan, not a
    prompt scan then a response scan: two scans over the same layers each stacked a gradient
    of every layer's weights before their sum (1.76 GB more at 0.6B, docs/real_size.md), and
    the repeated keys and values of all layers at once. The hidden state at P - 1 predicts
    every row's first response token. Reshapes keep groups inside a device's rows.
    `layer_grads`: as `decoder.forward`'s (the layers' gradients summed into it in place).
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

    def one_layer(carry, w, kind, consts):  # a function of its arguments alone
        (x_p, x_r), (pos_p, pos_r, causal_p, visible_r) = carry, consts
        x_p, (k, v) = decoder.layer(cfg, x_p, w, pos_p, (None, causal_p), kind=kind)
        x_r, _ = decoder.layer(cfg, x_r, w, pos_r, visible_r, (rows(k), rows(v), rows(pos_p)),
                               kind)
        return x_p, x_r

    consts = (pos_p, pos_r, causal_p, visible_r)
    embed = lambda t: decoder.embed(params, t, cfg)  # noqa: E731  [., ., D]
    kinds = decoder.layer_kinds(cfg, decoder.wide_dtype(cfg.dtype))
    x = (embed(first(tokens)), embed(tokens[:, p:-1]))
    if layer_grads is not None:
        x_p, x_r = accumulating_scan.scan(one_layer, x, params["layers"], kinds, layer_grads,
                                          consts, unroll)
    else:
        body = lambda carry, xs: (one_layer(carry, *xs, consts), None)  # noqa: E731
        if remat:  # prevent_cse is needed only where the scan is unrolled into straight code
            body = jax.checkpoint(body, prevent_cse=unroll)
        (x_p, x_r), _ = jax.lax.scan(body, x, (params["layers"], kinds), unroll=unroll)
    norm = lambda x: decoder.final_norm(params, x, cfg)  # noqa: E731
    return jnp.concatenate([rows(norm(x_p[:, -1:])), norm(x_r)], axis=1)


compute_logprobs = model_jit(sequence_logprobs,
                             static_argnames=("model_cfg", "temperature", "chunk", "unroll",
                                              "remat", "prefix"))
"""Jitted `sequence_logprobs`, e.g. for reference logprobs outside the step."""


def for_split(batch: TrainBatch, parts: int) -> tuple[TrainBatch, int]:
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


def scan_logprobs(params, batch: TrainBatch, parts: int, group: int, model_cfg,
                  cfg: LearnerConfig):
    """No-grad logprobs of the whole batch, `parts` rows-chunks at a time (bounded memory);
    `batch` and `group` as `for_split` gives them."""
    def one(rows):
        tokens, positions, attn = rows
        return sequence_logprobs(params, tokens, positions, attn, model_cfg, cfg.temperature,
                                 cfg.logprob_chunk, prefix=batch.shared_prefix)[0]

    rows = tuple(split_rows(x, parts, group)
                 for x in (batch.tokens, batch.positions, batch.attn_mask))
    return jax.lax.stop_gradient(unsplit_rows(jax.lax.map(one, rows), group))
