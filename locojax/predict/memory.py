"""Memory per device, analytic: the memory plan's accounting (locojax/train/memory_plan.py)
for hardware that is not here, and the settings that make a run fit.

What a learner chip holds (bytes; P parameters, FSDP over n chips, compute itemsize s):
- params 4P/n (f32 master), AdamW moments 8P/n, gradients 4P/n (8P/n with grad_accum > 1);
- the reference model sP/n with β > 0; a compute-dtype copy of the weights sP/mp for
  rollout when s < 4 (tensor parallel over mp chips);
- the KV cache of its rollout rows: rows · S · 2 L k h s / mp (S = P + N - 1 slots);
- the train step's temporaries for one micro-batch of r rows and T columns: activations,
  L · r · T · a with a = s (10 d + 6 f + 4 (n + 2k) h) + 12 n T per token per layer
  (without remat; what `jax.vjp` keeps of `decoder._layer`, the attention scores' f32 copies
  at 12 bytes each; tests/test_predict_memory.py checks it against the memory plan's traced
  `layer_residual_bytes`), or L · r · T · d · s plus one layer's a with remat; and five f32
  buffers of a chunk of logits, r · C · V · 4 (C: T, or a chunk of positions).
The KV cache and the train step's buffers are never live at once: the trainer releases the
engine's cache after each rollout (`Engine.release_cache`), so the peak is what is held
throughout (params, optimizer, reference, rollout's weights) plus the larger of the rollout
(the cache) and the train step (gradients, activations, logits), as the memory plan counts it.
The planner tries, in the memory plan's order of hints, grad_accum, remat, FSDP and a
smaller rollout batch per chip until the peak fits 90% of HBM.
"""

from __future__ import annotations

import dataclasses

from locojax.predict.flops import ITEMSIZE
from locojax.predict.phases import Ctx

GB = 1e9
HEADROOM = 0.9  # of HBM: what XLA and the runtime keep for themselves
ROLLOUT = ("KV cache",)  # live only while rollout runs
TRAIN = ("gradients", "activations", "logits")  # live only while the train step runs


def activation_bytes_per_token_layer(cfg, itemsize: int, keys: float) -> float:
    d, f, n, k, h = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                     cfg.num_key_value_heads, cfg.head_dim)
    return itemsize * (10 * d + 6 * f + 4 * (n + 2 * k) * h) + 12 * n * keys


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
    p = float(cfg.num_params())
    parts = {"params": 4 * p / fsdp, "optimizer": 8 * p / fsdp,
             "gradients": (8 if grad_accum > 1 else 4) * p / fsdp}
    if wl.beta > 0:
        parts["reference"] = s * p / fsdp
    if s < 4:
        parts["rollout weights"] = s * p / mp
    slots = wl.prompt_columns + wl.max_new - 1
    groups = max(1.0, ctx.cluster.chips / mp)
    parts["KV cache"] = wl.rows / groups * slots * ctx.mc.kv_bytes_per_token() / mp
    rows = max(1.0, wl.rows / chips / grad_accum)  # one micro-batch on one chip
    cols = wl.prompt_columns + wl.max_new
    layer = activation_bytes_per_token_layer(cfg, s, cols)
    if remat:
        acts = cfg.num_hidden_layers * rows * cols * cfg.hidden_size * s + rows * cols * layer
    else:
        acts = cfg.num_hidden_layers * rows * cols * layer
    parts["activations"] = acts
    chunk = min(wl.max_new, max(1, int(64 * 2 ** 20 // (rows * cfg.vocab_size * 4))))
    parts["logits"] = 5 * rows * chunk * cfg.vocab_size * 4
    settings = {"fsdp": fsdp, "mp": mp, "grad_accum": grad_accum, "remat": remat,
                "dtype": ctx.dtype}
    return Plan(settings, parts, float(ctx.cluster.hw.hbm_bytes.value))


def fit(ctx: Ctx, learner_chips: int | None = None) -> Plan:
    """The first plan that fits, trying in order: more micro-batches (grad_accum up to the
    rows per chip), remat, FSDP over more chips; else the last (smallest) one tried."""
    chips = learner_chips or ctx.cluster.chips
    mp = ctx.model_parallel()
    rows_per_chip = max(1, ctx.wl.rows // chips)
    last = None
    fsdp = 1
    while fsdp <= chips:
        for remat in (False, True):
            accum = 1
            while accum <= rows_per_chip:
                last = plan_for(ctx, fsdp, mp, accum, remat, chips)
                if last.fits:
                    return last
                accum *= 2
        fsdp *= 2
    return last
