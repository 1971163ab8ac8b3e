"""Kernels timed alone, and a compiled program priced as the sum of its kernels so timed.

The isolated-kernel model `benchmarks/kernel_profile.py` holds against a profiler's trace of
the real program, kernel by kernel. Summed alone it under-predicts TINY, SMALL and SmolLM2
programs by 14-62% (docs/results/predict_validation.md, "Kernel by kernel"): a kernel runs slower
among others than alone. So `predict_programs compiled` uses the matmul tables only as one
feature of a program, weighted by a fit to locojax's own programs (`kernel_model.py`,
`calibrate_kernels.py`, which times these tables in a process pinned to one core).

The tables (`measure`), each a median of repeats (`calibrate_host.median_time`):
- `launch_s`, `call_s`: a kernel's cost whatever its size, and a program call's. The narrow
  decoder's GRPO update (d 16, vocab 64: its arithmetic negligible) at 1 and 2 layers: the
  difference of the two times over the difference of their kernel counts (read from their
  compiled HLO, `hlo_kernels.py`) is a launch; what is left of the 1-layer time past its
  launches is the call.
- `dot_s`: seconds of one f32 matmul kernel, (m x k) @ (k x n), its launch included, on a
  grid of m and of k <= n (a matmul and its transpose shape cost alike: the grid times them
  in pairs). Each point is a loop of `reps` iterations of x @ w1 @ w2 (w1 [k, n], w2 [n, k],
  scaled to keep x's size), against the same loop scaling x alone: the difference per
  iteration is two matmuls less one elementwise kernel, so one matmul is (t_pair - t_alone
  + launch) / 2. Points past `MAX_FLOPS` are not timed: the largest timed m of that k, n is
  scaled by its FLOPs.
- `bandwidth`: bytes per second of an elementwise kernel (x * c, read and written) of 64 KiB
  to 64 MiB, each over the loop's time per iteration at 4 KiB, where the bytes cost nothing.

The price of a program: its call, plus its kernels' time (`KernelPrices.seconds`),

    t = call + Σ_kernels count · (launch + max(Σ_dots batch · (T(m, k, n) - launch),
                                                bytes / bandwidth(bytes)))

T(m, k, n) interpolated linearly in log m, log k, log n of its time less the launch (k and
n in either order), scaled with the FLOPs past the grid's edges; bandwidth(bytes)
interpolated in log bytes.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math

from locojax.predict.calibrate_host import median_time
from benchmarks.hlo_kernels import Dot, Kernel

DOT_M = (1, 4, 16, 64, 256, 1024, 4096)
DOT_KN = (16, 64, 256, 1024, 4096)
MAX_FLOPS = 2.0e10  # one timed matmul pair's FLOPs at most (~0.1-0.2 s on a CPU core pair)
BANDWIDTH_BYTES = (2 ** 16, 2 ** 18, 2 ** 20, 2 ** 22, 2 ** 24, 2 ** 26)
LOOP_SECONDS = 4e-3  # a timed call's length, so that its dispatch does not matter


def launch_costs(reps: int = 15) -> dict[str, float]:
    """{"launch_s", "call_s"} from the narrow decoder's update at 1 and 2 layers."""
    from benchmarks.hlo_kernels import kernels
    from benchmarks.kernel_programs import compiled_update
    from locojax.model import config
    from locojax.predict import calibration_step

    shape = (2, 2, 8, 8)
    counts, times = [], []
    for layers in (1, 2):
        micro = config.tiny(num_hidden_layers=layers, **calibration_step.MICRO,
                            compute_dtype="float32")
        compiled = compiled_update(micro, *shape)
        counts.append(kernels(compiled.as_text()).launches)
        times.append(median_time(calibration_step.update(micro, *shape), reps))
    launch = max(times[1] - times[0], 0.0) / max(counts[1] - counts[0], 1.0)
    return {"launch_s": launch, "call_s": max(times[0] - counts[0] * launch, 0.0)}


def _scaling_seconds(x, reps: int) -> float:
    """Per iteration of a loop of `reps` iterations scaling x: one elementwise kernel."""
    import jax

    f = jax.jit(lambda x: jax.lax.fori_loop(0, reps, lambda i, y: y * 1.0001, x))
    return median_time(lambda: f(x).block_until_ready(), 5) / reps


def _loop_seconds(m: int, k: int, n: int, reps: int) -> tuple[float, float]:
    """Per iteration: (x @ w1 @ w2, x * c) over `reps` iterations, x [m, k]."""
    import jax
    import jax.numpy as jnp

    x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    w1 = jax.random.normal(jax.random.key(1), (k, n), jnp.float32) / math.sqrt(k)
    w2 = jax.random.normal(jax.random.key(2), (n, k), jnp.float32) / math.sqrt(n)
    pair = jax.jit(lambda x, a, b: jax.lax.fori_loop(0, reps, lambda i, y: (y @ a) @ b, x))
    t_pair = median_time(lambda: pair(x, w1, w2).block_until_ready(), 5)
    return t_pair / reps, _scaling_seconds(x, reps)


def dot_table(launch: float, peak: float, ms=DOT_M, kns=DOT_KN) -> dict[str, float]:
    """{"m,k,n": seconds of one matmul kernel} on the grid (module docstring); `peak`, a
    large matmul's FLOP/s, sizes each point's loop."""
    out = {}
    for m, k, n in itertools.product(ms, kns, kns):
        flops = 4.0 * m * k * n  # the pair
        if k > n or flops > MAX_FLOPS:
            continue
        reps = int(min(2000, max(2, LOOP_SECONDS * peak / flops)))
        t_pair, t_alone = _loop_seconds(m, k, n, reps)
        out[f"{m},{k},{n}"] = max((t_pair - t_alone + launch) / 2, launch)
    return out


def bandwidth_table() -> dict[str, float]:
    """{"bytes": B/s} of an elementwise kernel of that many bytes in (and as many out)."""
    import jax.numpy as jnp

    def seconds(nbytes: int, reps: int) -> float:
        return _scaling_seconds(jnp.ones((max(1, nbytes // 4),), jnp.float32), reps)

    empty = seconds(4096, 2000)
    out = {}
    for size in BANDWIDTH_BYTES:
        reps = int(max(4, min(2000, 2e8 / size)))
        out[str(size)] = 2.0 * size / max(seconds(size, reps) - empty, 1e-9)
    return out


def measure(peak: float, quick: bool = False) -> dict:
    """The tables of the module docstring; `peak`, a large matmul's FLOP/s. `quick`: a
    2 x 2 x 2 grid (m 4 and 64, k and n 16 and 256), for a smoke test."""
    costs = launch_costs()
    grid = ((4, 64), (16, 256)) if quick else (DOT_M, DOT_KN)
    return {**costs, "dot_s": dot_table(costs["launch_s"], peak, *grid),
            "bandwidth": bandwidth_table()}


def _bracket(grid: list[float], x: float) -> tuple[int, float]:
    """(i, w): x's place between grid[i] and grid[i + 1] in log space, clamped."""
    lx = math.log(min(max(x, grid[0]), grid[-1]))
    logs = [math.log(g) for g in grid]
    i = min(max(bisect.bisect_right(logs, lx) - 1, 0), len(grid) - 2)
    return i, (lx - logs[i]) / (logs[i + 1] - logs[i])


@dataclasses.dataclass(frozen=True)
class KernelPrices:
    launch: float
    call: float
    dots: dict[tuple[int, int, int], float]  # (m, k <= n, n): seconds, launch included
    bandwidth: tuple[tuple[float, float], ...]  # (bytes, B/s), sorted

    @classmethod
    def of(cls, table: dict) -> "KernelPrices":
        """From `measure`'s tables."""
        dots = {tuple(int(v) for v in key.split(",")): float(s)
                for key, s in table["dot_s"].items()}
        return cls(float(table["launch_s"]), float(table["call_s"]), _filled(dots),
                   tuple(sorted((float(b), float(r)) for b, r in table["bandwidth"].items())))

    @functools.cached_property
    def _ms(self) -> list[int]:
        return sorted({key[0] for key in self.dots})

    @functools.cached_property
    def _kns(self) -> list[int]:
        return sorted({key[2] for key in self.dots})

    def dot(self, d: Dot) -> float:
        """Seconds of d's arithmetic in one kernel, its launch not included."""
        ms, kns = self._ms, self._kns
        k, n = min(d.k, d.n), max(d.k, d.n)
        (im, wm), (ik, wk), (jn, wn) = _bracket(ms, d.m), _bracket(kns, k), _bracket(kns, n)
        log_t = 0.0
        for a, b, c in itertools.product((0, 1), repeat=3):
            kk, nn = kns[ik + b], kns[jn + c]
            t = self.dots[(ms[im + a], min(kk, nn), max(kk, nn))] - self.launch
            weight = (wm if a else 1 - wm) * (wk if b else 1 - wk) * (wn if c else 1 - wn)
            log_t += weight * math.log(max(t, 1e-12))
        inside = (min(max(d.m, ms[0]), ms[-1]) * min(max(k, kns[0]), kns[-1])
                  * min(max(n, kns[0]), kns[-1]))
        return d.batch * math.exp(log_t) * (d.m * k * n) / inside

    def rate(self, nbytes: float) -> float:
        sizes = [b for b, _ in self.bandwidth]
        i, w = _bracket(sizes, max(nbytes, 1.0))
        lo, hi = self.bandwidth[i][1], self.bandwidth[i + 1][1]
        return math.exp((1 - w) * math.log(lo) + w * math.log(hi))

    def matmuls(self, k: Kernel) -> float:
        """Seconds of one run of `k`'s matmuls, its launch not included."""
        return sum(self.dot(d) for d in k.dots)

    def kernel(self, k: Kernel) -> float:
        """One run of `k`: its launch and the larger of its matmuls and its bytes."""
        return self.launch + max(self.matmuls(k), k.bytes / self.rate(k.bytes))

    def seconds(self, kernels: list[Kernel]) -> float:
        """The kernels' time, each as often as it runs; a program adds its `call`."""
        return sum(k.count * self.kernel(k) for k in kernels)


def _filled(dots: dict[tuple[int, int, int], float]) -> dict[tuple[int, int, int], float]:
    """The grid with its untimed points (past the FLOPs the calibration times) filled: the
    largest timed m of that k, n scaled by m (a matmul that large runs at its full rate)."""
    ms = sorted({key[0] for key in dots})
    out = dict(dots)
    for k, n in {(key[1], key[2]) for key in dots}:
        timed = [m for m in ms if (m, k, n) in dots]
        for m in ms:
            if (m, k, n) not in out and timed:
                top = max(timed)
                out[(m, k, n)] = dots[(top, k, n)] * m / top
    kns = sorted({key[2] for key in dots})
    for m, k, n in itertools.product(ms, kns, kns):
        if k <= n and (m, k, n) not in out:
            raise ValueError(f"kernel table has no matmul near m {m}, k {k}, n {n}")
    return out
