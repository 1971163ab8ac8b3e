"""How many micro-batches a train step splits each mini-batch into, when the config says auto.

`LearnerConfig.grad_accum = AUTO_ACCUM` (0, the default) resolves here, from the step's shapes:
- on CPU, the fewest micro-batches whose [rows, targets, V] f32 logits, per device, fit in
  `CPU_MICRO_LOGITS_BYTES`. The logits are a small model's largest buffer by far (V = 4096
  against D = 256 at SMALL); a micro-batch whose buffers stay in the caches runs its matmuls
  and softmax from cache, not from memory: a SMALL train step went from 2.77 to 2.20 s at
  β 0 and from 3.34 to 2.54 s at β 0.04 (docs/peers_benchmark.md). Only splits that keep
  each device's rows local count, and with a shared prompt (`TrainBatch.shared_prefix`) only
  splits into whole groups if one fits, so each prompt still runs once per group. If none
  fits (a large vocabulary, whose logits `decoder.token_logprobs` chunks anyway), 1: more
  micro-batches would only shrink the matmuls;
- elsewhere 1: an accelerator's matmuls want the whole batch, and the memory plan
  (`train.memory_plan`) suggests `--grad-accum` when a step does not fit.

Every split leaves the objective unchanged (global denominators); only the float summation
order differs from one micro-batch, as between any two explicit `grad_accum`s.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from locojax.model.sharding import RULES, batch_sharding
from locojax.rl.batch import SharedPrefix, logit_positions
from locojax.rl.config import AUTO_ACCUM, LearnerConfig

CPU_MICRO_LOGITS_BYTES = 16 * 2**20
"""Per device, one micro-batch's f32 logits stay under this on CPU. At SMALL (1 MiB of logits a
row, 128 rows) on a 32 MB-L3 EPYC, a train step took 2.06 s in micro-batches of 16 rows (this
rule), 2.22 s of 8 rows, 2.25 s of 32 rows and 2.98 s whole (`benchmarks/ab_train_step.py
--shape small --arm auto= --arm k1=AB_GRAD_ACCUM=1 --arm k4=... --arm k16=...`, 2026-12-02)."""


def micro_batches(cfg: LearnerConfig, rows: int, targets_per_row: int, vocab: int,
                  devices: int = 1, group: int = 1, platform: str | None = None) -> int:
    """Micro-batches per mini-batch for a [rows, ...] global batch: `cfg.grad_accum`, or the
    automatic choice (module docstring) when it is AUTO_ACCUM.

    targets_per_row: positions whose logits a row needs (its columns less the prompt's, with
    a shared prefix); devices: how many the rows are sharded over; group: rows per group of a
    shared prefix (1: none)."""
    if cfg.grad_accum != AUTO_ACCUM:
        return cfg.grad_accum
    if (platform or jax.default_backend()) != "cpu":
        return 1
    local = rows // max(1, devices * cfg.algo.num_minibatches)  # a device's mini-batch rows
    splits = [k for k in range(1, local + 1) if local % k == 0]
    whole = [k for k in splits if (local // k) % group == 0] if group > 1 else []
    splits = whole or splits
    row_bytes = targets_per_row * vocab * 4
    return next((k for k in splits if (local // k) * row_bytes <= CPU_MICRO_LOGITS_BYTES), 1)


def batch_shards(mesh, rules: str, rows: int) -> int:
    """Devices a [rows, ...] batch is sharded over under `rules` (1 without a mesh)."""
    if mesh is None:
        return 1
    axes = batch_sharding(mesh, RULES[rules], 1, rows).spec[0]
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[a] for a in axes]))


def resolve(cfg: LearnerConfig, batch, vocab: int, mesh=None) -> LearnerConfig:
    """`cfg` with `grad_accum` fixed for this batch (a `TrainBatch` or its abstract twin)."""
    rows, columns = batch.tokens.shape
    return resolve_shape(cfg, rows, columns, batch.shared_prefix, vocab,
                         batch_shards(mesh, cfg.rules, rows))


def resolve_shape(cfg: LearnerConfig, rows: int, columns: int, prefix: SharedPrefix | None,
                  vocab: int, devices: int = 1, platform: str | None = None) -> LearnerConfig:
    """`resolve` from the batch's shape: rows x columns, its shared prefix (or None), and the
    devices its rows are sharded over."""
    k = micro_batches(cfg, rows, logit_positions(columns, prefix), vocab, devices,
                      prefix.group if prefix is not None else 1, platform)
    return dataclasses.replace(cfg, grad_accum=k)
