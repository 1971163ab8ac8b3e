"""Where a decode token step's time goes on one accelerator, per decode knob (issue 56 item 2).

    python -m benchmarks.tpu.decode_profile --config CONFIG.json [--rows 64] [--prompt 128]
        [--n1 32] [--n2 96] [--arms default cpu dots ... pallas] [--out DIR] [--toy]
        [--no-trace]

On one v5e (set 11, docs/results/predict_tpu_validation.md) a Qwen3-0.6B token step at 64
rows took 23 ms where its bytes take ~4 ms. The engine's decode attention was tuned for
XLA:CPU: the bf16 cache sliced as uint16 bits under an optimization barrier
(`attention.HALF_AS_BITS`) and scores and mixes as f32 broadcast multiply-reduces, not dots
(`attention.DECODE_AS_DOTS`). This profile found the bitcasts and the barrier's copies of
the whole cache behind half of it, and both knobs now follow the backend
(docs/results/tpu_decode.md); the "cpu" arm keeps XLA:CPU's settings on any backend. Or the
cache is read by one Pallas kernel in place (`attention.DECODE_KERNEL`,
`model/decode_kernel.py`). Each arm sets the knobs (`ARMS`), and measures:
- the token step: a generate of N2 tokens minus one of N1 (EOS ignored, the same prompts
  and key) over N2 - N1, so prefill and fixed costs cancel; arms interleaved round by round
  (a switch re-traces on a fresh engine: `jax.clear_caches`, then warm-up generates, untimed);
- where it goes: one generate of N2 traced with `jax.profiler`, its device ops (the
  accelerator's "XLA Ops" line; XLA:CPU's kernel threads on a CPU) summed by name, per
  token step, the largest first, with each op's HLO text where the trace carries it;
- whether it samples what the default samples (a differing token is reported, not hidden:
  the knobs change rounding, not the math).
It prints and writes (DIR/decode_profile.json) each arm's ms per token step, its share of
the bytes' time at `--bandwidth` GB/s, and its top ops.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks.kernel_traces import kernel_spans
from benchmarks.tpu.token_step import (
    CPU_KNOBS, DEFAULT_KNOBS, DTYPES, random_decoder, set_knobs, step_bytes)
from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import attention

ARMS = {"default": DEFAULT_KNOBS, "cpu": CPU_KNOBS} | {
    name: {**CPU_KNOBS, **attention.decode_settings(name.replace("+", ","))}
    for name in ("dots", "bits-off", "dots+bits-off", "pallas", "pallas+bits-off")}
"""Each arm's settings of the `attention` module's decode knobs: the engine's default (by
backend), XLA:CPU's settings on any backend ("cpu"), and those with the `LOCOJAX_DECODE`
names in the arm's (a run with `LOCOJAX_DECODE=no-dots,bits,pallas` is the pallas arm)."""


def set_arm(name: str) -> None:
    set_knobs(ARMS[name])


def device_ops(planes) -> dict[str, list[float]]:
    """{op name: [seconds of each of its events]} from a trace: the accelerator planes'
    "XLA Ops" lines, else (a CPU run) the kernels on XLA:CPU's threads."""
    ops: dict[str, list[float]] = collections.defaultdict(list)
    for plane in planes:
        if plane.name.startswith("/device:"):
            for line in plane.lines:
                if line.name == "XLA Ops":
                    for ev in line.events:
                        ops[ev.name].append(ev.duration_ns / 1e9)
    if not ops:
        for name, spans in kernel_spans(planes).items():
            ops[name] = [(end - start) / 1e9 for start, end in spans]
    return ops


def hlo_texts(planes) -> dict[str, str]:
    """{op name: the first string stat its events carry that reads as HLO text}: XLA:TPU's
    trace names a fused op by its number only, and the text says what it computes."""
    out = {}
    for plane in planes:
        for line in plane.lines:
            for ev in line.events:
                if ev.name in out:
                    continue
                for key, value in ev.stats:
                    if isinstance(value, str) and "=" in value and key != "_src":
                        out[ev.name] = f"{key}: {value[:300]}"
                        break
    return out


def traced(generate, n: int, top: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="decode_profile_") as work:
        with jax.profiler.trace(work):
            generate(n)
        data = jax.profiler.ProfileData.from_file(str(sorted(Path(work).rglob("*.xplane.pb"))[-1]))
    planes = list(data.planes)  # an iterator: each reader below walks it again
    ops, texts = device_ops(planes), hlo_texts(planes)
    total = sum(sum(v) for v in ops.values())
    ranked = sorted(ops.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"device_s": total, "top": [
        {"op": name, "ms_per_token": 1e3 * sum(times) / n, "calls_per_token": len(times) / n,
         "share": sum(times) / total if total else 0.0, "hlo": texts.get(name, "")}
        for name, times in ranked]}


def generator(cfg, weights, prompts, precision: str):
    """generate(n) -> (seconds, tokens): n tokens a row, EOS ignored, the same prompts and
    key every call, on an engine made for the arm in force (`fresh`: its cache geometry and
    programs depend on the knobs; the last one's cache released first)."""
    mask, key, held = np.ones(prompts.shape, bool), jax.random.key(0), []

    def fresh():
        while held:
            held.pop().release_cache()
        held.append(Engine(cfg, cache_dtype=precision))

    def generate(n):
        sampling = SamplingConfig(max_new_tokens=n, temperature=1.0, ignore_eos=True)
        t0 = time.perf_counter()
        out = held[0].generate(weights, prompts, key, sampling, prompt_mask=mask)
        tokens = np.asarray(jax.block_until_ready(out).tokens)
        return time.perf_counter() - t0, tokens
    return fresh, generate


def timed_rounds(args, fresh, generate):
    """({arm: {n: [seconds]}}, {arm: warm-up seconds with its compile}, {arm: last tokens},
    {arm: why it failed}): round 0 compiles each arm (one that fails to, e.g. a kernel
    XLA or Mosaic refuses, is reported and left out, so the others still run), then
    `args.rounds` rounds of every arm's N1 and N2 generates, interleaved."""
    times = {a: {args.n1: [], args.n2: []} for a in args.arms}
    compile_s, tokens, failed = {}, {}, {}
    for r in range(args.rounds + 1):
        for a in [a for a in args.arms if a not in failed]:
            set_arm(a)
            fresh()
            try:
                warm = generate(args.n1)[0] + generate(args.n2)[0]
            except Exception as e:  # noqa: BLE001 - any refusal is this arm's result
                failed[a] = f"{type(e).__name__}: {e}"[:4000]
                print(f"\n{a}: FAILED to compile or run: {failed[a][:600]}", flush=True)
                continue
            if r == 0:
                compile_s[a] = warm
                continue
            for n in (args.n1, args.n2):
                seconds, out = generate(n)
                times[a][n].append(seconds)
            tokens[a] = out
    return times, compile_s, tokens, failed


def run(args, save=lambda result: None) -> dict:
    """Every arm's timing, printed and saved (`save(result)`) as soon as the rounds end; then
    each arm's trace, saved as it comes: on the chip a trace has ended in a crash of the
    process (docs/results/tpu_decode.md), which must not take the timings with it."""
    cfg, weights = random_decoder(args.config, args.toy, args.precision)
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, cfg.vocab_size, (args.rows, args.prompt)).astype(np.int32)
    mid = args.prompt + (args.n1 + args.n2) // 2
    cache_bytes = jax.numpy.dtype(DTYPES[args.precision]).itemsize
    floor_ms = step_bytes(cfg, weights, args.rows, mid, cache_bytes) / args.bandwidth / 1e6
    print(f"{jax.devices()[0].device_kind}; {args.config}: {cfg.num_params() / 1e6:.0f}M "
          f"params, {cfg.compute_dtype}, {args.rows} rows, P {args.prompt}, tokens "
          f"{args.n1}..{args.n2}; its bytes take {floor_ms:.2f} ms at {args.bandwidth:.0f} GB/s",
          flush=True)
    fresh, generate = generator(cfg, weights, prompts, args.precision)
    times, compile_s, tokens, failed = timed_rounds(args, fresh, generate)
    result = {"config": args.config, "rows": args.rows, "prompt": args.prompt,
              "precision": args.precision, "n1": args.n1, "n2": args.n2, "floor_ms": floor_ms,
              "arms": [{"arm": a, "failed": why} for a, why in failed.items()]}
    first = next(iter(tokens), None)
    timed = {}
    for a in [a for a in args.arms if a not in failed]:
        per_token = (statistics.median(times[a][args.n2])
                     - statistics.median(times[a][args.n1])) / (args.n2 - args.n1)
        timed[a] = {"arm": a, "ms_per_token_step": 1e3 * per_token, "compile_s": compile_s[a],
                    "roofline_share": floor_ms / (1e3 * per_token),
                    "same_tokens_as_default": bool(np.array_equal(tokens[a], tokens[first]))}
        result["arms"].append(timed[a])
        print(f"{a}: {1e3 * per_token:.2f} ms a token step, {timed[a]['roofline_share']:.0%} "
              f"of the bytes' time; warm-up with compile {compile_s[a]:.1f} s; same tokens as "
              f"{first}: {timed[a]['same_tokens_as_default']}", flush=True)
    save(result)
    for a in timed if args.trace else ():
        set_arm(a)
        fresh()
        generate(args.n1)  # re-trace under this arm before its trace
        timed[a].update(traced(generate, args.n2, args.top))
        save(result)
        print(f"\n{a}: device ops {1e3 * timed[a]['device_s'] / args.n2:.2f} ms a token",
              flush=True)
        for op in timed[a]["top"]:
            print(f"  {op['ms_per_token']:8.3f} ms {op['calls_per_token']:6.1f}x "
                  f"{op['share']:5.1%} {op['op'][:60]}  {op['hlo'][:160]}")
    set_arm("default")
    fresh()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--n1", type=int, default=32)
    ap.add_argument("--n2", type=int, default=96)
    ap.add_argument("--precision", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--bandwidth", type=float, default=819.0, help="GB/s (v5e: 819)")
    ap.add_argument("--out", help="a folder for decode_profile.json")
    ap.add_argument("--toy", action="store_true")
    ap.add_argument("--no-trace", dest="trace", action="store_false",
                    help="time the arms only (no jax.profiler trace)")
    args = ap.parse_args()
    if not args.out:
        run(args)
        return
    out = Path(args.out) / "decode_profile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    run(args, lambda result: out.write_text(json.dumps(result, indent=1)))


if __name__ == "__main__":
    main()
