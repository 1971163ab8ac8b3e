"""Tables and plots of predictions (what `locojax predict` prints and draws)."""

from __future__ import annotations

from locojax.predict.modes import DEVICE, HOST, NETWORK, Prediction

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


def stacked_bars(labels: list[str], preds: list[Prediction], title: str, path: str,
                 paper: dict[str, tuple[float, float]] | None = None) -> str:
    """Host / network / compute shares per label as stacked bars, host at the bottom; the
    paper's shares, where given ({label: (host, network)}), as marks at the tops of the
    host and the host + network segments."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    bottom = [0.0] * len(preds)
    for cat, names, color in (("host", HOST, "#dd8452"), ("network", NETWORK, "#55a868"),
                              ("compute", DEVICE, "#4c72b0")):
        vals = [p.share(names) for p in preds]
        ax.bar(labels, vals, bottom=bottom, label=cat, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for label, (host, net) in (paper or {}).items():
        i = labels.index(label)
        ax.plot([i - 0.45, i + 0.45], [host, host], "k-", lw=2, label="paper: host share")
        ax.plot([i - 0.45, i + 0.45], [host + net, host + net], "k:", lw=2,
                label="paper: host + network")
    ax.set_ylabel("share of the step")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    plt.setp(ax.get_xticklabels(), rotation=20, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def lines_plot(x: list, series: dict[str, list[float]], xlabel: str, ylabel: str, title: str,
               path: str, logy: bool = False,
               marks: dict[str, tuple[list, list]] | None = None) -> str:
    """Lines per series; `marks`: labelled points drawn as black stars (the paper's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, ys in series.items():
        ax.plot(x, ys, "o-", label=name)
    for name, (mx, my) in (marks or {}).items():
        ax.plot(mx, my, "k*", markersize=12, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
