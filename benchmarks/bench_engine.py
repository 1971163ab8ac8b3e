"""Generation throughput of locojax against HF `generate` and Tunix's sampler, in one run.

Every side runs the same Qwen3 architecture with random f32 weights, on the same prompts
(16 prompts x G 8 = 128 rows of 32 tokens at SMALL), sampling at temperature 1, with the
same number of tokens per row:
- `tiny`, `small` (docs/design.md's shapes): exactly N = 32 / 64 tokens per row (locojax
  `ignore_eos`, HF `min_new_tokens = N`, Tunix's EOS outside the vocabulary);
- `small-512`, `small-1024`, `small-4096`: SMALL with N max new tokens, row r ending by EOS
  after L_r tokens, L_r drawn once (seed 0) from a log-normal of median 200 tokens and
  sigma 1 (a GSM8K-like chain of thought with a long tail: 16% of rows past 540 tokens,
  2% past 1,480), capped at N. The same L_r are forced on every side: HF and Tunix through
  their logits (EOS = V - 1 forbidden before a row's last token and the only choice at it,
  so each ends the row by its own EOS rule), locojax through its per-row limits (the same
  stop rule, loop exit and compaction as EOS).
HF expands each prompt G times itself (`num_return_sequences`), as TRL does, with 2 torch
threads; Tunix's sampler (v0.1.7, in bench_peers' venv under ~/.cache/locojax/peers/tunix,
`benchmarks/peers/tunix_sampler.py`) gets every prompt G times; locojax prefills each prompt
once. The sides' runs alternate (locojax, HF, Tunix, locojax, ...) so all see the same load.
Timing is synchronised; the first run of each side (its compiles) is reported apart.

Printed per shape: seconds (median of the runs), tokens/s, locojax's ratio to each side;
for locojax the bytes of KV cache its attention must read (every live row's written prefix
at every decode step; the engine reads up to a block more) per second, against the memory
bandwidth measured in this run (a 512 MiB f32 `jnp.sum`); time per generated token relative
to `small-512`'s. `--sweep blocks` / `rows` / `folds` measure decoder.BLOCK, engine.MIN_ROWS
and attention.FOLD_SLOTS; `--sweep refill --shapes small-512 small-4096 --refill-slots 32`
refilled rows (`engine/refill.py`) against the plain generate, interleaved;
`--trace small-512` sums a steady decode step's time per XLA op (jax.profiler).
`real-8`, `real-32`, `real-128`: the converted SmolLM2-135M-Instruct (`models/`, `make
real-model`) decoding 8, 32 or 128 rows, for `--trace` and `--sweep weights` (f32 against a
bf16 rollout copy of the weights: ms per step, share of the roofline, the sampler-learner
logprob gap); the table's "locojax of roofline" is a generate's FLOPs at the measured matmul
peak or its bytes at the measured bandwidth, whichever bounds it, over its time.

Each shape's table row is printed as the shape ends, then the whole table. `--prompts-4096 8`
halves small-4096's batch (64 rows; its L_r are the first 64 of the same draw, max 1,421
against 1,482), to fit HF and Tunix's runs at 4096 in a shorter session.

Usage:  .venv/bin/python -m benchmarks.bench_engine [--shapes ...] [--runs 3] [--peer-runs 2]
            [--prompts-4096 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import jax
import numpy as np

from benchmarks import engine_sweeps, harness
from benchmarks.engine_runners import TORCH_THREADS, TunixRunner, hf_runner, locojax_runner, \
    profile
from benchmarks.engine_work import MEDIAN_LENGTH, SHAPES, SIGMA, Shape, cache_bytes, \
    generate_bytes, generate_flops, model, roofline
from benchmarks.harness import timed
from benchmarks.peers import install


HEAD = ["shape", "tokens", "locojax tok/s", "HF tok/s", "Tunix tok/s", "vs HF", "vs Tunix",
        "cache read GB/s (of bandwidth)", "locojax of roofline", "s/token vs small-512",
        "first run s (locojax / HF / Tunix)"]


def table_row(r: dict, bandwidth: float, per_token_512: float | None,
              peak: float = float("nan")) -> list[str]:
    """One shape's row of the table: rates, locojax's ratios, its cache reads."""
    s, med, tok = r["shape"], r["median"], r["tokens"]
    rate = {k: f"{tok / v:,.0f}" for k, v in med.items()}
    ratio = {k: f"{v / med['locojax']:.2f}x" for k, v in med.items()}
    read = cache_bytes(r["cfg"], s) / med["locojax"]
    rel = f"{med['locojax'] / tok / per_token_512:.2f}x" if per_token_512 and s.long_tail else ""
    return [s.name, str(tok), rate["locojax"], rate.get("HF", "-"), rate.get("Tunix", "-"),
            ratio.get("HF", "-"), ratio.get("Tunix", "-"),
            f"{read / 1e9:.2f} ({100 * read / bandwidth:.0f}% of {bandwidth / 1e9:.1f})",
            roofline(med["locojax"], generate_flops(r["cfg"], s), r["bytes"], peak, bandwidth),
            rel,
            " / ".join(f"{v:.1f}" for v in r["first"].values())]


def bench_shape(s: Shape, runs: int, peer_runs: int, tunix_python, hf: bool = True) -> dict:
    cfg, weights = model(s)
    prompts = np.asarray(jax.random.randint(
        jax.random.key(1), (s.prompts, s.prompt_tokens), 1, cfg.vocab_size - 1), np.int32)
    lengths = s.lengths()
    if s.long_tail:
        drawn = (f"L_r ~ lognormal(median {MEDIAN_LENGTH}, sigma {SIGMA}) capped at "
                 f"{s.new_tokens}: min {lengths.min()}, median {np.median(lengths):.0f}, "
                 f"max {lengths.max()}")
    else:
        drawn = f"exactly {s.new_tokens}"
    print(f"\n[{s.name}] {cfg}\n  {s.prompts} prompts x G {s.group}, {s.prompt_tokens} prompt "
          f"tokens, {drawn} new tokens, {lengths.sum()} in all", flush=True)
    sides = {"locojax": locojax_runner(cfg, weights, prompts, s)}
    # First runs: locojax's compiles; HF's allocator and kernels (2 tokens: nothing compiles).
    first = {"locojax": timed(sides["locojax"])}
    if hf:
        sides["HF"] = hf_runner(cfg, weights, prompts, s)
        first["HF"] = timed(lambda: sides["HF"](True))
    tunix = None
    if tunix_python is not None:
        try:
            tunix = TunixRunner(tunix_python, cfg, s)
            first["Tunix"] = tunix.first
        except RuntimeError as e:
            print(f"  Tunix: {e}")
    arms = {"locojax": lambda: timed(sides["locojax"]), "HF": lambda: timed(sides["HF"]),
            "Tunix": tunix}
    times = harness.interleave(
        {k: arms[k] for k in first}, max(runs, peer_runs),
        limits={"locojax": runs, "HF": peer_runs, "Tunix": peer_runs},
        after_round=lambda _, times: print("  " + ", ".join(
            f"{k} {' '.join(f'{t:.3f}' for t in v)}" for k, v in times.items()), flush=True))
    if tunix is not None:
        tunix.close()
    if s.long_tail:
        profile(sides["locojax"])
    return dict(shape=s, cfg=cfg, tokens=int(lengths.sum()), first=first,
                bytes=generate_bytes(cfg, weights, s),
                median={k: statistics.median(v) for k, v in times.items()})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--runs", type=int, default=3, help="steady-state runs of locojax")
    ap.add_argument("--peer-runs", "--hf-runs", type=int, default=2,
                    help="steady-state runs of HF and Tunix")
    ap.add_argument("--no-tunix", action="store_true", help="skip Tunix's sampler")
    ap.add_argument("--no-hf", action="store_true",
                    help="skip HF generate (locojax's rates and roofline alone)")
    ap.add_argument("--sweep", choices=("blocks", "rows", "folds", "weights", "refill"),
                    help="measure BLOCK, MIN_ROWS, FOLD_SLOTS, f32 against bf16 rollout "
                         "weights at --shapes (e.g. real-8 real-32 real-128), or refilled "
                         "rows against the plain generate at --shapes")
    ap.add_argument("--refill-slots", type=int, nargs="+", default=[32],
                    help="--sweep refill: the R of each refill arm")
    ap.add_argument("--refill-at", type=int, default=0,
                    help="--sweep refill: free slots per refill stop (0: G)")
    ap.add_argument("--trace", choices=list(SHAPES),
                    help="trace steady decode steps of this shape and sum them per XLA op")
    ap.add_argument("--trace-start", type=int, default=150,
                    help="decode step the traced steps start from (after 2 x 20 untraced)")
    ap.add_argument("--weights-dtype", choices=("bf16",),
                    help="--trace with a bf16 rollout copy of the weights")
    ap.add_argument("--prompts-4096", type=int, default=16,
                    help="B of small-4096 (fewer: a shorter run; its rows' L_r are the first "
                         "B x G of the same draw)")
    args = ap.parse_args(argv)
    SHAPES["small-4096"] = dataclasses.replace(SHAPES["small-4096"], prompts=args.prompts_4096)

    print(harness.command_line())
    print(harness.header("bench_engine", f"jax on {jax.devices()[0].platform} "
                         f"x{jax.device_count()}, torch threads {TORCH_THREADS}"))
    if args.sweep or args.trace:
        if args.sweep == "folds":
            engine_sweeps.sweep_folds(args.runs)
        elif args.sweep == "refill":
            engine_sweeps.sweep_refill([SHAPES[n] for n in args.shapes], args.runs,
                                       args.refill_slots, args.refill_at)
        elif args.sweep == "weights":
            engine_sweeps.sweep_weights([SHAPES[n] for n in args.shapes], args.runs)
        elif args.sweep:
            engine_sweeps.sweep(args.sweep, args.runs)
        else:
            engine_sweeps.trace_decode(SHAPES[args.trace], args.trace_start,
                                       weights_dtype=args.weights_dtype)
            return 0
        print(f"load average at end {harness.loads()}")
        return 0
    tunix_python = None
    if not args.no_tunix:
        peer = install.PEERS["tunix"]
        if install.is_ready(peer):
            tunix_python = peer.python(install.DEFAULT_CACHE)
        else:
            print(f"Tunix: no venv at {peer.root(install.DEFAULT_CACHE)} "
                  "(`python -m benchmarks.peers.install tunix` makes it)")
    bandwidth, peak = harness.read_bandwidth(), harness.matmul_peak()
    print(f"memory read bandwidth (512 MiB f32 jnp.sum, best of 5): {bandwidth / 1e9:.1f} GB/s; "
          f"matmul peak (2048^3 f32, median of 5): {peak / 1e9:.0f} GFLOP/s")
    results, per_token_512 = [], None
    for name in args.shapes:  # each shape's row as it ends, so a cut-short run still tells
        results.append(bench_shape(SHAPES[name], args.runs, args.peer_runs, tunix_python,
                                   hf=not args.no_hf))
        if name == "small-512":
            per_token_512 = results[-1]["median"]["locojax"] / results[-1]["tokens"]
        print("\n".join(harness.table(HEAD, [table_row(results[-1], bandwidth, per_token_512,
                                                        peak)]))
              + f"\n  load average {harness.loads()}", flush=True)
    # the better of two, around the runs
    bandwidth, peak = max(bandwidth, harness.read_bandwidth()), max(peak, harness.matmul_peak())

    print("\n" + "\n".join(harness.table(HEAD, [table_row(r, bandwidth, per_token_512, peak)
                                                for r in results])))
    print(f"load average at end {harness.loads()}; medians of steady-state runs, sides "
          "alternating")
    return 0


if __name__ == "__main__":
    sys.exit(main())
