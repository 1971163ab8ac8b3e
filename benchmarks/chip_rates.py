"""How close this machine's probes come to its published figures: the memory bandwidth and
matmul probes of `harness` (on an accelerator, LOOP passes inside one program: a scale that
reads and writes 512 MiB, chained bf16 products at 8192), each against the chip's profile
in locojax/predict/hardware/ where jax's device kind names one. The roofline every
benchmark reads on such a chip is the published figure (`harness.rates`); this says what a
program reaches of it.

    python -m benchmarks.chip_rates [--runs 5] [--values 134217728] [--matmul-n 2048]
"""

from __future__ import annotations

import argparse

from benchmarks import harness


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--values", type=int, default=2 ** 27,
                    help="f32 values the bandwidth probe moves (default 512 MiB)")
    ap.add_argument("--matmul-n", type=int, default=2048,
                    help="the matmul probe's n (f32 n^3 on the CPU, bf16 (4n)^3 elsewhere)")
    args = ap.parse_args(argv)
    print(harness.header("chip_rates"))
    bandwidth = harness.read_bandwidth(runs=args.runs, n=args.values)
    peak = harness.matmul_peak(n=args.matmul_n, runs=args.runs)
    print(f"bandwidth probe {bandwidth / 1e9:.1f} GB/s, matmul probe {peak / 1e12:.2f} TFLOP/s")
    published = harness.spec()
    if published is None:
        print("no published figures for this device: the probes are its roofline")
    else:
        spec_peak, spec_bandwidth, origin = published
        print(f"roofline ({origin}): {spec_bandwidth / 1e9:.1f} GB/s, {spec_peak / 1e12:.2f} "
              f"TFLOP/s; the probes reach {bandwidth / spec_bandwidth:.0%} and "
              f"{peak / spec_peak:.0%} of it")
    print(f"load average after: {harness.loads()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
