"""Held-out accuracy against wall time and steps: GRPO, + dynamic sampling, + curation, both.

Every run is a real `locojax train` run, started as `locojax demo` starts it (by default 2
colocated local hosts, `locojax launch --hosts 2 -- train demo ...`), from a checkpoint that
already writes the `#### N` answer line, so that a gain is arithmetic, not format. All arms
get the same wall-clock budget (`--time-limit-s`: the trainer stops after the first step
that ends past it, evaluates and saves; `--steps` is only a cap), and evaluate greedily on
the same held-out problems every `--eval-every` steps.

Arms (flags added to the common ones):
    grpo          the demo preset as it is
    grpo+ds       + dynamic sampling: zero-variance groups refilled, up to --ds-rounds rounds
    grpo+cur      + pass-rate curation: always/never-solved prompts held back
    grpo+ds+cur   both
Runs are interleaved (seed-major: every arm of seed 0, then of seed 1, ...) so machine load
hits all arms alike, and with `--lock` each run takes the shared heavy-job lock on its own
(released between runs). The load average is recorded before and after each run: a
wall-clock budget measured under load is pessimistic for the arm, not flattering.

Output: a markdown table (accuracy at the start, at equal wall-time marks and at the end;
gain per seed; steps; process wall time), OUT/results.json, and OUT/learning.png (accuracy
against trainer seconds and against steps, mean per arm over seeds, each seed faint).
The x axis "seconds" is `perf/elapsed_s`, counted from the trainer's start (model load,
compile and start-up included; the ~5 s of Python and JAX imports before it are not, but the
process wall time in the table includes them).

Usage:
    .venv/bin/python -m benchmarks.bench_learning --model DIR --lock /tmp/locojax-heavy.lock
    .venv/bin/python -m benchmarks.bench_learning --model DIR --arms grpo grpo+ds --seeds 0 \
        --time-limit-s 120                                   # a screening run
    .venv/bin/python -m benchmarks.bench_learning --report OUT   # re-print a finished run
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


from benchmarks import harness
from benchmarks.harness import CLI
ARMS = ("grpo", "grpo+ds", "grpo+cur", "grpo+ds+cur")


def arm_flags(arm: str, args) -> list[str]:
    flags = []
    if "+ds" in arm:
        flags += ["--dynamic.max-rounds", str(args.ds_rounds)]
    if "+cur" in arm:
        flags += ["--curation.enabled", "--curation.readmit-after", str(args.readmit_after)]
    return flags


def command(arm: str, seed: int, run_dir: Path, args) -> list[str]:
    train = ["train", "demo", "--model", args.model, "--seed", str(seed), "--run-dir",
             str(run_dir), "--steps", str(args.max_steps), "--time-limit-s",
             str(args.time_limit_s), "--eval.every", str(args.eval_every), "--no-progress",
             "--no-tensorboard", "--mode", args.mode, *arm_flags(arm, args),
             *shlex.split(args.train_args)]
    if args.mode == "colocated":
        return [*CLI, "launch", "--hosts", str(args.hosts), "--", *train]
    return [*CLI, *train]


@contextlib.contextmanager
def heavy_lock(path: str):
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_run(run_dir: Path) -> dict:
    """Evaluations (step, trainer seconds, accuracy) and the run's step count and speed."""
    metrics = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]
    perf = {r["step"]: r for r in (json.loads(x) for x in open(run_dir / "perf.jsonl"))}
    evals = [(r["step"], 0.0 if r["step"] == 0 else perf[r["step"]]["perf/elapsed_s"],
              r["eval/accuracy"]) for r in metrics if "eval/accuracy" in r]
    steps = max(perf)
    step_times = sorted(p["perf/step_time"] for p in perf.values())
    refill = [r.get("rollout/refill/replaced", 0.0) for r in metrics if r["step"] > 0]
    zero = [r["rollout/frac_zero_std"] for r in metrics if "rollout/frac_zero_std" in r]
    filt = [r.get("curation/frac_filtered", 0.0) for r in metrics if r["step"] > 0]
    return {"evals": evals, "steps": steps, "median_step_s": step_times[len(step_times) // 2],
            "refilled_per_step": statistics.mean(refill) if refill else 0.0,
            "frac_zero_std": statistics.mean(zero) if zero else 0.0,
            "frac_filtered": statistics.mean(filt) if filt else 0.0}


def acc_at(evals, t: float) -> float:
    """Accuracy of the last evaluation at or before trainer second t."""
    return [a for _, s, a in evals if s <= t][-1]


def run_all(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"config": vars(args), "runs": []}
    for seed in args.seeds:
        for arm in args.arms:
            run_dir = out / arm / f"seed{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            cmd = command(arm, seed, run_dir, args)
            with heavy_lock(args.lock):
                load_before = harness.load()
                t0 = time.monotonic()
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
                wall = time.monotonic() - t0
                load_after = harness.load()
            (run_dir / "stdout.txt").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                sys.exit(f"run failed ({proc.returncode}): {shlex.join(cmd)}\n"
                         f"{proc.stderr[-3000:]}")
            run = {"arm": arm, "seed": seed, "cmd": shlex.join(cmd), "wall_s": wall,
                   "load": [load_before, load_after], **read_run(run_dir)}
            results["runs"].append(run)
            ev = run["evals"]
            print(f"{arm:<12} seed {seed}: {ev[0][2]:.3f} -> {ev[-1][2]:.3f} in "
                  f"{run['steps']} steps, {wall:.0f} s wall, load {load_before:.1f}/"
                  f"{load_after:.1f}", flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


def report(results: dict, out: Path) -> str:
    runs, cfg = results["runs"], results["config"]
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    limit = cfg["time_limit_s"]
    marks = [round(limit * f) for f in (0.25, 0.5, 0.75)]
    head = ["arm", "start", *(f"@{m} s" for m in marks), "end", "gain per seed", "min gain",
            "steps", "s/step", "wall s", "refilled/step", "zero-std", "filtered", "load"]
    lines = [f"time limit {limit:.0f} s per run (trainer clock), mode {cfg['mode']}"
             + (f" x {cfg['hosts']} hosts" if cfg["mode"] == "colocated" else "")
             + f", model {cfg['model']}, seeds {cfg['seeds']}, extra: {cfg['train_args']!r}",
             "", *harness.table(head, [arm_row([r for r in runs if r["arm"] == arm], marks)
                                       for arm in arms])]
    text = "\n".join(lines)
    plot(results, out / "learning.png")
    return text


def arm_row(rs: list[dict], marks: list[int]) -> list[str]:
    """One arm's accuracies (start, at the marks, end), gains and run figures, means over
    its seeds."""
    mean = statistics.mean
    gains = [r["evals"][-1][2] - r["evals"][0][2] for r in rs]
    return [rs[0]["arm"], f"{mean([r['evals'][0][2] for r in rs]):.3f}",
            *(f"{mean([acc_at(r['evals'], m) for r in rs]):.3f}" for m in marks),
            f"{mean([r['evals'][-1][2] for r in rs]):.3f}", ", ".join(f"{g:+.3f}" for g in gains),
            f"{min(gains):+.3f}", f"{mean([r['steps'] for r in rs]):.0f}",
            f"{mean([r['median_step_s'] for r in rs]):.2f}",
            f"{mean([r['wall_s'] for r in rs]):.0f}",
            f"{mean([r['refilled_per_step'] for r in rs]):.1f}",
            f"{mean([r['frac_zero_std'] for r in rs]):.2f}",
            f"{mean([r['frac_filtered'] for r in rs]):.2f}",
            f"{min(r['load'][0] for r in rs):.1f}-{max(r['load'][1] for r in rs):.1f}"]


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs = results["runs"]
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for color, arm in zip(("tab:gray", "tab:blue", "tab:green", "tab:red"), arms):
        rs = [r for r in runs if r["arm"] == arm]
        for r in rs:
            s, t, a = zip(*r["evals"])
            axes[0].plot(t, a, color=color, alpha=0.25, lw=1)
            axes[1].plot(s, a, color=color, alpha=0.25, lw=1)
        grid = np.linspace(0, results["config"]["time_limit_s"], 50)
        axes[0].plot(grid, [np.mean([acc_at(r["evals"], g) for r in rs]) for g in grid],
                     color=color, lw=2, label=arm)
        steps = sorted({s for r in rs for s, _, _ in r["evals"]})
        means = [np.mean([a for r in rs for s2, _, a in r["evals"] if s2 == s]) for s in steps]
        axes[1].plot(steps, means, color=color, lw=2, label=arm)
    axes[0].set_xlabel("trainer seconds")
    axes[1].set_xlabel("steps")
    axes[0].set_ylabel("held-out accuracy (greedy)")
    axes[0].legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="embedded-strict", help="a checkpoint that writes `#### N`")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--time-limit-s", type=float, default=280.0)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--mode", default="colocated", choices=("single", "colocated"))
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ds-rounds", type=int, default=2)
    p.add_argument("--readmit-after", type=int, default=50)
    p.add_argument("--train-args", default="", help="more `train demo` flags, for every arm")
    p.add_argument("--lock", default="", help="take this flock file around each run")
    p.add_argument("--out", default="runs/bench_learning")
    p.add_argument("--report", default="", help="print the table of a finished OUT and exit")
    args = p.parse_args()
    if args.report:
        out = Path(args.report)
        print(report(json.loads((out / "results.json").read_text()), out))
        return
    print(harness.command_line())
    print(harness.header("bench_learning"))
    results = run_all(args)
    print()
    print(report(results, Path(args.out)))
    print(f"plot: {Path(args.out) / 'learning.png'}")


if __name__ == "__main__":
    main()
