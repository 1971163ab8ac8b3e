"""Run logs: reproducible metrics and wall-clock timings, as jsonl (and to a tracker).

Two files per run directory, because exact resume must reproduce the metrics log bitwise
while wall-clock timings can never be reproduced:
- `metrics.jsonl`: everything computed from data and params (rewards, losses, accuracy);
- `perf.jsonl`: every `perf/*` timing.
Both also go to the run's trackers (`trackers.py`: TensorBoard in `tb/`, W&B), with the same
names. Only process 0 writes.

On resume, `truncate_after(step)` repairs the log to the checkpoint's step: it drops lines a
killed run wrote after its last checkpoint, so the resumed log continues exactly where the
checkpoint left off. A run killed while appending leaves a partial last line: it is dropped
too (any other unreadable line is an error naming the file and line). Steps up to the
checkpoint's that have no line (a log cut short, e.g. restored from an older copy, or a
disk that filled) cannot be written again: they are named in a warning rather than left a
silent gap. The kept lines are written to a temporary file that replaces the log, so a kill
during the rewrite loses nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from locojax import trackers

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
PERF_FILE = "perf.jsonl"


def _clean(value):
    """JSON has no NaN/inf; write them as strings so the log stays valid and honest. A label
    (a string, e.g. `perf/timing`) is kept as it is."""
    if isinstance(value, str):
        return value
    value = float(value)
    return value if math.isfinite(value) else str(value)


class MetricsLogger:
    def __init__(self, run_dir: str, enabled: bool = True, tensorboard: bool = True,
                 report_to: str = "none", config: dict[str, Any] | None = None):
        """`report_to`: a tracker (`trackers.REPORT_TO`); `config`: what the tracker records
        as the run's config (W&B)."""
        self.run_dir = run_dir
        self.enabled = enabled
        self._trackers: list[trackers.Tracker] = []
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        self._trackers = trackers.make(report_to, run_dir, tensorboard, config)

    def truncate_after(self, step: int) -> None:
        """Drop every logged line with a step greater than `step` (resume from `step`), and
        warn naming the steps 1..step that `metrics.jsonl` has no line for."""
        if not self.enabled:
            return
        for name in (METRICS_FILE, PERF_FILE):
            path = os.path.join(self.run_dir, name)
            if not os.path.exists(path):
                if name == METRICS_FILE and step > 0:
                    log.warning("%s is missing: steps 1-%d, which the checkpoint holds, have "
                                "no metrics", path, step)
                continue
            keep = [line for line in _complete_lines(path) if json.loads(line)["step"] <= step]
            if name == METRICS_FILE:
                _warn_missing(path, {json.loads(line)["step"] for line in keep}, step)
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                f.writelines(keep)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        perf = {k: _clean(v) for k, v in sorted(metrics.items()) if k.startswith("perf/")}
        rest = {k: _clean(v) for k, v in sorted(metrics.items()) if not k.startswith("perf/")}
        for name, values in ((METRICS_FILE, rest), (PERF_FILE, perf)):
            if values:
                with open(os.path.join(self.run_dir, name), "a") as f:
                    f.write(json.dumps({"step": step, **values}) + "\n")
        scalars = {k: float(v) for k, v in metrics.items() if not isinstance(v, str)}
        for tracker in self._trackers:  # labels (strings) are not scalars
            tracker.log(step, scalars)

    def close(self) -> None:
        for tracker in self._trackers:
            tracker.close()
        self._trackers = []


def _warn_missing(path: str, logged: set[int], step: int) -> None:
    """Warn if any of steps 1..step (each step logs one line, labelled step + 1) is absent."""
    missing = sorted(set(range(1, step + 1)) - logged)
    if not missing:
        return
    spans, first = [], missing[0]
    for a, b in zip(missing, missing[1:] + [None]):
        if b != a + 1:
            spans.append(f"{first}" if first == a else f"{first}-{a}")
            first = b
    last = max((s for s in logged if s <= step), default=None)
    log.warning("%s has no line for step(s) %s, up to the checkpoint's step %d (its last line "
                "is step %s): those steps were trained, but their metrics are lost", path,
                ", ".join(spans), step, last)


def _complete_lines(path: str) -> list[str]:
    """The log's lines, each ending in a newline, less a partial last line (a kill while
    appending; one that parses lacks only its newline, and keeps its place); any other line
    that is not a JSON object with a step is a ValueError."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ok = isinstance(json.loads(line)["step"], int)
        except (ValueError, KeyError, TypeError):
            ok = False
        if ok:
            out.append(line if line.endswith("\n") else line + "\n")
        elif i != len(lines):
            raise ValueError(f"{path}:{i}: not a log line (a JSON object with a step): "
                             f"{line[:80]!r}")
    return out


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
