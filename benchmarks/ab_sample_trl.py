"""Sampling, locojax against TRL: the real checkpoint's completions before any update.

ab_update_trl.py shows one update equal to TRL's on a fixed batch; what a run adds to that
is sampling. This A/B draws k completions of each of the held-out rows from the unchanged
SmolLM2-135M-Instruct on both sides, with the settings of bench_real_trl's runs
(temperature 1, N 32 new tokens, chat arith, the flexible reward): locojax through `locojax
eval --k K --temperature 1` (the engine a run samples with), TRL through
`GRPOTrainer._generate` (peers/trl_sample_worker.py). Both sample one distribution if the
two samplers agree, so every row's mean reward differs between the sides only by chance.

Compared per side: mean reward, completion length, the share cut by the budget; and the
difference locojax - TRL, paired over the rows (each row's k-sample mean on each side), with
its standard error from the rows' differences and z = difference / SE. A row's difficulty
is shared by both sides, so pairing removes it from the error.

Usage:
    .venv/bin/python -m benchmarks.ab_sample_trl --k 16            # both sides, 200 rows
    .venv/bin/python -m benchmarks.ab_sample_trl --rows 4 --k 2 --sides locojax
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


from benchmarks import harness
from benchmarks.real_runs import SETTINGS, ab_refusal, eval_argv
from benchmarks.peers import install

QUANTITIES = (("reward", "rewards"), ("length", "lengths"), ("cut by budget", "truncated"))


def locojax_side(model: str, seed: int, rows: int, k: int, out: Path) -> Path:
    """`locojax eval`, k samples of each row at temperature 1: its per-row jsonl."""
    path = out / "locojax.jsonl"
    code, tail = harness.run_logged(
        eval_argv(model, seed, path, rows, "--k", str(k), "--temperature",
                  str(SETTINGS["temperature"]), "--batch-size", "8"),
        out / "locojax.log", timeout=3600)
    if code:
        raise RuntimeError(f"locojax eval failed ({code}):\n{tail}")
    return path


def trl_side(python: Path, model: str, seed: int, rows: int, k: int, out: Path) -> Path:
    path = out / "trl.jsonl"
    code, tail = harness.run_logged(
        [str(python), "-m", "benchmarks.peers.trl_sample_worker", "--model", model,
         "--out", str(path), "--seed", str(seed), "--rows", str(rows), "--k", str(k),
         "--settings", json.dumps(SETTINGS)], out / "trl.log", timeout=3600)
    if code:
        raise RuntimeError(f"TRL's sampling failed ({code}):\n{tail}")
    return path


def read_rows(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def row_means(rows: dict[str, dict], field: str) -> dict[str, float]:
    return {i: sum(map(float, r[field])) / len(r[field]) for i, r in rows.items()}


def paired(a: dict[str, float], b: dict[str, float]) -> tuple[float, float]:
    """Mean of a - b over the rows, and its standard error (sample std / √n). The two sides
    must have scored the same rows: a row one side lacks would unpair the comparison."""
    if set(a) != set(b):
        odd = sorted(set(a) ^ set(b))
        raise ValueError(f"the sides scored different rows ({len(odd)} on one side only, "
                         f"first {odd[:3]}): same --rows and --seed on both")
    d = [a[i] - b[i] for i in a]
    if len(d) < 2:
        return (d[0] if d else math.nan), math.nan
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    return mean, math.sqrt(var / len(d))


def report(sides: dict[str, dict[str, dict]]) -> list[str]:
    """One row per quantity: each side's mean, then locojax - TRL paired, its SE and z."""
    head = ["quantity", *sides, "locojax - TRL (paired)", "SE", "z"]
    rows = []
    for name, field in QUANTITIES:
        means = {side: row_means(r, field) for side, r in sides.items()}
        cells = [name, *(f"{sum(m.values()) / len(m):.4f}" for m in means.values())]
        if set(sides) == {"locojax", "trl"}:
            d, se = paired(means["locojax"], means["trl"])
            cells += [f"{d:+.4f}", f"{se:.4f}", f"{d / se:+.2f}" if se > 0 else "n/a"]
        else:
            cells += ["n/a"] * 3
        rows.append(cells)
    return harness.table(head, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    ap.add_argument("--seed", type=int, default=0, help="the held-out split's and the samples'")
    ap.add_argument("--rows", type=int, default=200, help="the first this many held-out rows")
    ap.add_argument("--k", type=int, default=16, help="samples of each row, each side")
    ap.add_argument("--sides", nargs="+", default=["locojax", "trl"], choices=["locojax", "trl"])
    ap.add_argument("--out", type=Path, default=Path("runs/ab-sample-trl"))
    args = ap.parse_args(argv)
    refusal = ab_refusal(args.model, need_trl="trl" in args.sides)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    peer = install.PEERS["trl"]
    print(harness.header("ab_sample_trl", f"settings {json.dumps(SETTINGS)}"))
    print(harness.command_line())
    args.out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for side in args.sides:  # one after the other: each has the machine to itself
        paths[side] = (locojax_side(args.model, args.seed, args.rows, args.k, args.out)
                       if side == "locojax" else
                       trl_side(peer.python(install.DEFAULT_CACHE), args.model, args.seed,
                                args.rows, args.k, args.out))
    sides = {side: read_rows(p) for side, p in paths.items()}
    print(f"{args.rows} held-out rows x k {args.k} samples a side; load {harness.loads()}")
    for line in report(sides):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
