"""Experiment trackers: where a run's metrics go besides `metrics.jsonl` and `perf.jsonl`.

`--report-to` names one (`REPORT_TO`), as TRL's `report_to` does:
- `tensorboard`: TensorBoard event files in run_dir/tb, by tensorboardX (a dependency; it
  writes the event files itself, without TensorFlow or the tensorboard package). The same
  files `--tensorboard` (on by default) writes: either one turns them on.
- `wandb`: Weights & Biases, under run_dir/wandb. Offline unless the environment says
  otherwise: `WANDB_MODE` defaults to `offline` here, so a run never reaches the network on
  its own (`wandb sync run_dir/wandb/offline-run-*` uploads it later; `WANDB_MODE=online`
  logs live). Needs the `wandb` extra (`pip install locojax[wandb]`); without it the run
  refuses to start, saying so. The run's id is derived from the run directory, so a resumed
  run appends to the same W&B run.
- `none`: no tracker.

Every tracker gets the same metric names as `metrics.jsonl` (`actor/pg_loss`,
`reward/mean`, ...) and the `perf/*` timings, each at its step; labels (strings) are not
scalars and are left out. Only process 0 reports (`MetricsLogger`).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Protocol

REPORT_TO = ("none", "tensorboard", "wandb")
"""The values of `--report-to`."""


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    """TensorBoard scalars in `directory` (tensorboardX's event-file writer)."""

    def __init__(self, directory: str):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(directory)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def check(report_to: str) -> None:
    """Refuse, before any work, a tracker this install cannot start (ValueError)."""
    if report_to not in REPORT_TO:
        raise ValueError(f"--report-to must be one of {', '.join(REPORT_TO)}, got "
                         f"{report_to!r}")
    if report_to == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ValueError("--report-to wandb needs the wandb package: pip install "
                             "'locojax[wandb]' (or --report-to tensorboard, which needs "
                             "nothing more)") from None


class WandB:
    """One W&B run per run directory (offline unless `WANDB_MODE` says otherwise)."""

    def __init__(self, run_dir: str, config: dict[str, Any] | None = None):
        check("wandb")
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")  # never the network unless asked
        os.environ.setdefault("WANDB_SILENT", "true")
        run_dir = os.path.abspath(run_dir)
        os.makedirs(run_dir, exist_ok=True)
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "locojax"), dir=run_dir,
            name=os.path.basename(run_dir), id=run_id(run_dir), resume="allow",
            config=config or {})

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


def run_id(run_dir: str) -> str:
    """A W&B run id for `run_dir`: the same on every start (resume appends to it)."""
    return "locojax-" + hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:12]


def make(report_to: str, run_dir: str, tensorboard: bool = False,
         config: dict[str, Any] | None = None) -> list[Tracker]:
    """The trackers of a run: `report_to`'s, and TensorBoard if `tensorboard` (once)."""
    check(report_to)
    out: list[Tracker] = []
    if tensorboard or report_to == "tensorboard":
        out.append(TensorBoard(os.path.join(run_dir, "tb")))
    if report_to == "wandb":
        out.append(WandB(run_dir, config))
    return out
