"""Host work hidden behind device work and exposed, per step: checkouts side by side.

    python -m benchmarks.host_overlap --sides before=/tmp/before after=. --rounds 2 \
        --steps 2 --beta 0 0.04 -- real-demo --model models/SmolLM2-135M-Instruct

Issue 56 item 1: while the host detokenizes and scores a step's rows, the chip should not
wait if it has work that needs no reward (the reference forward, `train/early.py`), and the
host work itself should be small (one batch decode, one reward thread per batch). A side is
a checkout of locojax (a directory); each run is a child process (`--child`) with that
checkout first on PYTHONPATH, which builds the trainer of the train command line after `--`
(`locojax train`'s own parsing; eval off, run dir in /tmp) and runs one warm-up step (its
compile) and `--steps` timed steps (`Trainer.step`, as the run does, without a checkpoint),
printing each step's `StepTimer` phases as a JSON line. Rounds alternate the order of the
sides, and every β runs in every round. Printed per β and side, medians over every timed
step of every round: the step, the decode and train phases (and `reference`, the wait for
the reference forward dispatched before scoring, where a side has it), the host phases
(`profiler.HOST_PHASES`; `detokenize_reward` apart), and their split into `perf/host_hidden`
and `perf/host_exposed` (a checkout without the split reports none: its host time is all
exposed); then, for each later side, the first side's median over its own: the step, the
host phases and the exposed host time. Each figure is one machine under its load: compare
sides within one run, never across runs (docs/design.md, benchmarks).

`benchmarks/tpu/host_overlap.sh` runs this on one TPU chip at the SmolLM2-135M shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST_PHASES = ("admission", "detokenize_reward", "batch", "env", "metrics")
"""`profiler.HOST_PHASES`, restated: a checkout from before this script may lack some."""
FIELDS = ("step", "decode", "reference", "train", "detokenize_reward", "host", "host_hidden",
          "host_exposed")


def child(steps: int, argv: list[str]) -> None:
    """One run in this process: warm-up step, then `steps` timed steps, one JSON line each."""
    import tyro

    from locojax.profiler import StepTimer
    from locojax.train import wiring
    from locojax.train.config import PRESETS
    from locojax.train.loop import start

    cfg = tyro.extras.overridable_config_cli(PRESETS, args=argv, prog="locojax train")
    trainer = start(cfg, wiring.join("single"))
    for step in range(steps + 1):
        timer = StepTimer()
        metrics = trainer.step(step, timer)
        perf = timer.finish_step()
        phase = {k[len("perf/phase/"):]: v for k, v in perf.items()
                 if k.startswith("perf/phase/")}
        host = sum(phase.get(k, 0.0) for k in HOST_PHASES)
        row = {"step": perf["perf/step_time"], "decode": phase.get("decode", 0.0),
               "train": phase.get("train", 0.0), "reference": phase.get("reference", 0.0),
               "detokenize_reward": phase.get("detokenize_reward", 0.0), "host": host,
               "host_hidden": perf.get("perf/host_hidden", 0.0),
               "host_exposed": perf.get("perf/host_exposed", host),
               "compile": perf["perf/compile_time"], "warmup": step == 0,
               "response_length": metrics.get("rollout/response_length/mean")}
        print("STEP " + json.dumps(row), flush=True)


def scoring(argv: list[str], reps: int = 30) -> None:
    """The host work alone at the run's shape: its first step's prompts, G random completions
    each of N tokens (ids of the tokenizer's ordinary range), detokenized and scored as the
    rollout does, `reps` times; prints the medians (ms) as one JSON line."""
    import numpy as np
    import tyro

    from locojax import tokenizer as tokenizers
    from locojax.envs.rewards import RewardRunner
    from locojax.train.build import RunParts
    from locojax.train.config import PRESETS

    cfg = tyro.extras.overridable_config_cli(PRESETS, args=argv, prog="locojax train")
    parts = RunParts.of(cfg)
    tok, g = parts.tokenizer, cfg.group_size
    rows = cfg.rollout.prompts_per_step * g
    edge = min(256, tok.vocab_size // 4)  # clear of the special ids at either end
    ids = np.random.default_rng(0).integers(edge, tok.vocab_size - edge,
                                            (rows, cfg.rollout.max_new_tokens)).tolist()
    examples = [parts.task.train[i // g] for i in range(rows)]
    runner = RewardRunner(cfg.reward)
    decode_all = getattr(tokenizers, "decode_all", None)  # a checkout before it: row by row
    decode = (lambda: decode_all(tok, ids)) if decode_all else (
        lambda: [tok.decode(r) for r in ids])
    texts = decode()
    times = {"detokenize": [], "reward": []}
    for _ in range(reps):
        for name, fn in (("detokenize", decode),
                         ("reward", lambda: runner.score_batch(parts.task.reward, texts,
                                                               examples))):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    runner.close()
    print("SCORING " + json.dumps({k: statistics.median(v) for k, v in times.items()}),
          flush=True)


def run_side(name: str, checkout: Path, beta: str, steps: int, argv: list[str],
             timeout: float) -> list[dict]:
    """One child run of `checkout` at `beta`; its timed steps (the warm-up dropped)."""
    run_dir = tempfile.mkdtemp(prefix=f"host_overlap_{name}_")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--steps", str(steps),
           "--", *argv, "--algo.beta", beta, "--eval.every", "0", "--no-progress",
           "--no-tensorboard", "--run-dir", run_dir]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(checkout.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])])}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line[5:]) for line in out.stdout.splitlines() if line.startswith("STEP ")]
    if out.returncode or len(rows) != steps + 1:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        raise SystemExit(f"{name} (β {beta}) failed: exit {out.returncode}, {len(rows)} steps")
    print(f"  {name:>8} β {beta}: {time.perf_counter() - t0:.0f} s, step "
          + " ".join(f"{r['step']:.3f}" for r in rows[1:]) + " s, host exposed "
          + " ".join(f"{r['host_exposed'] * 1e3:.1f}" for r in rows[1:]) + " ms", flush=True)
    return rows[1:]


def run_scoring(name: str, checkout: Path, argv: list[str], timeout: float) -> dict:
    """`scoring` in a child process of `checkout`."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--scoring-child", "--", *argv]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join(
        [str(checkout.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("SCORING ")]
    if out.returncode or not lines:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        raise SystemExit(f"{name} scoring failed: exit {out.returncode}")
    row = json.loads(lines[0][len("SCORING "):])
    print(f"  {name:>8} scoring: detokenize {row['detokenize'] * 1e3:.2f} ms, reward "
          f"{row['reward'] * 1e3:.2f} ms", flush=True)
    return row


def summary(results: dict[tuple[str, str], list[dict]], names: list[str], betas: list[str]
            ) -> list[str]:
    """The printed table: medians per (β, side), and each later side's ratios to the first."""
    lines = ["| β | side | " + " | ".join(f"{f} ms" for f in FIELDS) + " |",
             "|---|---|" + "---|" * len(FIELDS)]
    med = {key: {f: statistics.median(r[f] for r in rows) for f in FIELDS}
           for key, rows in results.items()}
    for beta in betas:
        for name in names:
            m = med[(name, beta)]
            lines.append(f"| {beta} | {name} | " + " | ".join(f"{m[f] * 1e3:.1f}" for f in FIELDS)
                         + " |")
    first = names[0]
    for beta in betas:
        for name in names[1:]:
            a, b = med[(first, beta)], med[(name, beta)]
            ratios = ", ".join(f"{f} {a[f] / b[f]:.2f}x" if b[f] > 0 else f"{f} (0)"
                               for f in ("step", "host", "host_exposed"))
            lines.append(f"β {beta}: {first} / {name}: {ratios}")
    return lines


def scoring_rounds(sides: list[tuple[str, Path]], rounds: int, train: list[str],
                   timeout: float) -> int:
    """`--scoring`: each side's host work in every round (order alternating), the medians
    over rounds and the first side's over each later one's."""
    got: dict[str, list[dict]] = {}
    for rnd in range(rounds):
        print(f"round {rnd}", flush=True)
        for name, checkout in (sides if rnd % 2 == 0 else sides[::-1]):
            got.setdefault(name, []).append(run_scoring(name, checkout, train, timeout))
    med = {n: {k: statistics.median(r[k] for r in rows) for k in ("detokenize", "reward")}
           for n, rows in got.items()}
    first = sides[0][0]
    for name in got:
        m = med[name]
        ratio = "" if name == first else "; {} / {}: detokenize {:.2f}x, reward {:.2f}x".format(
            first, name, med[first]["detokenize"] / m["detokenize"],
            med[first]["reward"] / m["reward"])
        print(f"{name}: detokenize {m['detokenize'] * 1e3:.2f} ms, reward "
              f"{m['reward'] * 1e3:.2f} ms{ratio}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, train = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, ["real-demo"])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sides", nargs="+", default=["here=."],
                   help="name=checkout directory, the first is the baseline of the ratios")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="timed steps per run, after a warm-up")
    p.add_argument("--beta", nargs="+", default=["0", "0.04"])
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per child run")
    p.add_argument("--out", default="", help="also write every step's row here (JSON)")
    p.add_argument("--scoring", action="store_true",
                   help="time the host work alone (detokenize, rewards) instead of steps")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scoring-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(ours)
    if args.child or args.scoring_child:
        child(args.steps, train) if args.child else scoring(train)
        return 0
    sides = [(s.split("=", 1)[0], Path(s.split("=", 1)[1])) for s in args.sides]
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# benchmarks/host_overlap.py {' '.join(argv)}\n# {now}, load "
          f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} cores", flush=True)
    if args.scoring:
        return scoring_rounds(sides, args.rounds, train, args.timeout)
    results: dict[tuple[str, str], list[dict]] = {}
    for rnd in range(args.rounds):
        print(f"round {rnd}", flush=True)
        order = sides if rnd % 2 == 0 else sides[::-1]
        for beta in args.beta:
            for name, checkout in order:
                rows = run_side(name, checkout, beta, args.steps, train, args.timeout)
                results.setdefault((name, beta), []).extend(rows)
    lines = summary(results, [n for n, _ in sides], args.beta)
    print("\n".join(lines), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({f"{n} {b}": r for (n, b), r in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
