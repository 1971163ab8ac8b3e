"""`locojax plot RUN_DIR`: one PNG of reward, held-out accuracy, step time and phase breakdown.

`locojax plot RUN_DIR RUN_DIR ... --out FILE`: several runs (seeds, settings) overlaid, one
line each: mean reward, held-out accuracy, and the held-out format rate where the task has
a format check.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Annotated

import tyro

from locojax.metrics import METRICS_FILE, PERF_FILE, read_jsonl

# First match wins, so runs from any task plot their headline numbers.
REWARD_KEYS = ("reward/mean", "rollout/reward_mean", "critic/rewards/mean")
ACCURACY_KEYS = ("eval/accuracy", "eval/pass@1")


@dataclasses.dataclass(frozen=True)
class PlotArgs:
    """Plot a run directory's metrics.jsonl and perf.jsonl."""

    run_dirs: Annotated[tuple[str, ...], tyro.conf.Positional,
                        tyro.conf.arg(metavar="RUN_DIR")]
    """The run directory (holds metrics.jsonl and perf.jsonl), or several to compare."""
    out: str = ""
    """Output PNG path (default RUN_DIR/summary.png; required with several runs)."""


def _series(rows: list[dict], key: str):
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _first_present(rows, keys):
    return next((k for k in keys if any(k in r for r in rows)), None)


def _metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {run_dir!r} a locojax run directory?")
    return read_jsonl(path)


COMPARED = ((REWARD_KEYS, "mean reward"), (ACCURACY_KEYS, "held-out accuracy"),
            (("eval/format_rate",), "held-out format rate"))


def compare(run_dirs: list[str], out: str) -> str:
    """One PNG of several runs' `COMPARED` series, a line per run, labelled by directory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {os.path.basename(os.path.abspath(d)): _metrics(d) for d in run_dirs}
    fig, axes = plt.subplots(1, len(COMPARED), figsize=(5 * len(COMPARED), 3.8))
    for ax, (keys, title) in zip(axes, COMPARED):
        for name, rows in runs.items():
            key = _first_present(rows, keys)
            if key:
                ax.plot(*_series(rows, key), marker="o", ms=3, label=name)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot(run_dir: str, out: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _metrics(run_dir)
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
    if len(args.run_dirs) > 1 and not args.out:
        print("locojax plot: several runs need --out FILE", file=sys.stderr)
        return 2
    try:
        print(plot(args.run_dirs[0], args.out) if len(args.run_dirs) == 1
              else compare(list(args.run_dirs), args.out))
    except FileNotFoundError as e:
        print(f"locojax plot: {e}", file=sys.stderr)
        return 2
    return 0
