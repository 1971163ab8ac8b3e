"""async with and without in-flight weight updates, at one staleness bound, on long-tailed
completion lengths (issue 59 item 5): tokens/s and steps/s of each, and their ratio.

    python -m benchmarks.bench_inflight [--rounds 2] [--chunk 8] [--max-staleness 1]

Two arms, each a real `locojax train --mode async` run (one learner host, `--workers`
rollout workers, one local Ray cluster they all join, one JAX compilation cache):

    off   --max-staleness k                          a unit decodes on the version it began
    on    --max-staleness k --inflight-chunk K       workers take a newer version every K
                                                     decode iterations (fleet/inflight.py)

Rounds interleave the arms, reversed every other round (off on on off ...), so the shared
machine's load falls on both alike; each arm's A/A spread (max / min - 1 of its runs'
figures) is printed, and a ratio within the larger one is a tie (harness.verdict).

Workload: the demo preset (the embedded tiny checkpoint, built-in arith, GRPO) with
`--rollout.ignore-eos` and `--rollout.tail-median M --rollout.tail-sigma S`: every row is
exactly its cap, drawn lognormal (median M, σ S) from its group id (`rollout/lengths.py`),
clipped at N. The small-4096 shape (benchmarks/engine_work.py: 16 prompts x 8, N 4096,
median 200, σ 1; its longest row ~ 11x the median) scaled to a CPU: by default 8 prompts
x 4, N 512, median 32, σ 1 (the same σ, median / N 0.06 against small-4096's 0.05).

Figures, over each run's steady steps (the first `--skip` warm up, the last holds the
checkpoint, `harness.steady_steps`): steps/s = steps / Σ perf/step_time; tokens/s = the
response tokens those steps trained (rollout/response_length/mean x rows) / Σ step_time.
The learner's step time holds its wait for the step's rollouts, so both are the run's
throughput. Also printed: the mean row staleness, how much fresher the mean token is
(row minus token staleness: in-flight swaps; 0 off), the share of the learner's time spent
waiting for rollouts (near 0: the learner is the bottleneck, and no rollout speed-up can
show), and the load average around each run.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import time
from pathlib import Path

from benchmarks import harness
from locojax.rollout.lengths import tail_quantile


def base_args(args) -> list[str]:
    """The flags every run shares (the arms add --inflight-chunk)."""
    return ["train", "demo", "--mode", "async", "--hosts", str(args.workers + 1),
            "--workers", str(args.workers), "--max-staleness", str(args.max_staleness),
            "--lease-timeout-s", "600", "--rollout.prompts-per-step", str(args.prompts),
            "--algo.group-size", str(args.group), "--rollout.max-new-tokens",
            str(args.new_tokens), "--rollout.ignore-eos", "--rollout.tail-median",
            str(args.tail_median), "--rollout.tail-sigma", str(args.tail_sigma),
            "--steps", str(args.steps), "--eval.every", "0", "--checkpoint.every", "0",
            "--no-progress", "--no-tensorboard", "--seed", "0"]


def arm_args(args, arm: str) -> list[str]:
    return [] if arm == "off" else ["--inflight-chunk", str(args.chunk)]


def figures(run_dir: Path, args) -> dict[str, float]:
    """One run's throughput and staleness over its steady steps."""
    perf = harness.steady_rows(run_dir, args.steps, args.skip)
    metrics = harness.steady_rows(run_dir, args.steps, args.skip, "metrics.jsonl")
    seconds = sum(float(r["perf/step_time"]) for r in perf)
    rows = args.prompts * args.group
    tokens = sum(float(m["rollout/response_length/mean"]) * rows for m in metrics)
    fresher = [m["rollout/staleness/mean"] - m.get("rollout/token_staleness/mean",
                                                   m["rollout/staleness/mean"])
               for m in metrics]
    wait = sum(float(r.get("perf/phase/wait_rollouts", 0.0)) for r in perf) / seconds
    return {"steps_per_s": len(perf) / seconds, "tokens_per_s": tokens / seconds, "wait": wait,
            "staleness": statistics.mean(m["rollout/staleness/mean"] for m in metrics),
            "fresher": statistics.mean(fresher)}


def run(args, arm: str, index: int, address: str) -> dict[str, float]:
    """One run of `arm`; its figures, or {} if it failed (the log's tail printed)."""
    run_dir = Path(args.work_dir) / f"{arm}-{index}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a leftover checkpoint would be resumed
    argv = [*harness.CLI, *base_args(args), *arm_args(args, arm), "--run-dir", str(run_dir),
            "--ray-address", address]
    before = harness.load()
    print(f"$ {shlex.join(argv[2:])}   # load {before:.2f}", flush=True)
    t0 = time.perf_counter()
    code, tail = harness.run_logged(argv, Path(args.work_dir) / f"{arm}-{index}.log",
                                    args.timeout)
    if code != 0:
        print(f"# FAILED (exit {code}):\n{tail}", flush=True)
        return {}
    out = figures(run_dir, args)
    out["load"] = (before + harness.load()) / 2
    print(f"# {arm}: {out['tokens_per_s']:.1f} tokens/s, {out['steps_per_s']:.3f} steps/s, "
          f"staleness {out['staleness']:.2f}, wall {time.perf_counter() - t0:.0f} s, "
          f"load {before:.2f} -> {harness.load():.2f}", flush=True)
    return out


def report(results: dict[str, list[dict]], args) -> list[str]:
    """The table: each arm's median figures over its runs, A/A spread, the on / off ratio."""
    ok = {arm: [r for r in rs if r] for arm, rs in results.items()}
    lines = harness.table(["arm", "runs", "tokens/s", "steps/s", "A/A spread (tokens/s)",
                           "row staleness", "token fresher by", "learner waits",
                           "load (mean)"])
    med = {}
    for arm, rs in ok.items():
        if not rs:
            lines.append(f"| {arm} | 0 | failed | | | | | | |")
            continue
        med[arm] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        spread = harness.aa_spread([r["tokens_per_s"] for r in rs])
        lines.append(harness.table_row([
            arm, len(rs), f"{med[arm]['tokens_per_s']:.1f}", f"{med[arm]['steps_per_s']:.3f}",
            harness.fmt(spread, ".1%"), f"{med[arm]['staleness']:.2f}",
            f"{med[arm]['fresher']:.2f}", f"{med[arm]['wait']:.0%}", f"{med[arm]['load']:.2f}"]))
    if len(med) == 2:
        spreads = [harness.aa_spread([r["tokens_per_s"] for r in rs]) for rs in ok.values()]
        spread = max((x for x in spreads if x == x), default=harness.NAN)  # 1 run: no spread
        tok = med["on"]["tokens_per_s"] / med["off"]["tokens_per_s"]
        steps = med["on"]["steps_per_s"] / med["off"]["steps_per_s"]
        lines += ["", f"on / off: tokens/s x{tok:.3f}, steps/s x{steps:.3f} "
                      f"({harness.verdict(tok, spread)}: the larger A/A spread is "
                      f"{harness.fmt(spread, '.1%')})"]
    return lines


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="off on, then on off, ...")
    ap.add_argument("--chunk", type=int, default=16, help="--inflight-chunk K of the on arm")
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=512, help="N, the lengths' cap")
    ap.add_argument("--tail-median", type=int, default=32)
    ap.add_argument("--tail-sigma", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--work-dir", default="/tmp/locojax_bench_inflight")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    harness.share_jax_cache(Path(args.work_dir))
    p99 = tail_quantile(args.tail_median, args.tail_sigma, 0.99)
    print(harness.header("bench_inflight", f"async, k {args.max_staleness}, "
                         f"{args.workers} workers + 1 learner host"))
    print(f"# {harness.command_line()}")
    print(f"# workload: demo (embedded tiny, arith), {args.prompts} prompts x {args.group}, "
          f"lengths lognormal median {args.tail_median} sigma {args.tail_sigma} (p99 "
          f"{p99:.0f}) capped at N {args.new_tokens}, exact (ignore-eos); {args.steps} "
          f"steps, the first {args.skip} and the last left out; on: --inflight-chunk "
          f"{args.chunk}", flush=True)
    count = {"off": 0, "on": 0}

    def arm(name: str, address: str):
        def call():
            count[name] += 1
            return run(args, name, count[name], address)
        return call

    with harness.local_ray() as address:
        results = harness.interleave({"off": arm("off", address), "on": arm("on", address)},
                                     args.rounds, how="alternate")
    print("\n".join(["", *report(results, args), f"# load average at end {harness.loads()}"]))
    return 0 if all(all(rs) for rs in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
