"""`locojax plot RUN_DIR`: one PNG of reward, held-out accuracy, step time and phase breakdown."""

from __future__ import annotations

import dataclasses
import os
import sys

import tyro

from locojax.metrics import METRICS_FILE, PERF_FILE, read_jsonl

# First match wins, so runs from any task plot their headline numbers.
REWARD_KEYS = ("reward/mean", "rollout/reward_mean", "critic/rewards/mean")
ACCURACY_KEYS = ("eval/accuracy", "eval/pass@1")


@dataclasses.dataclass(frozen=True)
class PlotArgs:
    """Plot a run directory's metrics.jsonl and perf.jsonl."""

    run_dir: tyro.conf.Positional[str]
    """The run directory (holds metrics.jsonl and perf.jsonl)."""
    out: str = ""
    """Output PNG path (default RUN_DIR/summary.png)."""


def _series(rows: list[dict], key: str):
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _first_present(rows, keys):
    return next((k for k in keys if any(k in r for r in rows)), None)


def plot(run_dir: str, out: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(metrics_path):
        raise FileNotFoundError(f"{metrics_path} not found: is {run_dir!r} a locojax run directory?")
    rows = read_jsonl(metrics_path)
    perf_path = os.path.join(run_dir, PERF_FILE)
    perf = read_jsonl(perf_path) if os.path.exists(perf_path) else []

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, keys, title in ((axes[0, 0], REWARD_KEYS, "mean reward"),
                            (axes[0, 1], ACCURACY_KEYS, "held-out accuracy")):
        key = _first_present(rows, keys)
        if key:
            ax.plot(*_series(rows, key), marker="o", ms=3)
        ax.set_title(f"{title} ({key or 'not logged'})")
        ax.set_xlabel("step")
    ax = axes[1, 0]
    ax.plot(*_series(perf, "perf/step_time"))
    ax.set_title("step time (s, compile excluded)")
    ax.set_xlabel("step")
    ax = axes[1, 1]
    phases = sorted({k for r in perf for k in r if k.startswith("perf/phase/")})
    steps = [r["step"] for r in perf]
    bottom = [0.0] * len(perf)
    for k in phases:
        vals = [float(r.get(k, 0.0)) for r in perf]
        ax.bar(steps, vals, bottom=bottom, label=k.removeprefix("perf/phase/"))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_title("phase breakdown (s)")
    ax.set_xlabel("step")
    if phases:
        ax.legend(fontsize=7)
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    fig.tight_layout()
    out = out or os.path.join(run_dir, "summary.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    args = tyro.cli(PlotArgs, args=argv, prog="locojax plot")
    try:
        print(plot(args.run_dir, args.out))
    except FileNotFoundError as e:
        print(f"locojax plot: {e}", file=sys.stderr)
        return 2
    return 0
