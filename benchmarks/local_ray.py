"""The benchmarks' local Ray cluster, with its actors at the driver's CPU priority."""

from __future__ import annotations

import os


def start() -> str:
    """Start a local Ray cluster over every core and return its address (for the runs'
    `--ray-address`). Ray starts its workers `nice`d by 15 (its `worker_niceness`), so a
    benchmark's actors lose the CPU to any other process on the machine, a test run or an
    editor, and the table measures that load instead of the code; 0 keeps them at the
    priority the benchmark was started with."""
    import ray

    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ["RAY_DEDUP_LOGS"] = "0"
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING")
    return ray.get_runtime_context().gcs_address
