"""What the benchmark smoke tests share: a script run as a user starts it, and the rows of
the markdown tables it prints (test_benchmarks_smoke.py, test_benchmarks_smoke_real.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


XLA_DEFAULTS = {"XLA_FLAGS": ""}
"""A script's environment for XLA's own code generation, not the suite's cheaper one
(tests/conftest.py, the Makefile): for the real SmolLM2's runs, bound by running rather
than compiling. bench_real_trl's 3-step smoke took 144 s with the suite's flags and 74 s
with XLA's (a decode token step 0.48 s against 0.08 s), 2-core Zen 4."""


def bench(name: str, *args: str, timeout: float = 300, env: dict | None = None) -> str:
    """Run a benchmark script from the repository root, `name` its path under benchmarks/
    ("tpu/lora_runs"), with `env` over this process's environment; its stdout (stderr on
    failure)."""
    module = "benchmarks." + name.replace("/", ".")
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    assert proc.returncode == 0, f"{name} exit {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout


def table_rows(out: str, first_cell: str) -> list[list[str]]:
    """The cells of the markdown rows whose first cell is `first_cell`."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in out.splitlines()
            if line.startswith("|") and line.strip("| ").split(" |")[0] == first_cell]
