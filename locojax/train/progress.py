"""A live progress bar with the headline numbers (reward, held-out accuracy, step time)."""

from __future__ import annotations

import rich.progress
from rich.console import Console


class Progress:
    def __init__(self, total: int, start: int, enabled: bool = True):
        self.enabled = enabled
        self.console = Console(stderr=False)
        self._bar = rich.progress.Progress(
            rich.progress.TextColumn("[bold]step {task.completed}/{task.total}"),
            rich.progress.BarColumn(),
            rich.progress.TextColumn("{task.fields[info]}"),
            rich.progress.TimeElapsedColumn(),
            console=self.console, disable=not enabled, transient=False,
        )
        self._task = self._bar.add_task("train", total=total, completed=start, info="")
        self._acc = None

    def __enter__(self):
        self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self._bar.__exit__(*exc)

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def update(self, step: int, m: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._acc = m.get("eval/accuracy", self._acc)
        acc = "" if self._acc is None else f"  held-out acc {self._acc:.3f}"
        info = (f"reward {m.get('reward/mean', float('nan')):.3f}{acc}  "
                f"{m.get('perf/step_time', 0):.2f}s/step")
        self._bar.update(self._task, completed=step, info=info)
