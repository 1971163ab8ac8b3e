"""Run logs: reproducible metrics and wall-clock timings, as jsonl and TensorBoard.

Two files per run directory, because exact resume must reproduce the metrics log bitwise
while wall-clock timings can never be reproduced:
- `metrics.jsonl`: everything computed from data and params (rewards, losses, accuracy);
- `perf.jsonl`: every `perf/*` timing.
Both also go to TensorBoard (`tb/`). Only process 0 writes.

On resume, `truncate_after(step)` drops lines a killed run wrote after its last checkpoint,
so the resumed log continues exactly where the checkpoint left off.
"""

from __future__ import annotations

import json
import math
import os

METRICS_FILE = "metrics.jsonl"
PERF_FILE = "perf.jsonl"


def _clean(value):
    """JSON has no NaN/inf; write them as strings so the log stays valid and honest."""
    value = float(value)
    return value if math.isfinite(value) else str(value)


class MetricsLogger:
    def __init__(self, run_dir: str, enabled: bool = True, tensorboard: bool = True):
        self.run_dir = run_dir
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(run_dir, "tb"))

    def truncate_after(self, step: int) -> None:
        """Drop every logged line with a step greater than `step` (resume from `step`)."""
        if not self.enabled:
            return
        for name in (METRICS_FILE, PERF_FILE):
            path = os.path.join(self.run_dir, name)
            if not os.path.exists(path):
                continue
            with open(path) as f:
                keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
            with open(path, "w") as f:
                f.writelines(keep)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        perf = {k: _clean(v) for k, v in sorted(metrics.items()) if k.startswith("perf/")}
        rest = {k: _clean(v) for k, v in sorted(metrics.items()) if not k.startswith("perf/")}
        for name, values in ((METRICS_FILE, rest), (PERF_FILE, perf)):
            if values:
                with open(os.path.join(self.run_dir, name), "a") as f:
                    f.write(json.dumps({"step": step, **values}) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
