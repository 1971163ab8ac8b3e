"""locojax's learning against TRL's, paired by seed: the test of claim (3) in
docs/real_model.md.

Each seed is one prompt order on both sides (`bench_real_trl.py`), so the two runs of a
seed differ only in their random streams and in whatever differs between the two programs.
Per block of 10 steps, d = locojax's mean reward minus TRL's, one d per seed; over the seeds
t = mean(d) / (sd(d) / sqrt(n)), judged against Student's t at `--alpha` two-sided on n - 1
degrees of freedom. Beside it, each block's interval of mean(d) at that level and the range
check of claim (2) (locojax's mean over the seeds inside TRL's seeds' range).

Block means come from `bench_real_trl.py`'s results.json files (their per-step `rewards`)
and, for runs whose files were not kept, from a JSON table {"blocks": {seed: {side:
[block means]}}} (`--table`). A seed must have both sides, from one source each.

Usage:
    .venv/bin/python -m benchmarks.paired_seeds --blocks 2 \
        --table benchmarks/data/real_trl_blocks_seeds012.json \
        --results runs/bench-real-seeds34/results.json runs/bench-real-seeds567/results.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


from benchmarks import harness
from benchmarks.real_runs import BLOCK, block_means

SIDES = ("locojax", "trl")


def collect(results: list[Path], table: Path | None) -> dict[int, dict[str, list[float]]]:
    """{seed: {side: block means}} from the table and the results files; a run without its
    flags only (the benchmark's plain locojax side), every seed with both sides."""
    out: dict[int, dict[str, list[float]]] = {}

    def put(seed: int, side: str, blocks: list[float], where: str) -> None:
        if side in out.setdefault(seed, {}):
            raise ValueError(f"seed {seed} {side} appears twice (again in {where})")
        out[seed][side] = blocks

    if table:
        for seed, sides in json.loads(table.read_text())["blocks"].items():
            for side, blocks in sides.items():
                put(int(seed), side, [float(b) for b in blocks], str(table))
    for path in results:
        for r in json.loads(path.read_text()):
            if r.get("side") in SIDES and r.get("rewards") and not r.get("flags") \
                    and r.get("device", "cpu") == "cpu":
                put(int(r["seed"]), r["side"], block_means(r["rewards"]), str(path))
    lone = sorted(s for s, sides in out.items() if set(sides) != set(SIDES))
    if lone:
        raise ValueError(f"seeds without both sides: {lone}")
    return out


def paired(diffs: list[float], alpha: float) -> dict[str, float]:
    """mean, sd, t, the interval of the mean at 1 - alpha and the critical |t| (n - 1
    degrees of freedom) of paired differences."""
    from scipy import stats

    n = len(diffs)
    if n < 2:
        raise ValueError(f"a paired test needs at least 2 seeds, got {n}")
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    crit = float(stats.t.ppf(1 - alpha / 2, n - 1))
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    return {"n": n, "mean": mean, "sd": sd, "t": t, "crit": crit,
            "low": mean - crit * se, "high": mean + crit * se}


def report(seeds: dict[int, dict[str, list[float]]], blocks: int, alpha: float) -> bool:
    """Print the per-seed differences and each block's test; True when every block's |t| is
    below its critical value."""
    order = sorted(seeds)
    short = [s for s in order if min(len(v) for v in seeds[s].values()) < blocks]
    if short:
        raise ValueError(f"seeds with fewer than {blocks} blocks of {BLOCK} steps: {short}")
    head = ["seed"] + [f"d steps {i * BLOCK + 1}-{(i + 1) * BLOCK}" for i in range(blocks)]
    rows = [[s] + [f"{seeds[s]['locojax'][i] - seeds[s]['trl'][i]:+.3f}" for i in range(blocks)]
            for s in order]
    print(f"locojax minus TRL, mean reward per block, {len(order)} seeds:")
    print("\n".join(harness.table(head, rows)))
    ok = True
    for i in range(blocks):
        mine = [seeds[s]["locojax"][i] for s in order]
        theirs = [seeds[s]["trl"][i] for s in order]
        p = paired([a - b for a, b in zip(mine, theirs)], alpha)
        holds = abs(p["t"]) < p["crit"]
        ok &= holds
        inside = min(theirs) <= statistics.mean(mine) <= max(theirs)
        print(f"steps {i * BLOCK + 1}-{(i + 1) * BLOCK}: mean d {p['mean']:+.4f} (sd "
              f"{p['sd']:.4f}), t {p['t']:+.2f} against |t| < {p['crit']:.3f} on {p['n'] - 1} "
              f"degrees of freedom: {'holds' if holds else 'MISSED'}; {1 - alpha:.0%} interval "
              f"{p['low']:+.4f} to {p['high']:+.4f}; locojax mean {statistics.mean(mine):.3f}, "
              f"TRL range {min(theirs):.3f}-{max(theirs):.3f} "
              f"({'inside' if inside else 'outside'})")
    print(f"paired test over every block: {'HOLDS' if ok else 'MISSED'}")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, nargs="*", default=[],
                    help="bench_real_trl.py results.json files")
    ap.add_argument("--table", type=Path, help="block means of runs whose files were not kept")
    ap.add_argument("--blocks", type=int, default=2, help="blocks of 10 steps judged")
    ap.add_argument("--alpha", type=float, default=0.05, help="two-sided level of each block")
    args = ap.parse_args(argv)
    print(harness.header("paired_seeds"))
    try:
        seeds = collect(args.results, args.table)
        ok = report(seeds, args.blocks, args.alpha)
    except ValueError as e:
        print(f"paired_seeds: {e}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
