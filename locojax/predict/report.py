"""Tables of predictions: what `locojax predict` prints (the plots of the studies are
benchmarks/predict_plots.py)."""

from __future__ import annotations

from locojax.predict.modes import Prediction

ORDER = ("admission", "prefill", "decode", "tp_comm", "extend", "env", "detokenize_reward",
         "batch", "dispatch", "dispatch_latency", "gather", "scatter", "train", "allreduce",
         "collectives", "wait_rollouts", "weight_sync", "other")


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if x < 10 else f"{x * 1e3:.0f}"


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
