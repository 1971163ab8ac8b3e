"""Tables of predictions: what `locojax predict` prints (the plots of the studies are
benchmarks/predict_plots.py).

What a buyer can act on: throughput, chip-hours, and how far the uncertain constants move
them (the range: locojax/predict/uncertainty.py). Throughput of a step of R rows taking t
seconds on C chips: R / t samples/s, the generated tokens R · turns · mean completion / t
tokens/s, each also per chip; chip-hours per 1,000 steps C · 1000 t / 3600.
"""

from __future__ import annotations

import dataclasses

from locojax.predict import hardware, memory
from locojax.predict.layout import MAX_CHIPS, Choice, Given, choose, smallest_fit
from locojax.predict.modes import Prediction
from locojax.predict.phases import Ctx
from locojax.predict.uncertainty import Range

GB = 1e9

ORDER = ("admission", "prefill", "decode", "tp_comm", "extend", "env", "detokenize_reward",
         "batch", "dispatch", "dispatch_latency", "gather", "scatter", "train", "allreduce",
         "collectives", "wait_rollouts", "weight_sync", "other")


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if x < 10 else f"{x * 1e3:.0f}"


def memory_text(plan: memory.Plan) -> str:
    """The memory per device of a layout's plan, its parts and whether it fits."""
    st, a = plan.settings, plan.account
    head = (f"memory per device (analytic; FSDP over {st['fsdp']}, rollout tensor-parallel "
            f"{st['mp']}, grad_accum {st['grad_accum']}, "
            f"remat {'on' if st['remat'] else 'off'},"
            f" {st['dtype']}):")
    host = {k: " (host memory but in its program)" for k in a.offloaded}
    parts = ", ".join(f"{k} {v / GB:.2f} GB{host.get(k, '')}"
                      for k, v in plan.parts.items() if v)
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    return (f"{head}\n  {parts}\n  peak {plan.peak / GB:.2f} GB in the {plan.peak_phase} "
            f"(the KV cache and the train step's buffers are never live at once) of "
            f"{plan.hbm / GB:.1f} GB ({100 * plan.peak / plan.hbm:.0f}%): {verdict} "
            f"(limit {memory.HEADROOM:.0%})")


def wave_note(choice: Choice) -> str:
    """What waves mean for a locojax run, where the layout needs them."""
    waves = choice.plan.settings.get("waves", 1)
    if waves <= 1:
        return ""
    return (f"the KV cache of all rows does not fit: rollout runs in {waves} waves of "
            f"1/{waves} of the rows (the plan's KV cache is one wave's). locojax's engine "
            f"generates a host's rows in one batch, so a locojax run needs {waves}x fewer "
            "--rollout.prompts-per-step, or more chips")


def phase_table(preds: list[Prediction]) -> str:
    preds = [p for p in preds if p.phases]
    names = [n for n in ORDER if any(p.phases.get(n, 0) > 0 for p in preds)]
    lines = ["| mode | step s | " + " | ".join(f"{n} ms" for n in names)
             + " | host / network / compute |",
             "|---|---|" + "---|" * len(names) + "---|"]
    for p in preds:
        sh = p.shares
        cells = " | ".join(ms(p.phases.get(n, 0.0)) if n in p.phases else "-" for n in names)
        split = (f"{sh['host']:.0%} / {sh['network']:.0%} / {sh['compute']:.0%}"
                 if p.step_override is None else f"learner waits {p.wait / p.step:.0%}")
        lines.append(f"| {p.mode} | {p.step:.3f} | {cells} | {split} |")
    return "\n".join(lines)


def staleness_line(p: Prediction) -> str:
    if not p.staleness:
        return ""
    dist = ", ".join(f"{i}: {s:.0%}" for i, s in enumerate(p.staleness) if s > 0.0005)
    mean = sum(i * s for i, s in enumerate(p.staleness))
    return f"staleness mean {mean:.2f} ({dist})"


def _common_tail(a: str, b: str) -> str:
    """The longest common suffix of a and b, starting at a word."""
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    tail = a[len(a) - n:]
    if n < len(a) and a[len(a) - n - 1] != " ":
        tail = tail[tail.find(" ") + 1:] if " " in tail else ""
    return tail


def _records(sources: list[str], shortest: int = 80) -> list[str]:
    """Long tails several sources share (a calibration's record), shortest first."""
    out, left = [], list(sources)
    while True:
        tails = [t for i, a in enumerate(left) for b in left[i + 1:]
                 if len(t := _common_tail(a, b)) >= shortest]
        if not tails:
            return out
        tail = min(tails, key=len)
        out.append(tail)
        left = [s for s in left if not s.endswith(tail)]


def constants(ledger) -> list[str]:
    """Every constant a prediction used, one short line each, its source cited as [n]; the
    sources as a legend after them, and a long record several sources share (a
    calibration's command, date and load) printed once, as {A}, {B}, ..."""
    sources: dict[str, int] = {}
    lines = []
    for name, c in ledger.used.items():
        n = sources.setdefault(c.source, len(sources) + 1)
        lines.append(f"{name} = {c.value:.4g} {c.unit} ({c.origin} [{n}])")
    records = _records(list(sources))
    tags = {r: "{" + chr(ord("A") + i) + "}" for i, r in enumerate(records)}
    lines.append("sources:")
    for src, n in sources.items():
        r = next((r for r in records if src.endswith(r)), None)
        lines.append(f"[{n}] " + (src[:len(src) - len(r)] + tags[r] if r else src))
    lines += [f"{tags[r]} {r}" for r in records]
    return lines


def _span(f, t: float, lo: float | None, hi: float | None) -> str:
    """f(t), and the range f takes over [lo, hi] where given."""
    if lo is None:
        return f"{f(t):.3g}"
    a, b = sorted((f(lo), f(hi)))
    return f"{f(t):.3g} ({a:.3g}-{b:.3g})"


def throughput_lines(ctx: Ctx, preds, rng: Range | None, steps: int = 0) -> list[str]:
    """Per mode: samples/s, tokens/s (each per chip), chip-hours per 1,000 steps, with the
    range where given, and the whole run's hours where `steps` is given."""
    wl, chips = ctx.wl, ctx.cluster.chips
    tokens = wl.rows * wl.turns * wl.completion.mean
    metrics = (lambda s: wl.rows / s, lambda s: wl.rows / s / chips,  # noqa: E731
               lambda s: tokens / s, lambda s: tokens / s / chips,
               lambda s: chips * 1000 * s / 3600)
    lines = ["| mode | samples/s | per chip | tokens/s | per chip | chip-hours / 1,000 steps |"
             + (" run hours |" if steps else ""),
             "|---|---|---|---|---|---|" + ("---|" if steps else "")]
    for p in (p for p in preds if p.phases):
        lo = rng.low.get(p.mode) if rng else None
        hi = rng.high.get(p.mode) if rng else None
        cells = " | ".join(_span(f, p.step, lo, hi) for f in metrics)
        lines.append(f"| {p.mode} | {cells} |" + (f" {steps * p.step / 3600:.3g} |" if steps
                                                  else ""))
    return lines


def refusal(choice: Choice, ctx: Ctx, given: Given) -> str:
    """Why the run does not fit, and the smallest layout that does."""
    p = choice.plan
    head = (f"does not fit: at best ({choice.describe()}) the peak is {p.peak / 1e9:.1f} GB "
            f"of {p.hbm / 1e9:.1f} GB per chip ({100 * p.peak / p.hbm:.0f}%; limit "
            f"{memory.HEADROOM:.0%})")
    fit, freed = smallest_fit(ctx, given)
    if fit is None:
        return (f"{head}; no layout of up to {MAX_CHIPS} {ctx.cluster.hw.name} chips fits "
                f"(rollout stays inside a host of {ctx.cluster.chips_per_host} chips). "
                + elsewhere(ctx))
    also = f", without the fixed {freed}" if freed else ""
    return (f"{head}. The smallest layout that fits: {fit.describe()}{also} "
            f"(--cluster {ctx.cluster.hw.name}-{fit.ctx.cluster.chips}; peak "
            f"{fit.plan.peak / 1e9:.1f} GB)")


def elsewhere(ctx: Ctx) -> str:
    """The smallest layout that fits on each other shipped accelerator profile."""
    found = []
    for name in hardware.known():
        hw = hardware.load(name)
        if hw.is_cpu or hw.name == ctx.cluster.hw.name:
            continue
        start = hardware.Cluster(hw, int(hw.chips_per_host.value))
        c = dataclasses.replace(ctx, cluster=start, tp=0, fsdp_chips=0)
        first = choose(c)
        fit = first if first.fits else smallest_fit(c)[0]
        if fit is not None:
            found.append(f"--cluster {hw.name}-{fit.ctx.cluster.chips} ({fit.describe()})")
    if not found:
        return "No shipped profile fits it either."
    return "Smallest that fit on the other shipped profiles: " + "; ".join(found)
