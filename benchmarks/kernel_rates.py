"""A per-kernel model with rates read inside a calibration program, against the trace.

    .venv/bin/python -m benchmarks.kernel_rates --tables ONE_CORE_TABLES.json \
        --program tiny 4 4 20 48 --program small 8 2 24 16 [--program DIR B G P N ...]

`kernel_profile.py` found that a kernel's time inside a program is not its time alone: each
kernel runs on one thread while others run beside it, elementwise kernels run at a fraction
of a streaming loop's rate, fresh buffers cost their pages. This script tries the model that
suggests, with nothing fitted to the programs it judges: the calibration decoder's own update
and generate (`calibrate_device.CPU_PROBE`, 8 x 4 rows, P 16, N 32) are traced, and from
each
- every non-matmul class's rate: its kernels' bytes over their active time;
- the matmuls' factor: their active time over the tables' time for them (`--tables`, best
  timed on one core: `taskset -c 0 ... kernel_profile.py --tables FILE`);
- the concurrency: the kernels' active time over the call's wall time.
Each program named is then priced kernel by kernel, launch + (its matmuls' table time x the
factor, or its bytes at its class's rate), summed, divided by the concurrency, plus the
tables' call cost; and traced, and its wall time printed beside, with the matmul factor and
with it left at 1. A development tool: docs/predict_validation.md says how far it held.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


from benchmarks import harness
from benchmarks import kernel_traces as kp
from benchmarks.kernel_model import kernel_class
from benchmarks.kernel_tables import KernelPrices

BUILDS = {"update": kp.train_program, "generate": kp.generate_program}
CALIBRATION_SHAPE = (8, 4, 16, 32)


def traced(cfg, shape: tuple, kind: str, calls: int):
    """(the program's kernels, {kernel name: active s per call}, wall s per call)."""
    listed, (_, active, _, wall) = kp.profiled(BUILDS[kind], cfg, shape, calls)
    return listed, active, wall


def class_sums(listed: list, active: dict, prices: KernelPrices) -> dict:
    """Per class: [bytes (a dot's: its tables' seconds), active seconds] per call."""
    sums: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    classes = {}
    for k in listed:
        cls = classes.setdefault(k.name, kernel_class(k))
        sums[cls][0] += k.count * (prices.matmuls(k) if cls == "dot" else k.bytes)
    for name, cls in classes.items():
        sums[cls][1] += active.get(name, 0.0)
    return sums


def rates_of(cfg, prices: KernelPrices, calls: int) -> dict:
    """Per program kind: {"rates": {class: B/s}, "dot_factor", "concurrency"}."""
    out = {}
    for kind in BUILDS:
        listed, active, wall = traced(cfg, CALIBRATION_SHAPE, kind, calls)
        sums = class_sums(listed, active, prices)
        out[kind] = {"rates": {c: b / t for c, (b, t) in sums.items() if c != "dot" and t > 0},
                     "dot_factor": sums["dot"][1] / sums["dot"][0],
                     "concurrency": sum(active.values()) / wall}
    return out


def seconds(listed: list, rates: dict, prices: KernelPrices, dot_factor: float) -> float:
    """A call's time under the model (module docstring); a class the calibration program
    lacks gets the mean of its rates."""
    fallback = sum(rates["rates"].values()) / len(rates["rates"])
    work = 0.0
    for k in listed:
        cls = kernel_class(k)
        run = (dot_factor * prices.matmuls(k) if cls == "dot"
               else k.bytes / rates["rates"].get(cls, fallback))
        work += k.count * (prices.launch + run)
    return prices.call + work / rates["concurrency"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", required=True, help="kernel tables JSON (kernel_profile.py)")
    ap.add_argument("--program", nargs=5, action="append", required=True,
                    metavar=("MODEL", "B", "G", "P", "N"), help="a preset or an HF directory")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args(argv)
    print(harness.header("kernel_rates"))
    print(harness.command_line())
    from locojax.model import config
    from locojax.predict.calibrate_device import CPU_PROBE

    prices = KernelPrices.of(json.loads(Path(args.tables).read_text()))
    cal = rates_of(config.tiny(**CPU_PROBE.decoder), prices, args.calls)
    for kind, r in cal.items():
        print(f"calibration {kind}: " + ", ".join(f"{c} {v / 1e9:.1f} GB/s"
                                                  for c, v in r["rates"].items())
              + f"; matmuls x{r['dot_factor']:.2f} the tables; concurrency "
                f"{r['concurrency']:.2f}")
    rows = []
    for model, *shape in args.program:
        cfg, dims = kp.model_config(model), tuple(int(x) for x in shape)
        for kind in BUILDS:
            listed, _, wall = traced(cfg, dims, kind, args.calls)
            pred = seconds(listed, cal[kind], prices, cal[kind]["dot_factor"])
            flat = seconds(listed, cal[kind], prices, 1.0)
            rows.append((f"{Path(model).name} {kind} {' x '.join(shape)}",
                         f"{wall * 1e3:.2f}", f"{pred * 1e3:.2f}", f"{pred / wall - 1:+.0%}",
                         f"{flat * 1e3:.2f}", f"{flat / wall - 1:+.0%}"))
    print("\n".join(harness.table(("program (B x G x P x N)", "wall ms", "model ms", "error",
                                   "matmul factor 1 ms", "error"), rows)))
    print(f"load average at end {harness.loads()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
