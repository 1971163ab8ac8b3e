"""A decode token step's time on one accelerator per attention block size (issue 56 item 2).

    python -m benchmarks.tpu.decode_blocks --config CONFIG.json [--rows 64] [--prompt 256]
        [--blocks 32 128 256 0] [--out OUT.json] [--toy]

On one v5e, Qwen3-0.6B's token step took 59 ms at 64 rows where its bytes take ~3 ms at
819 GB/s (docs/results/tpu_qwen3_fit.md). The engine reads the KV cache in blocks of
`decoder.BLOCK` = 32 slots in a loop, a size chosen on XLA:CPU (each block's copy stays in
the CPU's cache); on a TPU each loop iteration is a few small kernels, times the blocks,
times the layers. This measures, per block size (0: one block, the whole cache read at
once), the token step: a generate of N2 tokens minus one of N1 (EOS ignored, the same
prompts and key), over N2 - N1, so prefill and the fixed costs cancel; compiles apart. It
prints each arm's ms per token step, the bytes a step must read (the bf16 rollout weights,
and the written K and V slots at the mid-point of the decode) and their share of the
chip's published bandwidth (`--bandwidth`, GB/s), and checks that every arm samples the
same tokens (the block size must not change what is drawn: attention's online softmax is
exact up to rounding, so a differing token is reported, not hidden).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import numpy as np

from benchmarks.tpu.token_step import random_decoder, step_bytes
from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig


def arm(cfg, weights, prompts, block: int, n1: int, n2: int, runs: int) -> dict:
    slots = prompts.shape[1] + n2
    engine = Engine(cfg, cache_dtype="bf16", block=block or slots)
    key, mask = jax.random.key(0), np.ones(prompts.shape, bool)

    def generate(n):
        sampling = SamplingConfig(max_new_tokens=n, temperature=1.0, ignore_eos=True)
        t0 = time.perf_counter()
        out = engine.generate(weights, prompts, key, sampling, prompt_mask=mask)
        tokens = np.asarray(jax.block_until_ready(out).tokens)
        return time.perf_counter() - t0, tokens

    first = [generate(n)[0] for n in (n1, n2)]  # compiles
    t1, t2 = [], []
    for _ in range(runs):  # interleaved, so drift hits both lengths alike
        t1.append(generate(n1)[0])
        seconds, tokens = generate(n2)
        t2.append(seconds)
    engine.release_cache()
    per_token = (statistics.median(t2) - statistics.median(t1)) / (n2 - n1)
    return {"block": block, "compile_s": first, "n1_s": t1, "n2_s": t2,
            "ms_per_token_step": per_token * 1e3, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--n1", type=int, default=32)
    ap.add_argument("--n2", type=int, default=96)
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 128, 256, 0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bandwidth", type=float, default=819.0, help="GB/s (v5e: 819)")
    ap.add_argument("--out")
    ap.add_argument("--toy", action="store_true")
    args = ap.parse_args()
    cfg, weights = random_decoder(args.config, args.toy)
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, cfg.vocab_size, (args.rows, args.prompt)).astype(np.int32)
    mid = args.prompt + (args.n1 + args.n2) // 2
    need = step_bytes(cfg, weights, args.rows, mid)
    floor_ms = need / (args.bandwidth * 1e9) * 1e3
    print(f"{jax.devices()[0].device_kind}; {args.config}: {cfg.num_params() / 1e6:.0f}M params, "
          f"{args.rows} rows, P {args.prompt}, tokens {args.n1}..{args.n2}; a step reads "
          f"{need / 1e9:.2f} GB: {floor_ms:.2f} ms at {args.bandwidth:.0f} GB/s", flush=True)
    rows, reference = [], None
    for block in args.blocks:
        r = arm(cfg, weights, prompts, block, args.n1, args.n2, args.runs)
        tokens = r.pop("tokens")
        reference = tokens if reference is None else reference
        same = bool(np.array_equal(tokens, reference))
        r.update(same_tokens=same, roofline_share=floor_ms / r["ms_per_token_step"])
        rows.append(r)
        print(f"block {block or 'whole'}: {r['ms_per_token_step']:.2f} ms a token step, "
              f"{r['roofline_share']:.0%} of the roofline; compiles {r['compile_s'][0]:.1f} + "
              f"{r['compile_s'][1]:.1f} s; same tokens as the first arm: {same}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"config": args.config, "rows": args.rows, "prompt": args.prompt,
                       "floor_ms": floor_ms, "arms": rows}, f, indent=1)


if __name__ == "__main__":
    main()
