"""Per-step phase timing with device-synchronised boundaries, and compile time kept apart.

    timer = StepTimer()
    with timer.phase("decode") as ph:
        rollout = engine.decode(...)
        ph.sync(rollout)          # block_until_ready at the boundary, so device work is counted
    ...
    metrics = timer.finish_step()  # {"perf/phase/decode": s, ..., "perf/compile_time": s, ...}

Compile time is measured from JAX's own monitoring events (trace, lowering and backend
compile durations) and subtracted from the phase it happened in, so the first step's phases
show steady-state cost and `perf/compile_time` shows the rest. (DESIGN.md, "timing is honest".)
"""

from __future__ import annotations

import contextlib
import threading
import time

import jax

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)

# Which phases are host work (Python, tokenisation, rewards) rather than device work.
HOST_PHASES = ("admission", "detokenize_reward", "batch", "env")


class _CompileClock:
    """Process-wide running total of compile seconds, fed by jax.monitoring."""

    def __init__(self):
        self.total = 0.0
        self._lock = threading.Lock()
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **_):
        if event in _COMPILE_EVENTS:
            with self._lock:
                self.total += duration


_compile_clock: _CompileClock | None = None


def compile_seconds() -> float:
    """Seconds spent compiling in this process since the first call of this function."""
    global _compile_clock
    if _compile_clock is None:
        _compile_clock = _CompileClock()
    return _compile_clock.total


class _Phase:
    def __init__(self):
        self._pending = []

    def sync(self, *trees):
        """Register device outputs to wait for at the end of the phase."""
        self._pending.extend(trees)


class StepTimer:
    """Accumulates phase durations for one step; `finish_step` returns and resets them."""

    def __init__(self):
        compile_seconds()  # start listening before the first compile
        self._phases: dict[str, float] = {}
        self._compile = 0.0
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        ph = _Phase()
        compile_before = compile_seconds()
        start = time.perf_counter()
        try:
            yield ph
        finally:
            if ph._pending:
                jax.block_until_ready(ph._pending)
            elapsed = time.perf_counter() - start
            compiled = compile_seconds() - compile_before
            self._compile += compiled
            self._phases[name] = self._phases.get(name, 0.0) + max(0.0, elapsed - compiled)

    def finish_step(self) -> dict[str, float]:
        wall = time.perf_counter() - self._start
        step_time = max(0.0, wall - self._compile)
        host = sum(v for k, v in self._phases.items() if k in HOST_PHASES)
        out = {f"perf/phase/{k}": v for k, v in self._phases.items()}
        out.update({
            "perf/step_time": step_time,
            "perf/compile_time": self._compile,
            "perf/host_fraction": host / step_time if step_time > 0 else 0.0,
        })
        self._phases, self._compile, self._start = {}, 0.0, time.perf_counter()
        return out


class TraceWindow:
    """Write a jax.profiler trace for steps [start, start + num) to `directory`, if given."""

    def __init__(self, directory: str | None, start: int = 2, num: int = 3):
        self.directory, self.start, self.stop = directory, start, start + num
        self._active = False

    def before_step(self, step: int) -> None:
        if self.directory and step == self.start and not self._active:
            jax.profiler.start_trace(self.directory)
            self._active = True

    def after_step(self, step: int) -> None:
        if self._active and step + 1 >= self.stop:
            jax.profiler.stop_trace()
            self._active = False

    def close(self) -> None:
        if self._active:
            jax.profiler.stop_trace()
            self._active = False
