"""`make_task(name, **kw)`: the one entry point from a config string to a Task.

| name | kind | needs |
|---|---|---|
| arith | single-turn, procedural | nothing (`level`, `seed`, `train_size`, `test_size`) |
| calc | multi-turn tool use, procedural | nothing (`level`, `seed`, ...) |
| gsm8k | single-turn | `train_path`, `test_path` (HF jsonl/parquet) |
| math | single-turn, boxed answers | `train_path`, `test_path` |
| swe | multi-turn bug fixing in the sandbox | nothing (`level`, ...) or `train_dir`, `test_dir` |

Task modules are imported on demand so that, e.g., math-verify (and sympy) load only for math.
"""

from __future__ import annotations

import importlib
import inspect

from locojax.envs.base import Task

TASKS = {
    "arith": "locojax.envs.tasks.arith",
    "calc": "locojax.envs.tasks.calc",
    "gsm8k": "locojax.envs.gsm8k",
    "math": "locojax.envs.math_boxed",
    "swe": "locojax.envs.swe.workload",
}


def task_names() -> list[str]:
    return sorted(TASKS)


def make_task(name: str, **kwargs) -> Task:
    """Build a registered task; unknown names and unknown options are errors that list the
    valid choices."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(task_names())}")
    build = importlib.import_module(TASKS[name]).task
    params = inspect.signature(build).parameters
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise TypeError(f"task {name!r} got unknown option(s) {unknown}; "
                        f"valid options: {', '.join(params)}")
    missing = [p for p, v in params.items()
               if v.default is inspect.Parameter.empty and p not in kwargs]
    if missing:
        raise TypeError(f"task {name!r} needs {', '.join(missing)}")
    return build(**kwargs)
