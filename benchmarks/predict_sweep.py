"""`locojax predict`'s cost model over the shipped model sizes, or over chip counts: a study
of runs around the one a user asked for, so a benchmark (it was `locojax predict ...
--sweep`), beside the paper's studies (`paper_report.py`).

    .venv/bin/python -m benchmarks.predict_sweep sizes|chips [--workload gsm8k]
        [--model qwen3-0.6b] [--cluster v7x-64] [--plot FILE]

sizes: every shipped dense config (`paper.SIZES`) on the given cluster (chips doubled where a
model fits in no layout; each in its fastest layout that fits, `layout.py`), controller and
colocated, with host / network / compute shares and a stacked-bar plot of the colocated
step's split. chips: powers of two from one host's chips up to the given count, colocated,
controller and the best DA fraction, step time plotted.
"""

from __future__ import annotations

import argparse
import dataclasses

from benchmarks.paper import SIZES
from benchmarks.predict_plots import lines_plot, stacked_bars
from locojax.predict import hardware, layout, modes, placement, presets, spec
from locojax.predict.phases import Ctx


def with_model(ctx: Ctx, model: str | None = None, chips: int | None = None) -> layout.Choice:
    """ctx with another model or chip count, in its fastest layout that fits (the layout
    chosen for speed, so that a larger model is never faster for being sharded more)."""
    cfg = ctx.cfg if model is None else spec.load(model)[0]
    cl = ctx.cluster if chips is None else hardware.Cluster(ctx.cluster.hw, chips)
    new = dataclasses.replace(ctx, cfg=cfg, model_name=model or ctx.model_name, cluster=cl,
                              tp=0, fsdp_chips=0, remat=False)
    return layout.choose(new)


def run(kind: str, ctx: Ctx, plot: str) -> str:
    if kind == "sizes":
        return _sizes(ctx, plot)
    if kind == "chips":
        return _chips(ctx, plot)
    raise ValueError(f"a sweep is over sizes or chips, not {kind!r}")


def _sizes(ctx: Ctx, plot: str) -> str:
    lines = ["| model | params | chips | layout | colocated s | controller s | colocated host "
             "/ network / compute | controller host / network / compute |",
             "|---|---|---|---|---|---|---|---|"]
    labels, preds = [], []
    for m in SIZES:
        chips = ctx.cluster.chips
        choice = with_model(ctx, m, chips)
        while not choice.fits and chips < layout.MAX_CHIPS:
            chips *= 2
            choice = with_model(ctx, m, chips)
        c = choice.ctx
        if not choice.fits:
            lines.append(f"| {m} | {c.cfg.num_params() / 1e9:.1f}B | - | fits in no layout of "
                         f"up to {layout.MAX_CHIPS} chips | | | | |")
            continue
        co, ct = modes.colocated(c), modes.controller(c)
        f = lambda p: " / ".join(  # noqa: E731
            f"{p.shares[k]:.0%}" for k in ("host", "network", "compute"))
        st = choice.plan.settings
        lines.append(f"| {m} | {c.cfg.num_params() / 1e9:.1f}B | {chips} | tp {st['mp']}, "
                     f"FSDP {st['fsdp']}{', remat' * st['remat']} | {co.step:.3f} | "
                     f"{ct.step:.3f} | {f(co)} | {f(ct)} |")
        labels.append(m)
        preds.append(co)
    stacked_bars(labels, preds, f"colocated step split, {ctx.wl.name}, "
                        f"{ctx.cluster.hw.name}", plot)
    return "\n".join(lines) + f"\nplot: {plot}"


def _chips(ctx: Ctx, plot: str) -> str:
    per_host = ctx.cluster.chips_per_host
    counts, n = [], per_host
    while n <= ctx.cluster.chips:
        counts.append(n)
        n *= 2
    lines = ["| chips | hosts | colocated s | controller s | controller / colocated | best DA "
             "| DA s |", "|---|---|---|---|---|---|---|"]
    series = {"colocated": [], "controller": [], "best DA": []}
    for n in counts:
        choice = with_model(ctx, chips=n)
        if not choice.fits:
            lines.append(f"| {n} | {choice.ctx.cluster.hosts} | does not fit | | | | |")
            for s in series.values():
                s.append(float("nan"))
            continue
        c = choice.ctx
        co, ct = modes.colocated(c), modes.controller(c)
        adv = placement.advise(c) if c.cluster.hosts >= 2 else None
        best = adv.best_da if adv else None
        da = best[1].step if best else float("nan")
        lines.append(f"| {n} | {c.cluster.hosts} | {co.step:.3f} | {ct.step:.3f} | "
                     f"{ct.step / co.step:.2f} | {best[0] if best else '-'} | {da:.3f} |")
        series["colocated"].append(co.step)
        series["controller"].append(ct.step)
        series["best DA"].append(da)
    lines_plot(counts, series, "chips", "s / step", f"{ctx.wl.name} on "
                      f"{ctx.cluster.hw.name}", plot, logy=True)
    return "\n".join(lines) + f"\nplot: {plot}"


def context(workload: str, model: str, cluster: str) -> Ctx:
    """The context `locojax predict workload WORKLOAD --model MODEL --cluster CLUSTER` predicts,
    in its fastest layout that fits."""
    wl, env_workers = presets.load(workload)
    ctx = Ctx(spec.load(model)[0], model, wl, hardware.parse_cluster(cluster),
              env_workers=env_workers)
    return layout.choose(ctx).ctx


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("sizes", "chips"))
    ap.add_argument("--workload", default="gsm8k", help=f"one of {', '.join(presets.names())}")
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--cluster", default="v7x-64", help="PROFILE-CHIPS")
    ap.add_argument("--plot", default="predict_sweep.png")
    a = ap.parse_args()
    print(run(a.kind, context(a.workload, a.model, a.cluster), a.plot))
