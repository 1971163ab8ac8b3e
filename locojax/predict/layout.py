"""The layout a run is predicted on: rollout tensor parallelism, FSDP, remat and
micro-batches, chosen for speed among those whose memory fits, and honouring what the
command fixes (`--rollout.tp`, `--train.mesh`, `--remat on|off`, `--grad-accum`).

Candidates (accelerators): tp a power of two up to one host's chips that divides the heads
and the MLP width (locojax's rollout stays inside a host, locojax/train/meshes.py), FSDP a
power of two dividing the chips, remat off and on, and for each the fewest micro-batches
that fit; where the train step fits but the KV cache of all rows does not, rollout in the
fewest waves whose cache fits (each wave a decode loop over its share of the rows). Each
that fits (`memory.plan_for`) is timed as the colocated step, and the fastest wins:
choosing the first that fits would, e.g., shard a 1.7B model over more chips than a 4B one
and make the larger faster. A run that fits in no layout is refused with the
smallest chip count (doubling) that does fit, and its layout (`smallest_fit`; the command's
message, locojax/commands/predict_report.py). On this machine (cpu-here)
the layout is the command's; `locojax train --plan-only` gives XLA's exact plan.
"""

from __future__ import annotations

import dataclasses
import math

from locojax.predict import hardware, memory, modes
from locojax.predict.phases import Ctx

MAX_CHIPS = 65536  # the search for a layout that fits stops here


@dataclasses.dataclass(frozen=True)
class Given:
    """What the command fixes (0 / None: free; `predict_train.given_of` reads a run's)."""

    tp: int = 0
    fsdp: int = 0
    data: int = 0
    remat: bool | None = None
    grad_accum: int = 0

    def describe(self) -> str:
        parts = [f"{k} {v}" for k, v in (("tp", self.tp), ("fsdp", self.fsdp),
                                         ("grad_accum", self.grad_accum)) if v]
        if self.remat is not None:
            parts.append(f"remat {'on' if self.remat else 'off'}")
        return ", ".join(parts) or "nothing"


@dataclasses.dataclass
class Choice:
    ctx: Ctx  # the context with the layout applied
    plan: memory.Plan
    step: float  # the colocated step it was chosen by (s); nan where nothing fits
    tried: int  # candidates that fit

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def describe(self) -> str:
        st = self.plan.settings
        waves = st.get("waves", 1)
        return (f"{self.ctx.cluster.chips} chips: rollout tp {st['mp']}, FSDP {st['fsdp']}, "
                f"remat {'on' if st['remat'] else 'off'}, grad_accum {st['grad_accum']}"
                + (f", rollout in {waves} waves" if waves > 1 else ""))


def _in_waves(plan: memory.Plan) -> memory.Plan:
    """The plan with rollout in the fewest waves whose KV cache fits beside what is held
    throughout (`settings["waves"]`; 1 where all rows fit, or where nothing would)."""
    plan.settings.setdefault("waves", 1)
    if plan.fits or plan.peak_phase != "rollout":
        return plan
    a = plan.account
    kv = a.rollout["KV cache"]
    limit = memory.HEADROOM * plan.hbm
    room = limit - (a.phases["rollout"] - kv)
    if room <= 0 or a.phases["train step"] > limit:
        return plan
    waves = math.ceil(kv / room)
    rollout = dict(a.rollout, **{"KV cache": kv / waves})
    return memory.Plan(dict(plan.settings, waves=waves),
                       dataclasses.replace(a, rollout=rollout), plan.hbm)


def _powers(limit: int, divides: int = 0) -> list[int]:
    out, n = [], 1
    while n <= limit:
        if not divides or divides % n == 0:
            out.append(n)
        n *= 2
    return out


def _tps(ctx: Ctx, given: Given) -> list[int]:
    if given.tp:
        return [given.tp]
    cfg, cl = ctx.cfg, ctx.cluster
    return [t for t in _powers(min(cl.chips, cl.chips_per_host))
            if cfg.num_attention_heads % t == 0 and cfg.intermediate_size % t == 0]


def choose(ctx: Ctx, given: Given = Given()) -> Choice:
    """The fastest layout that fits on ctx's cluster, or, where none fits, the one with the
    smallest peak (its `fits` is False)."""
    if ctx.cluster.hw.is_cpu:
        ctx = dataclasses.replace(ctx, fsdp_chips=given.fsdp or ctx.fsdp_chips)
        plan = memory.plan_for(ctx, given.fsdp or 1, ctx.model_parallel(),
                               max(1, given.grad_accum), bool(given.remat))
        return Choice(ctx, plan, float("nan"), int(plan.fits))
    chips = ctx.cluster.chips
    rows_per_chip = max(1, ctx.wl.rows // chips)
    best, smallest, tried = None, None, 0
    for tp in _tps(ctx, given):
        for fsdp in [given.fsdp] if given.fsdp else _powers(chips, chips):
            for remat in [given.remat] if given.remat is not None else [False, True]:
                accums = [given.grad_accum] if given.grad_accum else _powers(rows_per_chip)
                plan = None
                for accum in accums:
                    plan = _in_waves(memory.plan_for(ctx, fsdp, tp, accum, remat))
                    if plan.fits:
                        break
                if smallest is None or plan.peak < smallest.peak:
                    smallest = plan
                if not plan.fits:
                    continue
                tried += 1
                c = dataclasses.replace(ctx, tp=tp, fsdp_chips=fsdp, remat=remat,
                                        waves=plan.settings["waves"])
                step = modes.colocated(c).step
                if best is None or step < best.step:
                    best = Choice(c, plan, step, 0)
    if best is None:
        st = smallest.settings
        c = dataclasses.replace(ctx, tp=st["mp"], fsdp_chips=st["fsdp"], remat=st["remat"],
                                waves=st["waves"])
        return Choice(c, smallest, float("nan"), 0)
    best.tried = tried
    return best


def smallest_fit(ctx: Ctx, given: Given = Given()) -> tuple[Choice | None, str]:
    """The fewest chips (doubling from ctx's) on which the run fits, keeping what the
    command fixed where it can, else freeing it: (choice, what was freed) or (None, "")."""
    for keep in (given, Given()):
        chips = ctx.cluster.chips * 2
        while chips <= MAX_CHIPS:
            cl = hardware.Cluster(ctx.cluster.hw, chips)
            mesh_ok = not (keep.data or keep.fsdp)  # a mesh covers exactly its chips
            tp_ok = not keep.tp or keep.tp <= cl.chips_per_host
            if mesh_ok and tp_ok:
                c = choose(dataclasses.replace(ctx, cluster=cl, tp=keep.tp,
                                               fsdp_chips=keep.fsdp), keep)
                if c.fits:
                    return c, ("" if keep is given else given.describe())
            chips *= 2
        if given == Given():
            break
    return None, ""

