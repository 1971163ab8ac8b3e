"""The LoCoJAX paper's three studies, reproduced by the cost model beside the paper's figures
(`paper_report.py` prints them).

Paper figures (issue 25; docs/design.md):
- size sweep, dense 0.6B → 405B, decode-heavy, TPU v7x: at 0.6B host orchestration is 36% of
  the (single-controller) step and the network 2%; for large models network costs dominate
  the non-compute time;
- CO vs a tuned Pathways single controller, Qwen3-0.6B, 8-64 v7x chips, GSM8K,
  NuminaMath-CoT, SWE-agent: CO 1.3-3.6x faster per step; on GSM8K CO on 8 chips completes a
  step faster than the controller on 64;
- DA on NuminaMath-CoT at 256 chips: 75% of the hosts on rollout cuts the step ~15% vs CO.

What is fitted to what: ONE constant comes from the paper, the controller's dispatch cost
per host per round trip (`host.controller_dispatch_s`), fitted so that the controller's host
share at 0.6B in the size sweep is the paper's 36% (`fit_dispatch`). Every other figure is
predicted with it held fixed: the network share at 0.6B, the sweep's trend, all CO/controller
ratios and the DA study (which does not read it except through DA's per-lease dispatch).
Everything else is a spec, a measurement here or a stated assumption (workloads.json).

Assumed set-up, not given by the paper: the controller dispatches every decode iteration
(decode_chunk 1: "how decode iterations are run" is its second cost), decode reads the KV
cache at the actual length (a paged engine), bf16, the sweep on 64 chips (more where a
model's train state does not fit: FSDP over the fewest chips that hold it).
"""

from __future__ import annotations

import dataclasses
import functools

from locojax.predict import hardware, memory, modes, placement, presets, spec
from locojax.predict.origin import Const
from locojax.predict.phases import Ctx
from locojax.predict.uncertainty import Scaled

SIZES = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b",
         "llama-3.1-405b")
SWEEP_WORKLOAD = "numina"  # the decode-heavy one
SWEEP_CHIPS = 64
CO_CHIPS = (8, 16, 32, 64)
CO_WORKLOADS = ("gsm8k", "numina", "swe-agent")
DA_CHIPS = 256
DA_FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
DECODE_CHUNK = 1
HOST_SHARE_TARGET = 0.36  # the one figure fitted to
PROFILE = "tpu-v7x"
"""The chip the studies run on: the shipped v7x spec profile, or a chip's calibration carried
to a v7x (`carried_profile.py`; `paper_report --hardware FILE` sets it)."""


def ctx_for(model: str, workload: str, chips: int, dispatch: float | None = None,
            profile: str = "", scale: dict | None = None) -> Ctx:
    """The context of one of the studies' points; `scale`: constants moved by these
    factors (the sensitivity table), or a `uncertainty.Scaled` ledger to share."""
    cfg, _ = spec.load(model)
    wl, env_workers = presets.load(workload)
    profile = profile or PROFILE
    cl = hardware.parse_cluster(f"{profile}-{chips}")
    ctx = Ctx(cfg, model, wl, cl, dtype="bfloat16", kv_read="actual", env_workers=env_workers,
              ledger=scale if isinstance(scale, Scaled) else Scaled(scale or {}))
    ctx.fsdp_chips, ctx.remat, _ = _plan(model, workload, chips, profile)
    return with_dispatch(ctx, dispatch)


def with_dispatch(ctx: Ctx, dispatch: float | None) -> Ctx:
    """ctx with the controller's dispatch cost fitted to the paper (None: the one measured
    here, host_rates.json)."""
    if dispatch is not None:
        ctx.rates = dict(ctx.rates, controller_dispatch_s=Const(
            dispatch, "s per host per controller round trip", "fitted",
            f"to the paper's {HOST_SHARE_TARGET:.0%} host share of Qwen3-0.6B's controller "
            "step (size sweep); kept out: the network share, the sweep's trend, every CO vs "
            "controller ratio, CO@8 vs controller@64, the DA study"))
    return ctx


@functools.lru_cache(maxsize=None)
def _plan(model: str, workload: str, chips: int, profile: str) -> tuple[int, bool, bool]:
    """(FSDP chips, remat, fits) of the memory plan: it reads no time constant, so one plan
    serves every dispatch and every move of the sensitivity table."""
    cfg, _ = spec.load(model)
    wl, _ = presets.load(workload)
    ctx = Ctx(cfg, model, wl, hardware.parse_cluster(f"{profile}-{chips}"), dtype="bfloat16",
              kv_read="actual")
    plan = memory_fit(ctx)
    return plan.settings["fsdp"], plan.settings["remat"], plan.fits


def memory_fit(ctx: Ctx) -> memory.Plan:
    """The first plan that fits, in the memory plan's order of escalation (`plan_fit.fit`,
    as `--remat auto --grad-accum auto` runs it): as asked; remat; then with remat more
    micro-batches (grad_accum doubling up to the rows per chip); then FSDP over twice the
    chips, from the top. Else the last (smallest) one tried. The studies were made with
    this order; `locojax predict` times every layout that fits and takes the fastest
    (`layout.choose`), which the first that fits is not."""
    chips = ctx.cluster.chips
    mp = ctx.model_parallel()
    rows_per_chip = max(1, ctx.wl.rows // chips)
    doublings = [2 ** i for i in range(rows_per_chip.bit_length())]  # 1, 2, 4, ... <= rows
    last = None
    fsdp = 1
    while fsdp <= chips:
        for remat, accum in [(ctx.remat, 1)] + [(True, a) for a in doublings]:
            last = memory.plan_for(ctx, fsdp, mp, accum, remat)
            if last.fits:
                return last
        fsdp *= 2
    return last


def sweep_chips(model: str) -> int:
    """SWEEP_CHIPS, doubled until the model's train state and rollout weights fit."""
    chips = SWEEP_CHIPS
    while not _plan(model, SWEEP_WORKLOAD, chips, PROFILE)[2] and chips < 9216:
        chips *= 2
    return chips


def controller_host_share(dispatch: float, model: str = SIZES[0],
                          scale: dict | None = None, base: Ctx | None = None) -> float:
    """The controller's host share at `dispatch` (`base`: the context to reuse)."""
    ctx = base or ctx_for(model, SWEEP_WORKLOAD, sweep_chips(model), scale=scale)
    return modes.controller(with_dispatch(ctx, dispatch), DECODE_CHUNK).shares["host"]


def fit_dispatch(target: float = HOST_SHARE_TARGET, scale: dict | None = None) -> float:
    """Bisection (in log space) on the dispatch cost for the 0.6B host share, between 1 us
    and 10 ms (30 halvings of that factor of 10^4 leave it within a part in 10^8)."""
    lo, hi = 1e-6, 1e-2
    base = ctx_for(SIZES[0], SWEEP_WORKLOAD, sweep_chips(SIZES[0]), scale=scale)
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        if controller_host_share(mid, base=base) < target:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


@dataclasses.dataclass
class Row:
    label: str
    values: dict


def size_sweep(dispatch: float | None) -> list[Row]:
    rows = []
    for model in SIZES:
        chips = sweep_chips(model)
        ctx = ctx_for(model, SWEEP_WORKLOAD, chips, dispatch)
        ctrl, co = modes.controller(ctx, DECODE_CHUNK), modes.colocated(ctx)
        rows.append(Row(model, {"chips": chips, "params_b": ctx.cfg.num_params() / 1e9,
                                "controller": ctrl, "colocated": co,
                                "fits": _plan(model, SWEEP_WORKLOAD, chips, PROFILE)[2]}))
    return rows


def co_vs_controller(dispatch: float | None, scale: dict | None = None,
                     points=None) -> list[Row]:
    rows = []
    for wl, chips in points or [(w, n) for w in CO_WORKLOADS for n in CO_CHIPS]:
        ctx = ctx_for(SIZES[0], wl, chips, dispatch, scale=scale)
        rows.append(Row(f"{wl} @ {chips}", {
            "workload": wl, "chips": chips, "colocated": modes.colocated(ctx),
            "controller": modes.controller(ctx, DECODE_CHUNK)}))
    return rows


def da_study(dispatch: float | None, scale: dict | None = None,
             fractions=DA_FRACTIONS) -> tuple[modes.Prediction, list[Row]]:
    ctx = ctx_for(SIZES[0], SWEEP_WORKLOAD, DA_CHIPS, dispatch, scale=scale)
    co = modes.colocated(ctx)
    rows = [Row(f"f={f:g}", {"fraction": f, "da": placement.disaggregated(ctx, f)})
            for f in fractions]
    return co, rows
