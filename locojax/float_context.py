"""What a process's floating-point results depend on beyond its programs and inputs.

Two runs of the same programs on the same inputs give the same bits only where this context
is the same: XLA:CPU picks its kernels by the CPU's model and vector ISA, and some of them
split a sum by the size of its intra-op thread pool, so one program can round differently
at another thread count (docs/design.md, "Mode equivalence"). That pool has
`max(DefaultThreadPoolSize(), local CPU devices)` threads, DefaultThreadPoolSize being
`PJRT_NPROC` or `NPROC` where set, else the CPUs the process may run on (XLA's
`GetPjRtCpuClient` and `pjrt/utils.cc`): a host that `locojax launch` pins to one core has
one thread, an unpinned one or a process holding two simulated devices has two on a 2-core
machine.

Every process that runs a run's programs writes its context once, as
`run_dir/float_context/<name>.json` (a trainer host, a rollout worker); the tests that
compare two runs bit for bit first check that every process of both had the same one
(`same_or_raise`), so a comparison whose precondition does not hold fails as such rather
than as a bit difference.
"""

from __future__ import annotations

import json
import os
import platform

DIR = "float_context"
"""The folder of a run dir holding one context per process."""

COMPARED = ("platform", "cpu", "isa", "intra_op_threads", "xla_flags", "jax", "jaxlib",
            "matmul_precision")
"""The fields two processes must share for their results to be comparable bit for bit (the
rest, usable cores and devices, say how the thread count came about)."""


def cpu_model() -> tuple[str, str]:
    """(model name with family/model numbers, the widest vector ISA) of the first processor."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n")[0]
    except OSError:
        return platform.processor() or platform.machine(), "unknown"
    fields = {k.strip(): v.strip() for k, v in
              (line.split(":", 1) for line in first.splitlines() if ":" in line)}
    flags = set(fields.get("flags", "").split())
    isa = next((n for n in ("avx512f", "avx2", "avx", "sse4_2") if n in flags), "no avx/sse4_2")
    name = fields.get("model name", platform.machine())
    return (f"{name} (family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')})", isa)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def intra_op_threads(local_devices: int) -> int:
    """XLA:CPU's intra-op pool size in this process, by XLA's own rule (module docstring)."""
    for name in ("PJRT_NPROC", "NPROC"):
        raw = os.environ.get(name, "")
        if raw.strip().lstrip("-").isdigit():
            return max(max(0, int(raw)), local_devices)
    return max(usable_cores(), local_devices)


def context() -> dict:
    """This process's context (the backend must be up: it counts the local devices)."""
    import jax
    import jaxlib

    devices = jax.local_device_count()
    cpu, isa = cpu_model()
    return {"platform": jax.default_backend(), "cpu": cpu, "isa": isa,
            "usable_cores": usable_cores(), "local_devices": devices,
            "intra_op_threads": (intra_op_threads(devices) if jax.default_backend() == "cpu"
                                 else None),
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "matmul_precision": str(jax.config.jax_default_matmul_precision)}


def record(run_dir: str, name: str) -> None:
    """Write this process's context as run_dir/float_context/<name>.json."""
    folder = os.path.join(run_dir, DIR)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{name}.json"), "w") as f:
        json.dump(context(), f, indent=1, sort_keys=True)


def read(run_dir: str) -> dict[str, dict]:
    """Every process's context of a run, by name ({} when none was written)."""
    folder = os.path.join(run_dir, DIR)
    if not os.path.isdir(folder):
        return {}
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            out[f"{os.path.basename(run_dir)}/{name[:-5]}"] = json.load(f)
    return out


class ContextMismatch(AssertionError):
    """Two processes' results are not comparable bit for bit: their contexts differ."""


def same_or_raise(*run_dirs: str) -> dict:
    """The one context every process of `run_dirs` ran under; raises ContextMismatch naming
    the processes and fields that differ, or when a run recorded none."""
    every = {}
    for d in run_dirs:
        found = read(d)
        if not found:
            raise ContextMismatch(f"{d} recorded no float context ({DIR}/): cannot tell "
                                  "whether a bitwise comparison with it is meaningful")
        every.update(found)
    first_name, first = next(iter(every.items()))
    for name, ctx in every.items():
        differ = {k: (first.get(k), ctx.get(k)) for k in COMPARED if first.get(k) != ctx.get(k)}
        if differ:
            detail = "; ".join(f"{k}: {a!r} in {first_name}, {b!r} in {name}"
                               for k, (a, b) in differ.items())
            raise ContextMismatch(
                f"{first_name} and {name} ran under different float contexts, so their bits "
                f"need not agree: {detail} (usable cores {first['usable_cores']} and "
                f"{ctx['usable_cores']}, local devices {first['local_devices']} and "
                f"{ctx['local_devices']})")
    return {k: first[k] for k in COMPARED}
