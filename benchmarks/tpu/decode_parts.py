"""Where a decode token step's time goes, by timing its parts apart (issue 56 item 2).

    python -m benchmarks.tpu.decode_parts --config CONFIG.json --rows 64 --prompt P
        [--n1 32] [--n2 96] [--layers 1 2 ...] [--arms default cpu] [--rounds 3]
        [--reps 20] [--out DIR] [--toy]

On one v5e a SmolLM2-135M token step at 64 rows took 4.90 ms where its bytes take 0.47 ms,
a Qwen3-0.6B one 7.77 ms where they take 3.18 ms: both ~4.4 ms beyond their bytes
(docs/results/tpu_decode.md). `jax.profiler` traces have killed the process on that chip,
so this attributes the time by timing, one program per part, each the engine's own code
at its own shapes (decode_parts_programs.py):
- step: the token step as the engine runs it, a generate of N2 tokens minus one of N1
  (every row's limit N1 or N2 under max_new_tokens N2: one prefill and one decode program
  for both), over N2 - N1, as decode_profile.py times it;
- iteration: the engine's decode program stopped after one loop iteration a call;
- forward_L: one cached forward of one token through L layers (`decoder.forward`: embed,
  the layer scan, the final norm) at the cache's `mid` written slots (P + (N1 + N2) / 2),
  at the model's L and at fewer layers (the stacked weights and the cache sliced), for a
  per-layer slope and an intercept; forward_L_block1: the model's L with one slot written;
- logits, sample_t1, sample_greedy: the logits matmul alone and with the sampler
  (`sample_with_logprobs`, temperature 1.0 and greedy) on [rows, vocab];
- stream: a bf16 buffer summed, the chip's read bandwidth as a program sees it;
- derived, stated as differences: rest = step - forward_L - sample_t1 (the loop's
  bookkeeping and whatever the parts do differently inside it), sampler_t1 = sample_t1 -
  logits, kv_reads = forward_L - forward_L_block1, dispatch = iteration - step.
Every part is compiled and run once first, then `--rounds` rounds run every part in turn
(a part blocks until ready); medians are printed, and saved after every round (DIR/
decode_parts.json), so a crash keeps the rounds before it. Each part's share is its least
bytes' time at `--bandwidth` GB/s and at the stream's measured rate over its ms.
Arms: "default" (the engine's knobs by backend) first, then "cpu" (XLA:CPU's decode
knobs, set as decode_profile's `set_arm` does, with `jax.clear_caches()`), if asked.

Chip time (an estimate, not measured): per arm 11 programs, 2 of them a generate's
(~8 s a pair on the v5e: decode_profile's compile rounds, 15-18 s for two generates) and
4 layer scans (~3 s each) -> ~25 s of compiles; a Qwen3-0.6B round ~1.8 s (two generates
~1 s, 4 x 20 forwards ~0.5 s, the rest ~0.3 s), SmolLM2 ~0.8 s; with 3 rounds and the
start, ~45 s (Qwen3) and ~35 s (SmolLM2) for the default arm; the cpu arm recompiles and
runs slower steps (Qwen3's 23 ms): ~60 s and ~40 s. Both configs, both arms: ~180 s.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks.tpu import decode_parts_programs as programs
from benchmarks.tpu.token_step import CPU_KNOBS, DEFAULT_KNOBS, DTYPES, random_decoder, set_knobs
from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig

# decode_profile.py's arms "default" and "cpu" (a script: not imported, house rule).
ARMS = {"default": DEFAULT_KNOBS, "cpu": CPU_KNOBS}


DERIVED_NOTES = {
    "step": "generate N2 - generate N1, over N2 - N1: the engine's token step",
    "rest": "step - forward_L - sample_t1: the loop's bookkeeping and the parts' difference "
            "inside it",
    "sampler_t1": "sample_t1 - logits: the sampler at temperature 1.0",
    "kv_reads": "forward_L - forward_L_block1: attention's reads of the written slots",
    "dispatch": "iteration - step: a call's launch beyond a loop iteration"}


def set_arm(name: str) -> None:
    set_knobs(ARMS[name])


ROUND_LINE = ("step", "iteration", "rest", "sample_t1")
"""What each round's line prints of the medians so far, with forward_L (the table follows
the rounds)."""


def build_parts(cfg, weights, shape, args, failed: dict, compile_s: dict):
    """Every part of one arm, in the order they run (the generates first: the cache they
    leave is the one the forwards slice). A builder that fails is reported, not fatal; its
    seconds (the engine's: prefill and decode compiled) go in `compile_s` as build_NAME."""
    engine = Engine(cfg, cache_dtype=args.precision)
    sampling = SamplingConfig(max_new_tokens=shape.n2, temperature=1.0, ignore_eos=True)
    itemsize = engine.cache_dtype.itemsize
    builders = {
        "engine": lambda: programs.engine_parts(engine, weights, shape, sampling, itemsize),
        "forward": lambda: programs.forward_parts(engine, weights, shape, sampling,
                                                  args.layers, itemsize),
        "head": lambda: programs.head_parts(cfg, weights, shape, sampling),
        "stream": lambda: [programs.stream_part(args.stream_mb, shape.reps)]}
    parts = []
    for name, build in builders.items():
        t0 = time.perf_counter()
        try:
            parts += build()
            compile_s[f"build_{name}"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - any refusal is this part's result
            failed[name] = f"{type(e).__name__}: {e}"[:2000]
            print(f"{name}: FAILED to build: {failed[name][:400]}", flush=True)
    return engine, parts


def derived(ms: dict, shape, L: int) -> dict:
    """The parts known only as differences of timed ones (absent where an operand is)."""
    step = f"generate_{shape.n2}", f"generate_{shape.n1}"
    rules = {"step": (step, 1 / (shape.n2 - shape.n1)),
             "rest": (("step", f"forward_{L}", "sample_t1"), 1),
             "sampler_t1": (("sample_t1", "logits"), 1),
             "kv_reads": ((f"forward_{L}", f"forward_{L}_block1"), 1),
             "dispatch": (("iteration", "step"), 1)}
    out = {}
    for name, (terms, scale) in rules.items():
        have = {**ms, **out}
        if all(t in have for t in terms):
            out[name] = scale * (have[terms[0]] - sum(have[t] for t in terms[1:]))
    return out


def summary(times: dict, parts, shape, cfg, weights, args) -> dict:
    """{part: ms a token step, bytes, their time, shares} and the per-layer fit."""
    L = cfg.num_hidden_layers
    ms = {p.name: 1e3 * statistics.median(times[p.name]) / p.per for p in parts
          if times[p.name]}
    nbytes = {p.name: p.bytes for p in parts}
    extra = derived(ms, shape, L)
    itemsize = np.dtype(DTYPES[args.precision]).itemsize if args.precision != "bf16" else 2
    kv = lambda slots: programs.kv_bytes(cfg, L, shape.rows, slots, itemsize)  # noqa: E731
    nbytes |= {"step": nbytes.get(f"generate_{shape.n2}", 0), "rest": 0, "dispatch": 0,
               "sampler_t1": shape.rows * cfg.vocab_size * 4,
               "kv_reads": kv(shape.mid) - kv(1)}
    measured = (nbytes["stream"] / ms["stream"] / 1e6) if ms.get("stream") else None
    rows = {}
    for name, value in {**ms, **extra}.items():
        if name.startswith("generate_"):
            continue
        row = {"ms": value, "bytes": nbytes[name],
               "bytes_ms": nbytes[name] / args.bandwidth / 1e6}
        row["share"] = row["bytes_ms"] / value if value > 0 else None
        row["share_measured"] = (nbytes[name] / measured / 1e6 / value
                                 if measured and value > 0 else None)
        rows[name] = row
    return {"parts": rows, "measured_gbps": measured, "fit": layer_fit(ms, cfg, weights, shape,
                                                                       args)}


def layer_fit(ms: dict, cfg, weights, shape, args) -> dict | None:
    """The cached forward's ms against its layer count, least squares: per-layer slope and
    intercept, beside the bytes' time a layer must take."""
    points = [(n, ms[f"forward_{n}"]) for n in args.layers if f"forward_{n}" in ms]
    if len({n for n, _ in points}) < 2:
        return None
    slope, intercept = np.polyfit(*zip(*points), 1)
    layer_bytes = (programs.tree_bytes(weights["layers"]) / cfg.num_hidden_layers
                   + programs.kv_bytes(cfg, 1, shape.rows, shape.mid, 2))
    return {"layers": [n for n, _ in points], "ms": [m for _, m in points],
            "slope_ms": float(slope), "intercept_ms": float(intercept),
            "slope_bytes_ms": layer_bytes / args.bandwidth / 1e6}


def print_table(arm: str, s: dict, notes: dict) -> None:
    measured = s["measured_gbps"]
    print(f"\narm {arm}; measured read bandwidth "
          f"{'-' if measured is None else f'{measured:.0f} GB/s'}")
    print("| part | ms | bytes' ms | share | share at measured | what |")
    print("|---|---|---|---|---|---|")
    pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
    for name, r in s["parts"].items():
        print(f"| {name} | {r['ms']:.3f} | {r['bytes_ms']:.3f} | {pct(r['share'])} | "
              f"{pct(r['share_measured'])} | {notes.get(name, '')} |")
    fit = s["fit"]
    if fit:
        print(f"per layer: {fit['slope_ms']:.4f} ms a layer (its bytes {fit['slope_bytes_ms']:.4f}"
              f" ms), intercept {fit['intercept_ms']:.3f} ms; fit over layers {fit['layers']}",
              flush=True)


def measure_arm(arm: str, cfg, weights, shape, args, record) -> None:
    """One arm: build and warm every part (the seconds of each build and each first run,
    compiles included, recorded), then the rounds; `record(arm, entry)` after the warm-up
    and after every round."""
    set_arm(arm)
    failed, compile_s, L = {}, {}, cfg.num_hidden_layers
    engine, parts = build_parts(cfg, weights, shape, args, failed, compile_s)
    for p in list(parts):
        t0 = time.perf_counter()
        try:
            p.run()
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: this part's result
            failed[p.name] = f"{type(e).__name__}: {e}"[:2000]
            print(f"{p.name}: FAILED: {failed[p.name][:400]}", flush=True)
            parts.remove(p)
            continue
        compile_s[p.name] = time.perf_counter() - t0
    print(f"arm {arm}: warm-up with compiles " + ", ".join(
        f"{k} {v:.1f} s" for k, v in compile_s.items()), flush=True)
    entry = {"compile_s": compile_s, "failed": failed, "rounds_done": 0,
             "notes": {p.name: p.note for p in parts} | DERIVED_NOTES}
    record(arm, entry)
    times = {p.name: [] for p in parts}
    for r in range(args.rounds):
        for p in parts:
            t0 = time.perf_counter()
            p.run()
            times[p.name].append(time.perf_counter() - t0)
        entry.update(summary(times, parts, shape, cfg, weights, args), rounds_done=r + 1)
        record(arm, entry)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v['ms']:.3f} ms" for k, v in
                                             entry["parts"].items()
                                             if k in ROUND_LINE or k == f"forward_{L}"),
              flush=True)
    if args.rounds:
        print_table(arm, entry, entry["notes"])
    engine.release_cache()
    del parts, engine
    gc.collect()  # the arm's caches and weight slices go before the next arm's


def run(args, save=lambda result: None) -> dict:
    cfg, weights = random_decoder(args.config, args.toy, args.precision)
    L = cfg.num_hidden_layers
    args.layers = sorted({n for n in (args.layers or (1, 2, L // 2, L)) if 1 <= n <= L} | {L})
    shape = programs.Shape(args.rows, args.prompt, args.n1, args.n2, args.reps)
    print(f"{jax.devices()[0].device_kind}; {args.config}: {cfg.num_params() / 1e6:.0f}M "
          f"params, {L} layers, {cfg.compute_dtype}, {args.rows} rows, P {args.prompt}, "
          f"tokens {args.n1}..{args.n2} (mid {shape.mid} slots), {args.rounds} rounds of "
          f"{args.reps} calls a part", flush=True)
    result = {"config": args.config, "device": jax.devices()[0].device_kind,
              "rows": args.rows, "prompt": args.prompt, "n1": args.n1, "n2": args.n2,
              "mid": shape.mid, "precision": args.precision, "layers": args.layers,
              "bandwidth_gbps": args.bandwidth, "arms": {}}

    def record(arm, entry):
        result["arms"][arm] = entry
        save(result)
    for arm in args.arms:
        measure_arm(arm, cfg, weights, shape, args, record)
    if args.arms != ["default"]:
        set_arm("default")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--n1", type=int, default=32)
    ap.add_argument("--n2", type=int, default=96)
    ap.add_argument("--layers", type=int, nargs="+",
                    help="layer counts of the cached forward (default 1 2 L/2 L; L always)")
    ap.add_argument("--precision", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=["default"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20, help="calls a run of a one-call part")
    ap.add_argument("--stream-mb", type=int, help="the bandwidth probe's buffer (512; toy 4)")
    ap.add_argument("--bandwidth", type=float, default=819.0, help="GB/s (v5e: 819)")
    ap.add_argument("--out", help="a folder for decode_parts.json")
    ap.add_argument("--toy", action="store_true")
    args = ap.parse_args()
    if args.stream_mb is None:
        args.stream_mb = 4 if args.toy else 512
    if not args.out:
        run(args)
        return
    out = Path(args.out) / "decode_parts.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    run(args, lambda result: out.write_text(json.dumps(result, indent=1)))


if __name__ == "__main__":
    main()
