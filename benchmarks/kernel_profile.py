"""Where a compiled program's time goes, kernel by kernel: a profiler's trace of the real
program against the kernels read from its HLO (`benchmarks/hlo_kernels.py`) and against
the same kernels timed alone (`benchmarks/kernel_tables.py`).

    .venv/bin/python -m benchmarks.kernel_profile --model tiny --shape 4 4 20 48 \
        [--tables FILE] [--quick] [--top 8]

Programs: the GRPO update (`calibration_step.update`: `train_step` on a synthetic batch of
B prompts x G samples, P + N tokens) and the engine's generate of the same B x G rows (its
prefill, then its decode loop, every row ending at N tokens). After warm-up, `--calls` calls
of each are traced with `jax.profiler`; each XLA:CPU kernel event (the intra-op threads'
`tf_XLAEigen` lines) is joined by name to the compiled program's kernel of that name (the
generate's prefill and decode are two programs whose names may repeat: such a name's
kernels are summed over both). A kernel split over threads leaves an event per task: its
"core" time sums them, its "active" time is the time any of them ran (their union), the one
to hold against a model of the kernel's wall time. Per program it prints the wall time of a
call, the kernels' active and core times, the isolated-kernel model's sum, and a table by
kernel class: dot (any matmul), transcendental (exp, log, tanh,
logistic, rsqrt, sqrt, power, erf, divide), layout (copy or transpose), fill (a broadcast
that reads nothing), other. CPU only: the trace's thread names are XLA:CPU's.

`--tables FILE` reads the kernel tables, or measures them (about a minute on 2 cores) and
writes FILE; `--quick` measures a 2 x 2 x 2 matmul grid (a smoke test's, not a figure).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from benchmarks import harness
from benchmarks.kernel_traces import generate_program, model_config, profiled, train_program
from benchmarks.kernel_model import kernel_class
from benchmarks.kernel_tables import KernelPrices, measure

COLUMNS = ("class", "kernel runs per call", "events per call", "core ms", "active ms",
           "model ms", "active / model", "MB", "GFLOP", "GB/s active", "GFLOP/s active")


def _rows(priced: list, traced: tuple, classes: dict) -> dict[str, list[float]]:
    """Per class: [kernel runs, events, core s, active s, model s, bytes, FLOPs] per call;
    `priced`: (kernel, its class, its model seconds per call) each; `classes`: a kernel
    name's class, for the trace's events by name."""
    core, active, events, _ = traced
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * 7)
    for k, cls, seconds in priced:
        row = rows[cls]
        row[0] += k.count
        row[4] += seconds
        row[5] += k.count * k.bytes
        row[6] += k.count * k.flops
    for name, cls in classes.items():
        row = rows[cls]
        row[1] += events.get(name, 0.0)
        row[2] += core.get(name, 0.0)
        row[3] += active.get(name, 0.0)
    return rows


def report(title: str, kernels: list, traced: tuple, prices: KernelPrices,
           top: int) -> list[str]:
    """The program's lines: its totals, the table by class, the kernels the isolated model
    misses most (their active time against it)."""
    core, active, events, wall = traced
    priced = [(k, kernel_class(k), k.count * prices.kernel(k)) for k in kernels]
    model: dict[str, float] = collections.Counter()
    for k, _, seconds in priced:
        model[k.name] += seconds
    classes = {k.name: cls for k, cls, _ in priced}  # a repeated name: its last kernel's
    lines = [f"## {title}",
             f"wall per call {wall * 1e3:.3f} ms; kernels active {sum(active.values()) * 1e3:.3f}"
             f" ms, on every thread {sum(core.values()) * 1e3:.3f} ms; isolated model "
             f"{(prices.call + sum(model.values())) * 1e3:.3f} ms (its call "
             f"{prices.call * 1e3:.3f} ms included)"]
    lines += harness.table(COLUMNS)
    rows = _rows(priced, traced, classes)
    for cls, (n, ev, c, act, pred, nbytes, flops) in sorted(rows.items(),
                                                            key=lambda kv: -kv[1][3]):
        lines.append(harness.table_row((
            cls, f"{n:.0f}", f"{ev:.0f}", f"{c * 1e3:.3f}", f"{act * 1e3:.3f}",
            f"{pred * 1e3:.3f}", harness.fmt(harness.ratio(act, pred), ".2f"),
            f"{nbytes / 1e6:.1f}", f"{flops / 1e9:.3f}",
            harness.fmt(harness.ratio(nbytes / 1e9, act), ".1f"),
            harness.fmt(harness.ratio(flops / 1e9, act), ".1f"))))
    unmatched = sum(t for name, t in active.items() if name not in classes)
    lines.append(f"active in events of no kernel of the program's HLO: {unmatched * 1e3:.3f} ms")
    worst = sorted(active, key=lambda nm: -(active[nm] - model.get(nm, 0.0)))[:top]
    lines += [f"  {nm}: {active[nm] * 1e6:.1f} us active, {model.get(nm, 0.0) * 1e6:.1f} us "
              f"model, {events[nm]:.0f} events, {classes.get(nm, '?')}" for nm in worst]
    return lines


def tables(path: str, quick: bool) -> KernelPrices:
    if path and Path(path).exists():
        return KernelPrices.of(json.loads(Path(path).read_text()))
    measured = measure(harness.matmul_peak(1024), quick)
    if path:
        Path(path).write_text(json.dumps(measured, indent=1))
    return KernelPrices.of(measured)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a preset (tiny, small) or an HF directory")
    ap.add_argument("--shape", type=int, nargs=4, default=(4, 4, 20, 48),
                    metavar=("B", "G", "P", "N"))
    ap.add_argument("--tables", default="", help="kernel tables JSON: read, or measured here")
    ap.add_argument("--quick", action="store_true", help="a 2 x 2 x 2 matmul grid (smoke)")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    print(harness.header("kernel_profile", f"model {args.model}, B x G x P x N {args.shape}"))
    print(harness.command_line())
    cfg = model_config(args.model)
    prices = tables(args.tables, args.quick)
    for title, build in (("train step", train_program), ("generate", generate_program)):
        listed, traced = profiled(build, cfg, args.shape, args.calls)
        print("\n".join(report(title, listed, traced, prices, args.top)))
    print(f"load average at end {harness.loads()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
