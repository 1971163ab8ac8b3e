"""Tunix's GRPO on the real SmolLM2-135M-Instruct: the TRL side-by-side's work, a third side.

The work is `bench_real_trl.SETTINGS` from the same checkpoint (`make real-model`): chat arith
level 0, locojax's prompts in locojax's order, its flexible reward, G, learning rate, β, ε,
temperature, max new tokens and steps, the loss aggregated token-mean (Tunix's
`loss_agg_mode="token-mean"`, TRL's `dapo`). Tunix 0.1.7 loads the checkpoint as its nnx
`Llama3` with one fix (`peers/tunix_real_model.py`: it ignores the config's RoPE θ); the
side runs in Tunix's pinned venv (`peers/install.py`), `peers/tunix_real_worker.py`.

Reported per seed, as `bench_real_trl.py` reports its sides: the mean reward of the first and
last tenth of the steps, held-out greedy accuracy of the start checkpoint and of Tunix's
final model (exported as an HF directory and scored by the same `locojax eval`; `--held-out
-1` skips both), the median step time of the steady steps (from the third), and the peak RSS
of the process. Each run is a whole process, one after another; a ratio against another
side's s/step comes from runs made at other times and loads, and is read with that said.

Usage:
    .venv/bin/python -m benchmarks.bench_real_tunix --seeds 0 --steps 40
    .venv/bin/python -m benchmarks.bench_real_tunix --steps 3 --held-out -1 --no-install
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


from benchmarks import harness
from benchmarks.real_runs import MICRO, SETTINGS, held_out, peak_rss_gb, rewards, step_times, \
    tunix_argv, with_peak_rss
from benchmarks.peers import install

def run_seed(python: Path, model: str, seed: int, steps: int, out: Path, rows: int) -> dict:
    """One seed's Tunix run and its held-out scores (none when rows < 0)."""
    scored = rows >= 0
    base = held_out(model, seed, out / f"base-{seed}.jsonl", rows) if scored else None
    run_dir = out / f"tunix-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    log = out / f"tunix-{seed}.log"
    argv = tunix_argv(python, model, seed, steps, run_dir)
    if scored:
        argv += ["--export", str(run_dir / "final_model")]
    code, tail = harness.run_logged(with_peak_rss(argv), log, timeout=4 * 3600)
    if code:
        raise RuntimeError(f"tunix seed {seed} failed ({code}):\n{tail}")
    final = held_out(str(run_dir / "final_model"), seed, out / f"tunix-{seed}-final.jsonl",
                     rows) if scored else None
    r = rewards(run_dir)
    tenth = max(1, len(r) // 10)
    return dict(seed=seed, side="tunix", base=base, final=final,
                first=sum(r[:tenth]) / tenth, last=sum(r[-tenth:]) / tenth,
                step_s=harness.median(step_times(run_dir, "metrics.jsonl")[2:]),
                rss=peak_rss_gb(log), run_dir=str(run_dir))


def report(results: list[dict]) -> None:
    def score(r: dict, key: str) -> str:
        return "n/a" if r["base"] is None else f"{r['base'][key]:.3f} -> {r['final'][key]:.3f}"

    print()
    for line in harness.table(
            ["seed", "side", "reward first/last tenth", "held-out before -> after",
             "acc. in format before -> after", "s/step", "peak RSS GB"],
            [[r["seed"], r["side"], f"{r['first']:.3f} / {r['last']:.3f}",
              score(r, "accuracy"), score(r, "accuracy_in_format"),
              harness.fmt(r["step_s"], ".2f"), harness.fmt(r["rss"], ".2f")]
             for r in results]):
        print(line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--held-out", type=int, default=0,
                    help="score only the first this many held-out problems (0: all 200; "
                         "-1: no scoring, no export)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-real-tunix"))
    ap.add_argument("--no-install", action="store_true", help="use only an existing Tunix venv")
    args = ap.parse_args(argv)
    print(harness.header("bench_real_tunix", f"settings {json.dumps(SETTINGS)} "
                                             f"micro {json.dumps(MICRO)}"))
    peer = install.PEERS["tunix"]
    if args.no_install and not install.is_ready(peer):
        print("Tunix's venv is not installed (drop --no-install)", file=sys.stderr)
        return 2
    if not Path(args.model, "config.json").is_file():
        print(f"no checkpoint at {args.model}: make real-model", file=sys.stderr)
        return 2
    python = install.install(peer)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        results.append(run_seed(python, args.model, seed, args.steps, args.out, args.held_out))
        # written after every run, so a seed that finished survives one that fails later
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        print(f"seed {seed} tunix: done, load {harness.loads()}", flush=True)
    report(results)
    print(f"\nload at the end {harness.loads()}; results {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
