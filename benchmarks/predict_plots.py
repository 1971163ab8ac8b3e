"""Plots of the cost model's studies (`predict_sweep.py`, `paper_report.py`): a step's
host / network / compute split as stacked bars, and step times or ratios as lines. A leaf:
it imports no benchmarks module, and predict itself draws nothing."""

from __future__ import annotations

from locojax.predict.modes import DEVICE, HOST, NETWORK, Prediction


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
