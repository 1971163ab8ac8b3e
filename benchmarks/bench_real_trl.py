"""The same learning as TRL, side by side, on the real SmolLM2-135M-Instruct.

Both sides run the `real-demo` work from the same checkpoint (`make real-model`): chat
arith level 0, the same prompts in the same order (TRL's side takes locojax's prompt stream
and reward function, `peers/trl_real_worker.py`), G, learning rate, β, ε, temperature,
max new tokens and steps (`SETTINGS`), and the loss aggregated as TRL's default `dapo`
(token-mean over the batch; locojax `--algo.loss-agg token-mean`), group rewards scaled by
their std on both. Each run is a whole process (locojax single mode; TRL with torch on every
core), run one after another, seed-major (every side of seed 0, then of seed 1, ...), so a
change in the machine's load falls on both.

Reported per seed and side: the mean reward of the first and last tenth of the steps, held-out
greedy accuracy of the start checkpoint and of the final model (the same `locojax eval`
on both sides' exports, format rate and accuracy in format beside it), the median step time
of the steady steps, the peak RSS of the process, and the locojax step's share of this
machine's roofline: its decode steps' weight bytes at the measured memory bandwidth, its
train step's FLOPs (3 × forward, every trained position) at the measured matmul peak.
The per-step reward curves go to OUT/<side>-<seed>/metrics.jsonl (`locojax plot` overlays
them). Those step times are from whole runs made one after another; `--speed-rounds R`
times the step alone, from R rounds of short runs of both sides interleaved in alternating
order, and prints that ratio with the machine's roofline share.

Usage:
    .venv/bin/python -m benchmarks.bench_real_trl --seeds 0 1 2          # the full table
    .venv/bin/python -m benchmarks.bench_real_trl --steps 2 --sides locojax --held-out 16
    .venv/bin/python -m benchmarks.bench_real_trl --speed-rounds 2 --steps 6 \
        --sides locojax trl tunix                                              # the ratios
    .venv/bin/python -m benchmarks.bench_real_trl --work gsm8k --speed-rounds 1 --steps 3

`--work gsm8k` (with `--speed-rounds` only) times issue 56 item 5's longer completions
instead: GSM8K prompts in the chat template, 8 prompts x G 4, exactly 128 new tokens (EOS
ignored by locojax, suppressed in TRL), locojax in single mode (`real_runs.gsm8k_settings`;
`--data`, `--prompts`, `--group`, `--new-tokens`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path


from benchmarks import harness
from benchmarks.peers import install
from benchmarks.real_runs import BLOCK, GSM8K_DATA, SETTINGS, block_means, gsm8k_settings, \
    held_out, locojax_argv, peak_rss_gb, rewards, step_times, trl_argv, tunix_argv, \
    with_peak_rss

def roofline(run_dir: Path, model: str, bandwidth: float, peak: float,
             s: dict = SETTINGS) -> str:
    """The locojax step's decode and train time against their ideal at this machine's
    measured bandwidth and matmul peak (median of the steady steps), and the train phase's
    tokens/s: every position it computes, and the real (useful) ones among them."""
    from locojax.model import loader

    cfg = loader.load_config(model)
    rows = harness.read_steps(run_dir / "perf.jsonl")
    steady = [rows[k] for k in sorted(rows)[2:]]
    weight_bytes = 4 * cfg.num_params()  # f32: what each decode step reads at least once
    decode = harness.median([r["perf/phase/decode"] for r in steady])
    train = harness.median([r["perf/phase/train"] for r in steady])
    rows_per_step = s["prompts_per_step"] * s["group_size"]
    # The step computes its batch cut to a bucket (`locojax/rl/buckets.py`), P + N columns
    # at most; a run from before the cut logged no width (and then P is a number: `auto`
    # came with the cut).
    widths = [r["perf/train_columns"] for r in steady if "perf/train_columns" in r]
    positions = (int(harness.median(widths)) if widths else
                 s["max_prompt_tokens"] + s["max_new_tokens"])
    # The body runs at every position; the LM head only where a response token's logprob is
    # read (N positions a row at most), as the train step computes it. 3 x: forward and
    # backward.
    head = 2 * cfg.hidden_size * cfg.vocab_size
    body = sum(cfg.flops_per_token(t) - head for t in range(positions))
    train_flops = 3 * rows_per_step * (body + min(s["max_new_tokens"], positions) * head)
    ideal_decode = s["max_new_tokens"] * weight_bytes / bandwidth
    tokens = [(r.get("perf/train_tokens_per_s", harness.NAN),
               r.get("perf/train_real_tokens_per_s", harness.NAN)) for r in steady]
    return (f"decode {decode:.2f} s/step, ideal {ideal_decode:.2f} s "
            f"({harness.fmt(ideal_decode / decode, '.0%')} of the bandwidth roofline); train "
            f"{train:.2f} s/step at {positions} columns, {train_flops / 1e12:.2f} TFLOP "
            f"({harness.fmt(train_flops / peak / train, '.0%')} of the matmul peak), "
            f"{harness.fmt(harness.median([t for t, _ in tokens]), '.0f')} tokens/s of which "
            f"useful {harness.fmt(harness.median([u for _, u in tokens]), '.0f')}")


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--held-out", type=int, default=0,
                    help="score only the first this many held-out problems (0: all 200)")
    ap.add_argument("--sides", nargs="+", default=["locojax", "trl"],
                    choices=["locojax", "trl", "tunix"],
                    help="tunix: with --speed-rounds only (its learning run is "
                         "bench_real_tunix.py)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-real-trl"))
    ap.add_argument("--locojax-flags", default="",
                    help="more `locojax train` flags for the locojax side, e.g. "
                         "'--optim.hf-padding-idx' (TRL's embedding pad row); recorded in "
                         "results.json")
    ap.add_argument("--no-install", action="store_true", help="use only an existing TRL venv")
    ap.add_argument("--trl-device", choices=["cpu", "cuda"], default="cpu",
                    help="where TRL runs (locojax runs on JAX's default backend); the "
                         "learning curves compare across devices, the step times do not")
    ap.add_argument("--report-only", action="store_true",
                    help="print the tables of the runs in --out again, without running")
    ap.add_argument("--speed-rounds", type=int, default=0,
                    help="time the step only: this many rounds of one --steps run per side, "
                         "in alternating order (A B, B A, ...), no held-out scoring")
    ap.add_argument("--work", choices=["real-demo", "gsm8k"], default="real-demo",
                    help="gsm8k: issue 56 item 5's longer completions (--speed-rounds only)")
    ap.add_argument("--data", default=GSM8K_DATA, help="--work gsm8k: the training rows")
    ap.add_argument("--prompts", type=int, default=8, help="--work gsm8k: prompts a step")
    ap.add_argument("--group", type=int, default=4, help="--work gsm8k: G")
    ap.add_argument("--new-tokens", type=int, default=128,
                    help="--work gsm8k: every completion's length (EOS ignored/suppressed)")
    args = ap.parse_args(argv)
    args.extra = tuple(shlex.split(args.locojax_flags))  # the locojax side's extra flags
    args.settings = (SETTINGS if args.work == "real-demo" else
                     gsm8k_settings(args.data, args.prompts, args.group, args.new_tokens))
    return args


def main(argv=None) -> int:
    args = parse(argv)
    print(harness.header("bench_real_trl", f"settings {json.dumps(args.settings)}"))
    if args.report_only:
        results = json.loads((args.out / "results.json").read_text())
        report(results)
        print_roofline(results, args.model)
        return 0
    if args.work == "gsm8k" and (not args.speed_rounds or "tunix" in args.sides):
        print("--work gsm8k times the step only (--speed-rounds R), of locojax and TRL "
              "(the held-out scoring and Tunix's worker run the real demo's arith)",
              file=sys.stderr)
        return 2
    if not Path(args.model, "config.json").is_file():
        print(f"no checkpoint at {args.model}: make real-model", file=sys.stderr)
        return 2
    if "tunix" in args.sides and not args.speed_rounds:
        print("--sides tunix times the step only (--speed-rounds R); Tunix's learning run "
              "is benchmarks/bench_real_tunix.py", file=sys.stderr)
        return 2
    pythons = {}
    for side, name in (("trl", "TRL"), ("tunix", "Tunix")):
        if side in args.sides:
            peer = install.PEERS[side]
            if args.no_install and not install.is_ready(peer):
                print(f"{name}'s venv is not installed (drop --no-install)", file=sys.stderr)
                return 2
            pythons[side] = install.install(peer)
    python = pythons.get("trl")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.speed_rounds:
        return speed(args, pythons)
    results = earlier_results(args.out / "results.json", args.seeds, args.sides)
    for seed in args.seeds:
        base = held_out(args.model, seed, args.out / f"base-{seed}.jsonl", args.held_out)
        for side in args.sides:
            run_dir = args.out / f"{side}-{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            argv_ = (locojax_argv(args.model, seed, args.steps, run_dir, args.eval_every,
                                  args.extra)
                     if side == "locojax" else trl_argv(python, args.model, seed, args.steps,
                                                        run_dir, args.trl_device))
            log = args.out / f"{side}-{seed}.log"
            code, tail = harness.run_logged(with_peak_rss(argv_), log, timeout=4 * 3600)
            if code:
                raise RuntimeError(f"{side} seed {seed} failed ({code}):\n{tail}")
            final = held_out(str(run_dir / "final_model"), seed,
                             args.out / f"{side}-{seed}-final.jsonl", args.held_out)
            r = rewards(run_dir)
            tenth = max(1, len(r) // 10)
            times = step_times(run_dir, "perf.jsonl" if side == "locojax" else "metrics.jsonl")
            results.append(dict(seed=seed, side=side, base=base, final=final,
                                first=sum(r[:tenth]) / tenth, last=sum(r[-tenth:]) / tenth,
                                rewards=r,
                                step_s=harness.median(times[2:]), rss=peak_rss_gb(log),
                                run_dir=str(run_dir), device=args.trl_device,
                                flags=args.locojax_flags if side == "locojax" else ""))
            # written after every run, so a seed that finished survives one that fails later
            (args.out / "results.json").write_text(json.dumps(results, indent=1))
            print(f"seed {seed} {side}: done, load {harness.loads()}", flush=True)
    report(results)
    print_roofline(results, args.model)
    print(f"\nload at the end {harness.loads()}; results {args.out / 'results.json'}")
    return 0


STEADY_FROM = {"real-demo": 2, "gsm8k": 1}
"""The first steady step (0-based) of a --speed-rounds run: the real demo's second step
still warms up (its runs are 6+ steps of seconds); at GSM8K's longer completions a run is a
few steps of minutes, and only the first holds TRL's warm-up (locojax's compile is out of
every step's time already: `perf/compile_time`)."""


def speed_run(args, pythons: dict[str, Path], side: str, seed: int) -> dict:
    """One --steps run of `side` on args.settings, under GNU time: its steps' seconds, the
    median of its steady ones, its first apart, its compile (locojax), its peak RSS."""
    run_dir = args.out / f"speed-{side}-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    if side == "locojax":
        argv_ = locojax_argv(args.model, seed, args.steps, run_dir, 0, args.extra, args.settings)
    elif side == "trl":
        argv_ = trl_argv(pythons["trl"], args.model, seed, args.steps, run_dir, args.trl_device,
                         args.settings)
    else:  # its micro-batches and departures: bench_real_tunix.py
        argv_ = tunix_argv(pythons["tunix"], args.model, seed, args.steps, run_dir)
    log = args.out / f"speed-{side}-{seed}.log"
    code, tail = harness.run_logged(with_peak_rss(argv_), log, timeout=4 * 3600)
    if code:
        raise RuntimeError(f"{side} seed {seed} failed ({code}):\n{tail}")
    perf = "perf.jsonl" if side == "locojax" else "metrics.jsonl"
    times = step_times(run_dir, perf)
    rows = harness.read_steps(run_dir / perf).values()
    compile_s = sum(r.get("perf/compile_time", 0.0) for r in rows)
    lengths = [r["completions/mean_length"] for r in rows if "completions/mean_length" in r]
    out = dict(step_s=harness.median(times[STEADY_FROM[args.work]:]), first_s=times[0],
               steps_s=times, compile_s=compile_s, rss=peak_rss_gb(log), mean_length=lengths)
    print(f"{side}: steps {' '.join(f'{t:.2f}' for t in times)} s, compile {compile_s:.1f} s, "
          f"peak RSS {harness.fmt(out['rss'], '.2f')} GB"
          + (f", mean length {' '.join(f'{x:.1f}' for x in lengths)}" if lengths else "")
          + f", load {harness.loads()}", flush=True)
    return out


def speed(args, pythons: dict[str, Path]) -> int:
    """The step-time ratio from runs interleaved on this machine: each round runs every side
    once for --steps steps (seed --seeds[0], the same work as the table's runs, no
    evaluation), the order reversed every other round, so a drift in the machine's load
    falls on both sides alike. Each run's time is the median of its steady steps
    (`STEADY_FROM`); the first step is printed apart: TRL's and Tunix's hold their compile
    and warm-up, locojax's profiler already leaves its compile out of every step."""
    seed = args.seeds[0]
    runs = harness.interleave(
        {side: (lambda side=side: speed_run(args, pythons, side, seed)) for side in args.sides},
        args.speed_rounds, how="alternate")
    print()
    for line in harness.table(
            ["round", *[f"{s} s/step (first step)" for s in runs],
             *[f"{s} peak RSS GB" for s in runs]],
            [[r, *[f"{runs[s][r]['step_s']:.2f} ({runs[s][r]['first_s']:.1f})" for s in runs],
              *[harness.fmt(runs[s][r]["rss"], ".2f") for s in runs]]
             for r in range(args.speed_rounds)]):
        print(line)
    if "locojax" in runs:
        peak, bw, _ = harness.rates()
        last = roofline(args.out / f"speed-locojax-{seed}", args.model, bw, peak, args.settings)
        print(f"locojax, last round: {last}")
    med = {side: harness.median([r["step_s"] for r in rs]) for side, rs in runs.items()}
    for peer, name in (("trl", "TRL"), ("tunix", "Tunix")):
        if "locojax" not in med or peer not in med or (peer == "trl"
                                                       and args.trl_device != "cpu"):
            continue
        per_round = [harness.ratio(p["step_s"], j["step_s"])
                     for p, j in zip(runs[peer], runs["locojax"])]
        ratio = harness.ratio(med[peer], med["locojax"])
        rounds = ", ".join(harness.fmt(x, ".2f") for x in per_round)
        print(f"{name} s/step / locojax s/step = {harness.fmt(ratio, '.2f')} (medians over "
              f"{args.speed_rounds} interleaved rounds; per round {rounds})")
    (args.out / "speed.json").write_text(json.dumps(dict(
        seed=seed, steps=args.steps, work=args.work, settings=args.settings, runs=runs),
        indent=1))
    print(f"load at the end {harness.loads()}; results {args.out / 'speed.json'}")
    return 0


def earlier_results(path: Path, seeds: list[int], sides: list[str]) -> list[dict]:
    """The runs already in results.json that this invocation does not redo, so seeds run in
    separate invocations (40 minutes each) end up in one table."""
    if not path.is_file():
        return []
    return [r for r in json.loads(path.read_text())
            if not (r["seed"] in seeds and r["side"] in sides)]


def print_roofline(results: list[dict], model: str) -> None:
    """This machine's bandwidth and matmul peak, measured now, and each locojax run's share."""
    if not any(r["side"] == "locojax" for r in results):
        return
    peak, bw, origin = harness.rates()
    print(f"\nmachine: {bw / 1e9:.1f} GB/s, {peak / 1e9:.0f} GFLOP/s ({origin})")
    for r in results:
        if r["side"] == "locojax" and r.get("device", "cpu") == "cpu":  # this machine's
            print(f"seed {r['seed']} locojax: {roofline(Path(r['run_dir']), model, bw, peak)}")


def side_label(r: dict) -> str:
    """The side, its extra flags (`--locojax-flags`), and where a run was not on this
    benchmark's CPU (`--trl-device cuda`)."""
    side = r["side"] + (f" {r['flags']}" if r.get("flags") else "")
    device = r.get("device", "cpu")
    return side if device == "cpu" else f"{side} ({device})"


def report(results: list[dict]) -> None:
    print()
    for line in harness.table(
            ["seed", "side", "reward first/last tenth", "held-out before -> after",
             "in format after", "acc. in format before -> after", "s/step", "peak RSS GB"],
            [[r["seed"], side_label(r), f"{r['first']:.3f} / {r['last']:.3f}",
              f"{r['base']['accuracy']:.3f} -> {r['final']['accuracy']:.3f}",
              f"{r['final']['format_rate']:.3f}",
              f"{r['base']['accuracy_in_format']:.3f} -> {r['final']['accuracy_in_format']:.3f}",
              harness.fmt(r["step_s"], ".2f"), harness.fmt(r["rss"], ".2f")]
             for r in results]):
        print(line)
    by = {(r["seed"], r["side"]): r for r in results}
    for seed in sorted({r["seed"] for r in results}):
        if (seed, "trl") in by and (seed, "locojax") in by:
            if by[seed, "trl"].get("device", "cpu") != "cpu":
                print(f"seed {seed}: ran on a GPU host; its step times are not compared")
                continue
            ratio = harness.ratio(by[seed, "trl"]["step_s"], by[seed, "locojax"]["step_s"])
            print(f"seed {seed}: TRL s/step / locojax s/step = {harness.fmt(ratio, '.2f')} "
                  "(runs one after another)")
    report_blocks(results)


def report_blocks(results: list[dict]) -> None:
    """Mean reward per block of steps, each run and each side's mean over its seeds, and each
    side's held-out accuracy after training over its seeds: mean and range."""
    runs = [r for r in results if r.get("rewards")]
    if not runs:
        return
    sides = sorted({side_label(r) for r in runs})
    blocks = [block_means(r["rewards"]) for r in runs]  # in the order of `runs`
    width = min(len(b) for b in blocks)
    if not width:  # runs shorter than one block
        return
    head = ["seed", "side"] + [f"steps {i * BLOCK + 1}-{(i + 1) * BLOCK}" for i in range(width)]
    rows = [[r["seed"], side_label(r)] + [f"{x:.3f}" for x in b[:width]]
            for r, b in zip(runs, blocks)]
    for side in sides:
        mine = [b for r, b in zip(runs, blocks) if side_label(r) == side]
        rows.append(["mean", side] + [f"{sum(b[i] for b in mine) / len(mine):.3f}"
                                      for i in range(width)])
    print(f"\nmean reward per block of {BLOCK} steps:")
    for line in harness.table(head, rows):
        print(line)
    for side in sides:
        acc = [r["final"]["accuracy"] for r in runs if side_label(r) == side]
        print(f"{side}: held-out after, {len(acc)} seeds: mean {sum(acc) / len(acc):.3f}, "
              f"range {min(acc):.3f}-{max(acc):.3f}")


if __name__ == "__main__":
    sys.exit(main())
