"""What the benchmark smoke tests share: a script run as a user starts it, and the rows of
the markdown tables it prints (test_benchmarks_smoke.py, test_benchmarks_smoke_real.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(name: str, *args: str, timeout: float = 300) -> str:
    """Run a benchmark script from the repository root, `name` its path under benchmarks/
    ("tpu/lora_runs"); its stdout (stderr on failure)."""
    module = "benchmarks." + name.replace("/", ".")
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, f"{name} exit {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout


def table_rows(out: str, first_cell: str) -> list[list[str]]:
    """The cells of the markdown rows whose first cell is `first_cell`."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in out.splitlines()
            if line.startswith("|") and line.strip("| ").split(" |")[0] == first_cell]
