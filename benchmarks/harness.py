"""What every benchmark repeats: the machine and load header, interleaved runs of the programs
it compares, the roofline (this machine's matmul peak and read bandwidth, and a measured
time's share of it), ratios and the A/A spread, markdown tables, runs of `locojax train` in
a subprocess with their steady steps, and the local Ray cluster.

A benchmark figure carries its command, machine and load (docs/design.md, STYLE 14): every
script prints `header()` first and the load again at its end. Compared programs run
interleaved (`interleave`, `order`), so drift in the machine's load falls on all of them
alike; a ratio of two arms is read against the A/A spread, how far one arm's own runs lie
apart (`aa_spread`, `verdict`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLI = [PY, "-m", "locojax.cli"]
"""`locojax` as a benchmark starts it: this interpreter, the package on its path."""
NAN = float("nan")

# --- the machine and its load ----------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def loads() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def versions(packages: Sequence[str] = ("jax", "jaxlib")) -> str:
    """Python's version and the installed packages' (read from their metadata: nothing is
    imported, so a driver that never imports jax does not start to)."""
    out = [f"python {platform.python_version()}"]
    for name in packages:
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name} not installed")
    return ", ".join(out)


def header(name: str, extra: str = "") -> str:
    """One line saying where a benchmark ran: the machine, its cores, the versions, the XLA
    flags and the load at the start."""
    return (f"# {name}: {cpu_model()}, {os.cpu_count()} CPU cores; {versions()}"
            + (f"; {extra}" if extra else "")
            + f"; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; load average at start {loads()}")


def command_line() -> str:
    """The command that is running, as a user would type it again."""
    return "command: " + shlex.join([Path(sys.executable).name, *sys.argv])


# --- timing and interleaving -----------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of one call (synchronising is the caller's: `fn` blocks until ready)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_time(fn: Callable[[], object], runs: int, warm: int = 2) -> float:
    """Median wall seconds of `runs` calls after `warm` untimed ones."""
    for _ in range(warm):
        fn()
    return statistics.median(timed(fn) for _ in range(runs))


def rotated(seq: Sequence[T], k: int) -> list[T]:
    """`seq` starting k places later, wrapping around."""
    if not seq:
        return []
    k %= len(seq)
    return [*seq[k:], *seq[:k]]


def order(seq: Sequence[T], r: int, how: str = "fixed") -> list[T]:
    """The arms' order in round r: 'fixed' (as given), 'rotate' (r places later) or
    'alternate' (reversed in odd rounds)."""
    if how == "rotate":
        return rotated(seq, r)
    if how == "alternate":
        return list(seq if r % 2 == 0 else seq[::-1])
    if how != "fixed":
        raise ValueError(f"unknown order {how!r}")
    return list(seq)


def interleave(arms: dict[K, Callable[[], T]], rounds: int, how: str = "fixed",
               limits: dict[K, int] | None = None,
               after_round: Callable[[int, dict[K, list[T]]], None] | None = None,
               ) -> dict[K, list[T]]:
    """Call every arm once per round, in `order(arms, round, how)`, for `rounds` rounds; an
    arm with a limit stops after that many calls. Returns each arm's results in call order;
    `after_round(r, results)` sees them grow (to print a cut-short run's progress)."""
    out: dict[K, list[T]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in order(list(arms), r, how):
            if limits is None or r < limits.get(name, rounds):
                out[name].append(arms[name]())
        if after_round is not None:
            after_round(r, out)
    return out


# --- the roofline ----------------------------------------------------------------------------


SPEC_OF_DEVICE_KIND = {"TPU v5 lite": "tpu-v5e"}
"""jax's `device_kind` of an accelerator -> its profile in locojax/predict/hardware/, whose
published peak and HBM bandwidth are the roofline there (only kinds seen here: a v5e chip
reports "TPU v5 lite")."""
LOOP = 8
"""Passes of the accelerator probes inside one program: one launch for all of them."""


def _accelerator() -> bool:
    import jax

    return jax.default_backend() != "cpu"


def read_bandwidth(runs: int = 5, n: int = 2 ** 27) -> float:
    """Bytes/s a memory-bound program can move here, the best of `runs`. On the CPU a
    jitted `jnp.sum` over n f32 values (default 512 MiB, past every cache). On an
    accelerator, where one small program is mostly its launch, LOOP passes of a scale over
    them inside one program, each reading and writing the array (2 x 4n bytes a pass)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones(n, jnp.float32)
    if not _accelerator():
        f = jax.jit(jnp.sum)
        f(x).block_until_ready()
        return x.nbytes / min(timed(lambda: f(x).block_until_ready()) for _ in range(runs))
    f = jax.jit(lambda x: jax.lax.fori_loop(0, LOOP, lambda i, y: y * 1.0000001, x))
    f(x).block_until_ready()
    return 2 * LOOP * x.nbytes / min(timed(lambda: f(x).block_until_ready())
                                     for _ in range(runs))


def matmul_peak(n: int = 2048, runs: int = 5) -> float:
    """FLOP/s a compute-bound program can reach here (median of `runs`). On the CPU a jitted
    [n, n] @ [n, n] f32 `jnp.dot`. On an accelerator bf16 products at 4n (8192 by
    default), LOOP of them chained in one program (each multiplies the last result by b,
    scaled by 1/sqrt(4n) so the values stay finite), so that neither the launch nor f32's
    emulation on the matrix unit is what is timed."""
    import jax
    import jax.numpy as jnp

    if not _accelerator():
        a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
        b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
        f = jax.jit(jnp.dot)
        return 2 * n ** 3 / median_time(lambda: f(a, b).block_until_ready(), runs, warm=1)
    m = 4 * n
    a = jax.random.normal(jax.random.key(0), (m, m), jnp.bfloat16)
    b = (jax.random.normal(jax.random.key(1), (m, m)) / m ** 0.5).astype(jnp.bfloat16)
    f = jax.jit(lambda a: jax.lax.fori_loop(0, LOOP, lambda i, x: jnp.dot(x, b), a))
    return LOOP * 2 * m ** 3 / median_time(lambda: f(a).block_until_ready(), runs, warm=1)


def spec() -> tuple[float, float, str] | None:
    """(bf16 peak FLOP/s, HBM bytes/s, origin) published for this accelerator's kind, or
    None (the CPU, or a kind without a profile in SPEC_OF_DEVICE_KIND)."""
    import jax

    kind = jax.devices()[0].device_kind
    if not _accelerator() or kind not in SPEC_OF_DEVICE_KIND:
        return None
    from locojax.predict import hardware

    chip = hardware.load(SPEC_OF_DEVICE_KIND[kind])
    return (chip.peak_flops["bfloat16"].value, chip.hbm_bandwidth.value,
            f"{kind}: published bf16 peak and HBM bandwidth ({chip.name} profile)")


def rates(before: tuple[float, float, str] | None = None) -> tuple[float, float, str]:
    """(matmul peak FLOP/s, bandwidth bytes/s, where they come from) that every benchmark's
    roofline share reads: an accelerator of a known kind at its published figures (bf16
    peak, HBM bandwidth; the probes above say how close a program gets), elsewhere what the
    probes measure, the better of these and `before` (probes taken before the runs)."""
    import jax

    published = spec()
    if published is not None:
        return published
    kind = jax.devices()[0].device_kind
    peak, bandwidth = matmul_peak(), read_bandwidth()
    if before is None:
        return peak, bandwidth, f"{kind}: measured by the harness probes"
    return (max(peak, before[0]), max(bandwidth, before[1]),
            f"{kind}: measured by the harness probes, the better of before and after")


def roofline_seconds(flops: float, nbytes: float, peak: float, bandwidth: float) -> float:
    """The least time work of `flops` FLOPs reading `nbytes` bytes can take here: at the
    matmul peak or at the read bandwidth, whichever bounds it."""
    return max(flops / peak, nbytes / bandwidth)


def roofline_share(seconds: float, flops: float, nbytes: float, peak: float,
                   bandwidth: float) -> float:
    """The roofline's time as a share of the measured `seconds` (1.0: at the roofline);
    NaN where anything is unknown or zero."""
    if min(seconds, peak, bandwidth) <= 0 or any(x != x for x in (seconds, flops, nbytes)):
        return NAN
    return roofline_seconds(flops, nbytes, peak, bandwidth) / seconds


# --- comparing -------------------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    """The median, NaN for no values."""
    return statistics.median(xs) if len(xs) else NAN


def med(rows: Sequence[dict], key: str) -> float:
    """Median of `key` over the rows that have it; NaN if none does."""
    return median([float(r[key]) for r in rows if key in r])


def ratio(num: float, den: float) -> float:
    """num / den, NaN where either is unknown or den is 0."""
    if num != num or den != den or den == 0:
        return NAN
    return num / den


def aa_spread(run_medians: Sequence[float]) -> float:
    """max / min - 1 of one arm's per-run medians (its noise against itself); NaN with fewer
    than two runs."""
    xs = [x for x in run_medians if x == x and x > 0]
    return max(xs) / min(xs) - 1 if len(xs) >= 2 else NAN


def verdict(ratio: float, spread: float) -> str:
    """'tie' when `ratio` (a step-time ratio, > 1: the second arm is faster) lies within
    [1 / (1 + spread), 1 + spread]; else 'faster' or 'slower' (for the second arm);
    '?' when either is unknown."""
    if ratio != ratio or spread != spread:
        return "?"
    if abs(math.log(ratio)) <= math.log1p(spread):
        return "tie"
    return "faster" if ratio > 1 else "slower"


def fmt(x: float, spec: str = ".3f") -> str:
    """`x` formatted, 'n/a' for NaN."""
    return "n/a" if x != x else format(x, spec)


# --- tables ----------------------------------------------------------------------------------


def table_row(cells: Sequence[object]) -> str:
    """One markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(head: Sequence[str], rows: Sequence[Sequence[object] | str] = ()) -> list[str]:
    """A markdown table's lines: the head, its rule, then the rows (a row given as a string
    is a line already made, e.g. one failed arm spanning the columns)."""
    return [table_row(head), "|" + "---|" * len(head),
            *(r if isinstance(r, str) else table_row(r) for r in rows)]


# --- runs of `locojax train` -----------------------------------------------------------------


def run_logged(argv: list[str], log: Path, timeout: float) -> tuple[int, str]:
    """Run argv in its own session, its output to `log`. Past `timeout`: SIGINT (`locojax
    launch` stops its hosts on SIGINT), 30 s later SIGKILL, and the exit code is -9 (a run
    cut short is a failed run). Returns (exit code, the log's last 8 lines)."""
    with open(log, "w") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            code = -9
    tail = log.read_text(errors="replace").strip().splitlines()[-8:]
    return code, "\n".join(tail)


def read_steps(path: Path) -> dict[int, dict]:
    """A run's jsonl log (perf.jsonl, metrics.jsonl) as one dict per step, lines of the same
    step merged."""
    rows: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows.setdefault(row["step"], {}).update(row)
    return rows


def steady_steps(steps: int, skip: int) -> range:
    """The steps a figure is taken over (1-based): the first `skip` warm up, the last holds
    the run's checkpoint."""
    return range(skip + 1, steps)


def steady_rows(run_dir: Path, steps: int, skip: int, log: str = "perf.jsonl") -> list[dict]:
    """The steady steps' rows of a run's log; raises if one is missing."""
    rows = read_steps(Path(run_dir) / log)
    want = steady_steps(steps, skip)
    missing = [s for s in want if s not in rows]
    if not want or missing:
        raise RuntimeError(f"no steady steps to measure (steps {missing or list(want)} "
                           f"missing)")
    return [rows[s] for s in want]


def share_jax_cache(work: Path) -> None:
    """One JAX compilation cache for every run under `work` (unless the caller set one):
    compile time is apart in every figure, this only shortens the runs."""
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(work) / "jax_cache"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


# --- the local Ray cluster -------------------------------------------------------------------


@contextlib.contextmanager
def local_ray() -> Iterator[str]:
    """A local Ray cluster over every core, for the runs' `--ray-address`; shut down on
    exit. Ray starts its workers `nice`d by 15 (its `worker_niceness`), so a benchmark's
    actors would lose the CPU to any other process on the machine, a test run or an editor,
    and the table would measure that load instead of the code; 0 keeps them at the priority
    the benchmark was started with."""
    import ray

    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ["RAY_DEDUP_LOGS"] = "0"
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
