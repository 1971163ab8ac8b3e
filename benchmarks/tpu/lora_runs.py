"""LoRA's learning and size runs on one accelerator (issue 57; docs/lora.md has the claim).

    python -m benchmarks.tpu.lora_runs --out OUT [sweep] [seeds] [target] [qwen]
                                              # default: sweep seeds qwen
    python -m benchmarks.tpu.lora_runs --out OUT --toy                      # a CPU dry run

OUT gets the logs, results and run directories (small); the converted and random models
and JAX's compilation cache go to --work (default /tmp/lora-work), outside OUT.

Stages, in one process (one chip open, and the programs a run shares with the one before
it, e.g. the three seeds of one setting, come out of JAX's compilation cache):

- `sweep`: `real-demo` with LoRA at each point of docs/lora.md's pre-registered grid,
  seed 100; chooses the point by the registered rule and writes it to OUT/chosen.json;
- `seeds`: `real-demo` full fine-tune and LoRA at the chosen point, seeds 0, 1, 2, and the
  registered verdict;
- `target`: `real-demo` full fine-tune at 4, 8, 16 and 32 prompts a step, seeds 0, 1, 2,
  evaluated every 5 steps until held-out 0.70 (docs/results/tpu_real_model.md's table);
- `qwen`: LoRA GRPO on Qwen3-1.7B's published config with random bf16 weights, 20 steps at
  GSM8K-like shapes, its step time and peak HBM (the plan's and the device's own).

Each run is `Trainer.step` over its steps (`locojax train`'s loop, without the export and
checkpoints), evaluated before step 1 and after the last (`--eval.every` = the steps).
Every result is a line of OUT/results.jsonl; the tables are printed from it at the end,
with the commands' flags, the machine and the commit.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import time

from benchmarks.tpu import random_model

SWEEP = [(8, 1e-4), (8, 5e-4), (32, 1e-4), (32, 5e-4)]
"""(rank, lr), docs/lora.md's grid; alpha = 2 x rank."""
SWEEP_SEED, SEEDS = 100, (0, 1, 2)
QWEN_FLAGS = ["--task.name", "arith", "--task.level", "1", "--rollout.prompts-per-step", "4",
              "--algo.group-size", "4", "--rollout.max-prompt-tokens", "256",
              "--rollout.max-new-tokens", "512", "--rollout.ignore-eos",
              "--rollout.weights-dtype", "bf16", "--rollout.cache-dtype", "bf16",
              "--lora.rank", "16", "--lora.alpha", "32", "--lora.base-dtype", "bfloat16",
              "--optim.lr", "1e-4"]
"""GSM8K-like shapes (the `gsm8k` preset's P 256 and N 512, every completion N long) on the
char tokenizer's arithmetic prompts: random weights make the task irrelevant."""


def run(name: str, args: list[str], out: str, steps: int, evaluate: bool = True,
        every: int = 0, target: float | None = None) -> dict:
    """One run of `locojax train` ARGS (a preset and its flags), `steps` steps, evaluated
    before the first and after the last (`evaluate`), or every `every` steps, stopping at
    the first evaluation at or above `target`; its result (kept in OUT/results.jsonl)."""
    import jax
    import tyro

    from locojax.distributed import HostInfo
    from locojax.profiler import StepTimer
    from locojax.train import loop, wiring
    from locojax.train.config import PRESETS

    done = previous(out, name)
    if done is not None:  # a run made by an earlier call on this machine: kept, not repeated
        print(f"=== {name}: already in results.jsonl, after {done['after']}", flush=True)
        return done
    run_dir = os.path.join(out, "runs", name)
    argv = [*args, "--run-dir", run_dir, "--steps", str(steps), "--eval.every",
            str((every or steps) if evaluate else 0), "--no-progress", "--no-tensorboard"]
    print(f"\n=== {name}: locojax train {' '.join(argv)}", flush=True)
    cfg = tyro.extras.overridable_config_cli(PRESETS, args=argv)
    t0 = time.perf_counter()
    trainer = loop.start(cfg, wiring.Single(HostInfo(process_id=0, num_processes=1)))
    before = trainer.evaluate() if cfg.eval.every else {}
    trainer.rollouts.begin(0, trainer.state.params, None)
    times, phases, evals, last = [], [], [], {}
    for step in range(steps):
        timer = StepTimer()
        last = trainer.step(step, timer)
        perf = timer.finish_step()
        times.append(perf["perf/step_time"])
        phases.append({k[5:]: v for k, v in perf.items() if k.startswith("perf/")})
        print(f"step {step + 1}: {times[-1]:.3f} s", flush=True)  # a cut-off run still tells
        if "eval/accuracy" in last:  # the curve, for the steps-to-target table
            evals.append((step + 1, last["eval/accuracy"], time.perf_counter() - t0))
            if target is not None and last["eval/accuracy"] >= target:
                break
    trainer.lock.release()
    stats = jax.local_devices()[0].memory_stats() or {}
    result = {
        "name": name, "args": argv, "seconds": time.perf_counter() - t0,
        "before": before.get("eval/accuracy"), "after": last.get("eval/accuracy"),
        "format_before": before.get("eval/format_rate"),
        "format_after": last.get("eval/format_rate"),
        "in_format_before": before.get("eval/accuracy_in_format"),
        "in_format_after": last.get("eval/accuracy_in_format"),
        "median_step_s": statistics.median(times[1:] or times), "evals": evals,
        "median_phases_s": {k: statistics.median(p.get(k, 0.0) for p in phases[1:] or phases)
                            for k in phases[0]},
        "plan_peak_bytes": trainer.memory.peak, "plan": trainer.memory.format(),
        "device_peak_bytes": stats.get("peak_bytes_in_use"),
    }
    del trainer
    gc.collect()
    with open(os.path.join(out, "results.jsonl"), "a") as f:
        f.write(json.dumps(result) + "\n")
    print(f"=== {name}: before {result['before']} after {result['after']}, median step "
          f"{result['median_step_s']:.3f} s", flush=True)
    return result


def previous(out: str, name: str) -> dict | None:
    """The result of run `name` if OUT/results.jsonl has it (a stage cut by a call's time
    limit goes on where it stopped)."""
    path = os.path.join(out, "results.jsonl")
    if not os.path.isfile(path):
        return None
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return next((r for r in rows if r["name"] == name), None)


def lora_flags(rank: int, lr: float) -> list[str]:
    return ["--lora.rank", str(rank), "--lora.alpha", str(2 * rank), "--optim.lr", str(lr)]


def choose(points: list[tuple[int, float, float]]) -> tuple[int, float]:
    """The registered rule: highest final accuracy; ties to the smaller rank, then lr."""
    best = max(points, key=lambda p: (p[2], -p[0], -p[1]))
    return best[0], best[1]


def verdict(full: list[float], lora: list[float]) -> str:
    mean = statistics.mean(lora)
    if mean < min(full):
        return f"FAIL: LoRA mean {mean:.3f} < the lowest full seed {min(full):.3f}"
    where = "above the spread" if mean > max(full) else "within the spread"
    return (f"PASS: LoRA mean {mean:.3f} >= the lowest full seed {min(full):.3f} ({where} "
            f"[{min(full):.3f}, {max(full):.3f}])")


def smollm_dir(args) -> str:
    """The real checkpoint, converted once from the GGUF file (`locojax convert`)."""
    path = os.path.join(args.work, "SmolLM2-135M-Instruct")
    if not os.path.isfile(os.path.join(path, "config.json")):
        from locojax.model.gguf_convert import convert

        convert(args.gguf, path)
    return path


def stage_sweep(args, base: list[str], steps: int) -> None:
    points = []
    for rank, lr in SWEEP:
        r = run(f"sweep-r{rank}-lr{lr:g}", [*base, "--seed", str(SWEEP_SEED),
                                            *lora_flags(rank, lr)], args.out, steps)
        points.append((rank, lr, r["after"]))
    rank, lr = choose(points)
    with open(os.path.join(args.out, "chosen.json"), "w") as f:
        json.dump({"rank": rank, "lr": lr, "points": points}, f)
    print(f"chosen: rank {rank}, lr {lr:g}", flush=True)


def stage_seeds(args, base: list[str], steps: int) -> None:
    with open(os.path.join(args.out, "chosen.json")) as f:
        chosen = json.load(f)
    full, lora = [], []
    for seed in SEEDS:
        full.append(run(f"full-s{seed}", [*base, "--seed", str(seed)], args.out,
                        steps)["after"])
    for seed in SEEDS:
        lora.append(run(f"lora-s{seed}", [*base, "--seed", str(seed),
                                          *lora_flags(chosen["rank"], chosen["lr"])],
                        args.out, steps)["after"])
    print(verdict(full, lora), flush=True)


TARGET, TARGET_PROMPTS, TARGET_EVERY = 0.70, (4, 8, 16, 32), 5
"""docs/tpu.md's fixed-quality table: held-out 0.70, evaluated every 5 steps, up to 40."""


def stage_target(args, base: list[str], steps: int) -> None:
    """The steps and the wall time to reach held-out TARGET at each prompts-per-step, seeds
    0-2, G 8 and the rest of `real-demo` held fixed; a run stops at its first evaluation at
    or above TARGET."""
    for prompts in TARGET_PROMPTS:
        for seed in SEEDS:
            run(f"target-p{prompts}-s{seed}", [*base, "--seed", str(seed),
                                               "--rollout.prompts-per-step", str(prompts)],
                args.out, steps, every=TARGET_EVERY, target=TARGET)


def stage_qwen(args) -> None:
    model = random_model.write(args.qwen_config, os.path.join(args.work, "qwen3-1.7b-random"),
                               dtype="bfloat16", tiny=args.toy, vocab=512 if args.toy else None,
                               made_by="benchmarks/tpu/lora_runs.py")
    flags = QWEN_FLAGS
    if args.toy:  # the same flags at a size a CPU runs in seconds
        flags = [{"256": "32", "512": "16"}.get(x, x) for x in flags]
    steps = 2 if args.toy else 20
    run("qwen3-1.7b-lora", ["demo", "--model", model, "--mode", "single", *flags], args.out,
        steps, evaluate=False)


def report(out: str) -> None:
    rows = [json.loads(line) for line in open(os.path.join(out, "results.jsonl"))]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    import jax

    print(f"\nmachine: {jax.devices()[0].device_kind} x {jax.device_count()}; commit {commit}")
    print("| run | held-out before | after | median step (s) | plan peak (GB) | device peak (GB) |")
    print("|---|---|---|---|---|---|")
    gb = lambda b: f"{b / 1e9:.2f}" if b else "-"  # noqa: E731
    for r in rows:
        acc = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        print(f"| {r['name']} | {acc(r['before'])} | {acc(r['after'])} | "
              f"{r['median_step_s']:.3f} | {gb(r['plan_peak_bytes'])} | "
              f"{gb(r['device_peak_bytes'])} |")
    demo_claim([r for r in rows if r["name"].startswith("full-s")])


def demo_claim(rows: list[dict]) -> None:
    """docs/tpu.md's registered check of the real demo's claim on this machine: per seed,
    held-out accuracy and accuracy among in-format replies each up by at least 0.10 within
    30 minutes (the full fine-tune seeds are those runs)."""
    if not rows:
        return
    print("\n| seed run | held-out before -> after | in format before -> after | "
          "accuracy in format before -> after | seconds | verdict |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        in_format = [r["in_format_before"] or 0.0, r["in_format_after"] or 0.0]
        ok = (r["after"] - r["before"] >= 0.10 and in_format[1] - in_format[0] >= 0.10
              and r["seconds"] <= 1800)
        print(f"| {r['name']} | {r['before']:.3f} -> {r['after']:.3f} | "
              f"{r['format_before']:.3f} -> {r['format_after']:.3f} | {in_format[0]:.3f} -> "
              f"{in_format[1]:.3f} | {r['seconds']:.0f} | {'meets' if ok else 'MISSES'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stages", nargs="*", default=["sweep", "seeds", "qwen"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/lora-work", help="models and compilation cache")
    ap.add_argument("--gguf", default="/tmp/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--qwen-config", default=".tpu-data/configs/qwen3-1.7b.json")
    ap.add_argument("--toy", action="store_true",
                    help="dry run: the embedded checkpoint for SmolLM2, 2 steps, 8 held-out "
                         "problems; Qwen3 cut to 2 layers")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.join(args.work, "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    if args.toy:
        base, steps = ["real-demo", "--model", "embedded", "--task.template", "plain",
                       "--eval.num-examples", "8", "--eval.batch-size", "8"], 2
    elif {"sweep", "seeds", "target"} & set(args.stages):  # the qwen stage alone needs no GGUF
        base, steps = ["real-demo", "--model", smollm_dir(args)], 40
    else:
        base, steps = [], 40
    for stage in args.stages:
        if stage == "sweep":
            stage_sweep(args, base, steps)
        elif stage == "seeds":
            stage_seeds(args, base, steps)
        elif stage == "target":
            stage_target(args, base, steps)
        elif stage == "qwen":
            stage_qwen(args)
        else:
            raise SystemExit(f"unknown stage {stage!r}: sweep, seeds, target or qwen")
    report(args.out)


if __name__ == "__main__":
    main()
