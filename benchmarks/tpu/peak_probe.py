"""Does a device's `memory_stats()["peak_bytes_in_use"]` count a program's XLA temporaries?

    python -m benchmarks.tpu.peak_probe OUT.json [--n 16384]

Two n x n f32 inputs made in place (no temporary before the probe), then one compiled
program whose `memory_analysis()` names 3 n² x 4 bytes of temporaries (three products kept
alive at once by optimization barriers). If the peak counts temporaries it rises by about
that much over the inputs; on one TPU v5e (JAX 0.10.2) it rose by the executable's code
only (docs/results/tpu_qwen3_fit.md), so there the chip's peak cannot check a memory
plan's temporaries.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

FIELDS = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
ANALYSIS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")


def stats(device) -> dict:
    s = device.memory_stats() or {}
    return {k: s.get(k) for k in FIELDS}


def three_products(a, b):
    c = jax.lax.optimization_barrier(a @ b)
    d = jax.lax.optimization_barrier(c @ a)
    e = jax.lax.optimization_barrier(d @ b)
    return jnp.sum(e + d + c)


def probe(n: int) -> dict:
    device = jax.local_devices()[0]
    a = jnp.full((n, n), 0.5, jnp.float32)
    b = jnp.full((n, n), 0.25, jnp.float32)
    jax.block_until_ready((a, b))
    before = stats(device)
    compiled = jax.jit(three_products).lower(a, b).compile()
    analysis = compiled.memory_analysis()
    compiled(a, b).block_until_ready()
    after = stats(device)
    return {"n": n, "held_before": before, "after_run": after,
            "analysis": {k: getattr(analysis, k, None) for k in ANALYSIS},
            "peak_rise_bytes": (after["peak_bytes_in_use"] or 0)
            - (before["peak_bytes_in_use"] or 0),
            "expected_temp_bytes": 3 * n * n * 4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=16384)
    args = ap.parse_args()
    row = probe(args.n)
    print(json.dumps(row, indent=1))
    with open(args.out, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
