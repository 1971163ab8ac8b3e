"""Per-step phase timing with device-synchronised boundaries, and compile time kept apart.

    timer = StepTimer()
    with timer.phase("decode") as ph:
        rollout = engine.decode(...)
        ph.sync(rollout)          # block_until_ready at the boundary, so device work is counted
    ...
    metrics = timer.finish_step()  # {"perf/phase/decode": s, ..., "perf/compile_time": s, ...}

Compile time is measured from JAX's own monitoring events (trace, lowering and backend
compile durations) and subtracted from the phase it happened in, so the first step's phases
show steady-state cost and `perf/compile_time` shows the rest. (docs/design.md, "timing is honest".)

Timing mode (`TIMING`, logged with every step): each phase ends with `block_until_ready` of
what it dispatched, so a phase holds its device work; the step is the sum of its phases and
`perf/other`, the time between them (Python, logging).

Host work behind device work: device work dispatched without waiting for it (JAX's async
dispatch; e.g. the reference forward dispatched before the rows are scored,
`train/early.py`) is registered with `StepTimer.device_busy`, which watches it from a thread
of its own: busy from the dispatch until its `block_until_ready` returns. The host phases'
seconds that fall inside such a busy interval are `perf/host_hidden` (the chip was not
waiting for them); the rest of the host phases' seconds are `perf/host_exposed` (the chip
idle, or not yet given the work that needs them). Their sum is the host phases' time.

The step split the paper's way (`shares`), each a share of `perf/step_time`:
- `perf/host_share`: host orchestration, the CPU work of the data path: admission and
  tokenisation, detokenisation and scoring, batch assembly, environment steps and the
  metrics all-gather (`HOST_PHASES`); in the controller mode, the controller's own (its
  admission, dispatch, scoring, batch and scatter), which its hosts wait through.
- `perf/network_share`: moving data between hosts where it can be timed apart: the
  gradient all-reduce (`train_collective`, with `--profile-split`) and the weight sync of
  the Ray modes. The controller's dispatch and gather travel inside its round trips and
  are counted in bytes (`perf/controller/bytes_*`), not seconds.
- `perf/wait_share`: a host idle for other hosts: the straggler wait before the all-reduce
  (`train_wait`, with `--profile-split`) and a learner's wait for rollouts (DA, async).

Network bytes per step (`perf/net/<what>_bytes`), counted, not timed:
- `allreduce_bytes` (every mode): what one device sends, and receives, for the step's
  gradient all-reduce in a ring: 2(D − 1)/D × 4 B × the parameter count, once per optimizer
  update (`allreduce_bytes`); D: devices in the train mesh, over every host (0 when D = 1;
  in `single` the D devices are in one process, so those bytes move in memory). The
  gradient is f32 (master weights). Not counted: the loss and the metric sums packed into the
  same flat buffer (a few dozen floats), and the metrics all-gather (`metrics` phase).
- `dispatch_bytes`, `gather_bytes`, `scatter_bytes` (controller): the payload the controller
  sends the hosts (prompt tokens and masks, row limits), gets back (tokens, masks, logprobs)
  and scatters (the training batch's shards), summed over hosts (`controller.Traffic`).
- `weight_sync_push_bytes` (DA, async): the params learner host 0 pushes to the parameter
  server for each new version; `weight_sync_pull_bytes`: the params the step's rollout
  workers pulled from it, summed over the step's leases (a worker holding the leased
  version pulls nothing).
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

HOST_PHASES = ("admission", "detokenize_reward", "batch", "env", "metrics")
"""Host work of the data path (Python, tokenisation, rewards) rather than device work."""
CONTROLLER_HOST_PHASES = ("admission", "prefill", "detokenize_reward", "env", "batch",
                          "scatter")
"""The controller's host work (`prefill` is its dispatch of the rows to the hosts, `env` the
multi-turn environment steps and sandboxed tests it runs for every row)."""
NETWORK_PHASES = ("train_collective", "weight_sync")
WAIT_PHASES = ("train_wait", "wait_rollouts")
TIMING = "phase-synchronised"
"""`perf/timing`: every phase ends with block_until_ready; compile time apart."""


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


def overlap_seconds(spans, busy) -> float:
    """Seconds of the `spans` ([start, end] pairs) that fall inside the union of the `busy`
    intervals: the host time hidden behind device work."""
    merged: list[list[float]] = []
    for a, b in sorted(busy):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans for a, b in merged)


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
        self._host_spans: list[tuple[float, float]] = []  # HOST_PHASES' [start, end]
        self._busy: list[tuple[float, float]] = []  # device work in flight: [dispatch, ready]
        self._watchers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def device_busy(self, tree) -> None:
        """Device work just dispatched (its outputs, `tree`) that the host does not wait
        for now: busy from now until a watcher thread's `block_until_ready(tree)` returns
        (see the module docstring)."""
        begun = time.perf_counter()

        def watch():
            jax.block_until_ready(tree)
            with self._lock:
                self._busy.append((begun, time.perf_counter()))

        watcher = threading.Thread(target=watch, daemon=True, name="device-busy")
        watcher.start()
        self._watchers.append(watcher)

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
            if name in HOST_PHASES:
                self._host_spans.append((start, start + elapsed))

    def finish_step(self) -> dict[str, float]:
        wall = time.perf_counter() - self._start
        for watcher in self._watchers:  # done by now: the step waited for every output
            watcher.join()
        step_time = max(0.0, wall - self._compile)
        out = {f"perf/phase/{k}": v for k, v in self._phases.items()}
        host = sum(self._phases.get(k, 0.0) for k in HOST_PHASES)
        hidden = min(host, overlap_seconds(self._host_spans, self._busy))
        out.update({
            "perf/step_time": step_time,
            "perf/compile_time": self._compile,
            "perf/other": max(0.0, step_time - sum(self._phases.values())),
            "perf/host_hidden": hidden,
            "perf/host_exposed": host - hidden,
        })
        self._phases, self._compile, self._start = {}, 0.0, time.perf_counter()
        self._host_spans, self._busy, self._watchers = [], [], []
        return out


def shares(perf: dict[str, float]) -> dict[str, float]:
    """The host, network and wait shares of a step's `perf` (see the module docstring)."""
    step = perf.get("perf/step_time", 0.0)

    def total(prefix: str, names) -> float:
        return sum(perf.get(f"{prefix}{k}", 0.0) for k in names)

    host = total("perf/phase/", HOST_PHASES) + total("perf/controller/phase/",
                                                     CONTROLLER_HOST_PHASES)
    network = total("perf/phase/", NETWORK_PHASES)
    wait = total("perf/phase/", WAIT_PHASES)
    return {f"perf/{name}_share": x / step if step > 0 else 0.0
            for name, x in (("host", host), ("network", network), ("wait", wait))}


def device_memory() -> dict[str, float]:
    """`perf/device_peak_gb` and `perf/device_in_use_gb`: the most any of this host's devices
    has held since the process started, and holds now, as its backend reports them
    (`memory_stats()`, GB = 10^9 bytes; the memory plan's peak is the figure to set beside
    it). Empty where the backend reports none (XLA:CPU)."""
    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    if not all("peak_bytes_in_use" in s for s in stats):
        return {}
    return {"perf/device_peak_gb": max(s["peak_bytes_in_use"] for s in stats) / 1e9,
            "perf/device_in_use_gb": max(s.get("bytes_in_use", 0) for s in stats) / 1e9}


def allreduce_bytes(param_count: int, devices: int, updates: int) -> dict[str, float]:
    """`perf/net/allreduce_bytes` of a step (see the module docstring): a ring all-reduce of
    the f32 gradient over `devices` devices, `updates` times."""
    ring = 2 * (devices - 1) / devices
    return {"perf/net/allreduce_bytes": updates * ring * 4.0 * param_count}


def spread(hosts: list[dict[str, float]]) -> dict[str, float]:
    """Every host's step time and phases, as the critical path (max over hosts) and the
    spread (max - min); `hosts` are the hosts' `finish_step` dicts, host 0 first. Nothing
    for one host."""
    out = {}
    if len(hosts) < 2:
        return out
    for k in hosts[0]:
        if k.startswith("perf/phase/") or k in ("perf/step_time", "perf/other"):
            values = [h.get(k, 0.0) for h in hosts]
            name = k[len("perf/"):]
            out[f"perf/hosts/{name}/max"] = max(values)
            out[f"perf/hosts/{name}/spread"] = max(values) - min(values)
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
