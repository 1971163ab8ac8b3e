"""A compiled program's kernels, read from its HLO and from a profiler's trace of its calls.

What kernel_profile.py and kernel_rates.py share, in one leaf: the programs (the GRPO
update and the engine's generate, `locojax/predict/calibration_step.py`) with their kernels
listed from the compiled HLO (`benchmarks/hlo_kernels.py`), and `trace_events`, their
kernels' times in a `jax.profiler` trace (kernel_profile.py's docstring says how they are
joined).
"""

from __future__ import annotations

import collections
import tempfile
import time
from pathlib import Path

CONTROL = ("while", "conditional", "call")  # a thunk whose event holds its body's kernels


def _union(spans: list[tuple[int, int]]) -> int:
    """Nanoseconds covered by the (start, end) spans: a kernel's time while active, however
    many threads its tasks ran on."""
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


# The threads XLA:CPU runs a program's kernels on: its intra-op pool's, and the client's
# thread that starts the program, which runs the kernels itself while no other is ready (a
# small program under load can run whole there, and its kernels then showed no time).
KERNEL_THREADS = ("XLAEigen", "XLAPjRtCpuClient")
NOT_KERNELS = ("ThunkExecutor", "ThreadpoolListener", "Slinky", *CONTROL)


def kernel_spans(planes) -> dict[str, list[tuple[int, int]]]:
    """{kernel name: its events' (start, end) ns} from a trace's planes: the events on the
    threads that run kernels (`KERNEL_THREADS`), less the executor's own events."""
    spans: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for plane in planes:
        for line in plane.lines:
            if any(thread in line.name for thread in KERNEL_THREADS):
                for ev in line.events:
                    if not ev.name.startswith(NOT_KERNELS):
                        spans[ev.name].append((ev.start_ns, ev.end_ns))
    return spans


def trace_events(fn, calls: int) -> tuple[dict[str, float], dict[str, float],
                                          dict[str, float], float]:
    """Per call of `fn`, `calls` of them traced with `jax.profiler`: ({kernel name: seconds
    of its events on every thread}, {name: seconds while it was active}, {name: events},
    wall seconds). A loop's or a call's own event is left out (it spans its body's kernels,
    which are counted)."""
    import jax

    with tempfile.TemporaryDirectory(prefix="kernel_profile_") as work:
        with jax.profiler.trace(work):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            wall = (time.perf_counter() - t0) / calls
        data = jax.profiler.ProfileData.from_file(str(sorted(Path(work).rglob("*.xplane.pb"))[-1]))
    spans = kernel_spans(data.planes)
    core = {k: sum(e - b for b, e in v) / 1e9 / calls for k, v in spans.items()}
    active = {k: _union(v) / 1e9 / calls for k, v in spans.items()}
    return core, active, {k: len(v) / calls for k, v in spans.items()}, wall


def model_config(name: str):
    """A preset's decoder (tiny, small) or an HF checkpoint directory's."""
    from locojax.model import config, hf_config

    if name in config.PRESETS:
        return config.PRESETS[name]()
    return hf_config.load_config(name)


def train_program(cfg, b: int, g: int, p: int, n: int):
    """(one update, its kernels)."""
    from benchmarks.hlo_kernels import kernels
    from benchmarks.kernel_programs import compiled_update
    from locojax.predict import calibration_step

    compiled = compiled_update(cfg, b, g, p, n)
    return calibration_step.update(cfg, b, g, p, n), kernels(compiled.as_text()).kernels


def generate_program(cfg, b: int, g: int, p: int, n: int):
    """(one generate of b x g rows of n tokens, its kernels: `kernel_programs.generate`)."""
    from benchmarks import kernel_programs

    return kernel_programs.generate(cfg, b, g, p, n)


def profiled(build, cfg, shape, calls: int) -> tuple[list, tuple]:
    """(the program's kernels, `trace_events` of `calls` calls after a compiling call and one
    more warm-up) of the program `build` (`train_program`, `generate_program`) makes."""
    fn, listed = build(cfg, *shape)
    for _ in range(2):
        fn()
    return listed, trace_events(fn, calls)
