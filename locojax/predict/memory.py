"""Memory per device, for hardware that is not here: the memory plan's accounting
(locojax/train/memory_plan.py) at the target's shapes, and the settings that make a run fit.

What a learner chip holds (bytes; P parameters, FSDP over n chips, compute itemsize s):
- params 4P/n (f32 master), AdamW moments 8P/n, gradients 4P/n and, by the train step's own
  rule (`train_memory.gradient_bytes`), with remat one layer's and the embedding's more, or
  without remat 4P/n more when grad_accum > 1; under LoRA (`--lora.rank`) P there is the
  adapters' parameters, and the frozen base adds its own bytes (bP/n, b its
  `--lora.base-dtype` itemsize) and serves as the reference;
- the reference model sP/n with β > 0; a compute-dtype copy of the weights sP/mp for
  rollout when s < 4 (tensor parallel over mp chips); under LoRA the merged f32 copy the
  sampler reads (4P/mp);
- the KV cache of its rollout rows: rows · S · (2 L k h s / mp + 1), keys, values and a
  validity byte per slot, S the engine's own slots (`extend.slots_needed`, rounded up to
  whole blocks as `KVCache.empty` allocates them): P + N - 1, or for a multi-turn task of T turns and observations
  of O tokens P + T (N - 1) + (T - 1)(O + 1), the whole conversation, which the engine's
  cache holds at once (not one turn's N);
- the train step's temporaries for one micro-batch of r rows and T = P + M columns (M:
  `Workload.response_columns`, N or the trajectory's columns), by the
  train step's own rules (`locojax/train/train_memory.py`), not restated here:
  activations, what `jax.vjp` keeps of one decoder layer (`layer_residual_bytes`, traced
  at these shapes, nothing runs) times L without remat, or every layer's input
  (L · r · T · d · s) plus two layers' residuals with remat; and the logits, five f32
  buffers of one chunk (`logits_bytes`: the decoder's own chunking rule,
  `decoder.logprob_chunk_size`, whole up to its LOGITS_WHOLE_BYTES).
The KV cache and the train step's buffers are never live at once: the trainer releases the
engine's cache after each rollout (`Engine.release_cache`), so the peak is what is held
throughout (params, optimizer, reference, rollout's weights) plus the larger of the rollout
(the cache) and the train step (gradients, activations, logits), as the memory plan counts it.
The planner tries, in the memory plan's order of hints, grad_accum, remat, FSDP and a
smaller rollout batch per chip until the peak fits 90% of HBM.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from locojax.engine.extend import slots_needed
from locojax.model import lora
from locojax.model.attention import KVCache
from locojax.predict.flops import ITEMSIZE
from locojax.predict.phases import Ctx
from locojax.rl.config import LearnerConfig
from locojax.train import train_memory

GB = 1e9
HEADROOM = 0.9  # of HBM: what XLA and the runtime keep for themselves
ROLLOUT = ("KV cache",)  # live only while rollout runs
TRAIN = ("gradients", "activations", "logits")  # live only while the train step runs


def layer_bytes(cfg, dtype: str, rows: int, t: int, platform: str) -> int:
    """What autodiff keeps of one decoder layer on rows x t in `dtype` (the train step's
    count, `train_memory.layer_residual_bytes`, traced at these shapes). Every residual is
    a per-row array or a fixed one, so the count is affine in the rows: it is traced at 1 and
    2 rows and extended, two traces per length however many plans the planner tries."""
    cfg = dataclasses.replace(cfg, compute_dtype=dtype)
    one, two = (train_memory.layer_residual_bytes(cfg, r, max(1, t), platform) for r in (1, 2))
    return one + (max(1, rows) - 1) * (two - one)


@dataclasses.dataclass
class Plan:
    settings: dict
    parts: dict[str, float]  # bytes per device
    hbm: float

    def _sum(self, names) -> float:
        return sum(self.parts.get(n, 0.0) for n in names)

    @property
    def peak(self) -> float:
        held = sum(v for k, v in self.parts.items() if k not in ROLLOUT + TRAIN)
        return held + max(self._sum(ROLLOUT), self._sum(TRAIN))

    @property
    def peak_phase(self) -> str:
        return "rollout" if self._sum(ROLLOUT) > self._sum(TRAIN) else "train step"

    @property
    def fits(self) -> bool:
        return self.peak <= HEADROOM * self.hbm

    def format(self) -> str:
        st = self.settings
        head = (f"memory per device (analytic; FSDP over {st['fsdp']}, rollout tensor-parallel "
                f"{st['mp']}, grad_accum {st['grad_accum']}, "
                f"remat {'on' if st['remat'] else 'off'},"
                f" {st['dtype']}):")
        parts = ", ".join(f"{k} {v / GB:.2f} GB" for k, v in self.parts.items() if v)
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (f"{head}\n  {parts}\n  peak {self.peak / GB:.2f} GB in the {self.peak_phase} "
                f"(the KV cache and the train step's buffers are never live at once) of "
                f"{self.hbm / GB:.1f} GB ({100 * self.peak / self.hbm:.0f}%): {verdict} "
                f"(limit {HEADROOM:.0%})")


def plan_for(ctx: Ctx, fsdp: int, mp: int, grad_accum: int, remat: bool,
             learner_chips: int | None = None) -> Plan:
    cfg, wl = ctx.cfg, ctx.wl
    chips = learner_chips or ctx.cluster.chips
    s = ITEMSIZE[ctx.dtype]
    p, t = float(cfg.num_params()), float(lora.num_trainable(cfg))
    parts = {"params": 4 * t / fsdp, "optimizer": 8 * t / fsdp,
             "gradients": train_memory.gradient_bytes(
                 cfg, LearnerConfig(remat=remat, grad_accum=grad_accum), int(4 * t / fsdp))}
    if lora.enabled(cfg):  # the base is frozen, and is the reference; the sampler merges
        parts["frozen base"] = np.dtype(cfg.lora.base_dtype).itemsize * p / fsdp
        parts["merged weights"] = 4 * p / mp
    elif wl.beta > 0:
        parts["reference"] = s * p / fsdp
    if s < 4:
        parts["rollout weights"] = s * p / mp
    m = wl.response_columns  # multi-turn: the whole trajectory, not one turn's cap
    n, block = KVCache.blocks(slots_needed(wl.prompt_columns, wl.max_new, wl.turns,
                                           1 + wl.obs_tokens))
    groups = max(1.0, ctx.cluster.chips / mp)  # each row's keys and values, and its validity
    parts["KV cache"] = wl.rows / groups * n * block * (ctx.mc.kv_bytes_per_token() / mp + 1)
    micro = max(1, math.ceil(wl.rows / grad_accum))  # one micro-batch, every chip's rows
    rows = max(1, math.ceil(micro / chips))  # on one chip
    cols = wl.prompt_columns + m
    platform = "cpu" if ctx.cluster.hw.is_cpu else ctx.cluster.hw.kind
    layer = layer_bytes(cfg, ctx.dtype, rows, cols - 1, platform)
    if remat:
        acts = cfg.num_hidden_layers * rows * cols * cfg.hidden_size * s + 2 * layer
    else:
        acts = cfg.num_hidden_layers * layer
    parts["activations"] = acts
    parts["logits"] = train_memory.logits_bytes(micro, rows, m, cfg.vocab_size)
    settings = {"fsdp": fsdp, "mp": mp, "grad_accum": grad_accum, "remat": remat,
                "dtype": ctx.dtype}
    return Plan(settings, parts, float(ctx.cluster.hw.hbm_bytes.value))


def fit(ctx: Ctx, learner_chips: int | None = None) -> Plan:
    """The first plan that fits, in the memory plan's order of escalation (`plan_fit.fit`,
    as `--remat auto --grad-accum auto` runs it): as asked; remat; then with remat more
    micro-batches (grad_accum doubling up to the rows per chip); then FSDP over twice the
    chips, from the top. Else the last (smallest) one tried."""
    chips = learner_chips or ctx.cluster.chips
    mp = ctx.model_parallel()
    rows_per_chip = max(1, ctx.wl.rows // chips)
    last = None
    fsdp = 1
    while fsdp <= chips:
        tries = [(ctx.remat, 1)] + [(True, a) for a in _doublings(rows_per_chip)]
        for remat, accum in tries:
            last = plan_for(ctx, fsdp, mp, accum, remat, chips)
            if last.fits:
                return last
        fsdp *= 2
    return last


def _doublings(top: int) -> list[int]:
    """1, 2, 4, ... up to `top`."""
    out, a = [], 1
    while a <= top:
        out.append(a)
        a *= 2
    return out
