"""Generation throughput of the locojax engine against HF transformers `generate`.

Both run the same random f32 weights (locojax init, converted with `hf_io.to_state_dict`)
on the same prompts at the DESIGN.md canonical shapes, with plain temperature-1 sampling
and exactly N new tokens per sequence (no early stop: `ignore_eos` here,
`min_new_tokens = max_new_tokens` there). HF expands each prompt G times itself
(`num_return_sequences`), as TRL does; locojax prefills each prompt once and repeats
the cache. Timing is synchronised (`block_until_ready`; torch runs eagerly on the CPU),
compile time is reported apart, and each figure is the median of several steady-state runs,
the two engines' runs alternating so that both see the same machine load.

For SMALL it also reports achieved FLOP/s against the f32 matmul peak measured here
(a large `jnp.dot`), using `ModelConfig.flops_per_token` for the work actually done.

Usage:  .venv/bin/python benchmarks/bench_engine.py [--shapes tiny small] [--runs 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config as model_config
from locojax.model import params
from locojax.model.hf_io import to_state_dict


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    prompts: int  # B
    group: int  # G
    prompt_tokens: int  # P
    new_tokens: int  # N


SHAPES = {
    "tiny": Shape("tiny", 8, 4, 16, 32),
    "small": Shape("small", 16, 8, 32, 64),
}
TORCH_THREADS = 2


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_time(fn, runs: int) -> tuple[float, list[float]]:
    times = [timed(fn) for _ in range(runs)]
    return statistics.median(times), times


def matmul_peak(n: int = 2048, runs: int = 5) -> float:
    """FLOP/s of an [n, n] @ [n, n] f32 matmul on this machine (median of `runs`)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(jnp.dot)
    f(a, b).block_until_ready()
    t, _ = median_time(lambda: f(a, b).block_until_ready(), runs)
    return 2 * n ** 3 / t


def generate_flops(cfg, s: Shape) -> float:
    """Matmul FLOPs of one generate: prefill B·P tokens, then R·(N-1) decode tokens.

    Prefill runs the LM head on the last position only; attention context is counted
    exactly (a token at position t attends to t + 1 keys).
    """
    head = 2 * cfg.hidden_size * cfg.vocab_size
    body = lambda ctx: cfg.flops_per_token(ctx) - head  # noqa: E731
    prefill = s.prompts * sum(body(t + 1) for t in range(s.prompt_tokens)) + s.prompts * head
    rows = s.prompts * s.group
    decode = rows * sum(cfg.flops_per_token(s.prompt_tokens + i + 1)
                        for i in range(s.new_tokens - 1))
    return float(prefill + decode)


def locojax_runner(cfg, weights, prompts: np.ndarray, s: Shape):
    """A callable doing one synchronised generate (the first call compiles)."""
    engine = Engine(cfg)
    sampling = SamplingConfig(max_new_tokens=s.new_tokens, temperature=1.0, ignore_eos=True)
    calls = iter(range(10 ** 6))

    def once():
        out = engine.generate(weights, prompts, jax.random.key(next(calls)), sampling,
                              num_samples=s.group)
        jax.block_until_ready(out)
        assert out.tokens.shape == (s.prompts * s.group, s.new_tokens)
        assert int(out.lengths.min()) == s.new_tokens and int(out.steps) == s.new_tokens - 1

    return once


def hf_runner(cfg, weights, prompts: np.ndarray, s: Shape):
    """A callable doing one HF `generate` on the same weights and prompts."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(TORCH_THREADS)
    hf_cfg = Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    model = Qwen3ForCausalLM(hf_cfg).float().eval()
    state = {k: torch.from_numpy(np.array(v)) for k, v in to_state_dict(weights, cfg).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    input_ids = torch.from_numpy(prompts.astype(np.int64))
    kw = dict(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
        max_new_tokens=s.new_tokens, min_new_tokens=s.new_tokens,
        num_return_sequences=s.group, pad_token_id=0, eos_token_id=None,
        attention_mask=torch.ones_like(input_ids),
    )

    def once():
        with torch.no_grad():
            out = model.generate(input_ids, **kw)
        assert out.shape == (s.prompts * s.group, s.prompt_tokens + s.new_tokens), out.shape

    return once


def bench_shape(cfg, weights, prompts, s: Shape, runs: int, hf_runs: int):
    """Compile, warm up both, then alternate runs so both see the same machine load."""
    ours_once, hf_once = locojax_runner(cfg, weights, prompts, s), hf_runner(cfg, weights,
                                                                           prompts, s)
    first = timed(ours_once)
    hf_once()  # warm-up (allocator, kernels)
    ours, hf = [], []
    for i in range(max(runs, hf_runs)):
        if i < runs:
            ours.append(timed(ours_once))
        if i < hf_runs:
            hf.append(timed(hf_once))
    return first - statistics.median(ours), ours, hf


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["tiny", "small"], choices=list(SHAPES))
    ap.add_argument("--runs", type=int, default=5, help="steady-state runs per measurement")
    ap.add_argument("--hf-runs", type=int, default=3, help="steady-state runs of HF generate")
    args = ap.parse_args(argv)

    print("command: " + " ".join([sys.executable.split("/")[-1]] + sys.argv))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{jax.device_count()}, "
          f"{os.cpu_count()} cores ({platform.machine()}), torch threads {TORCH_THREADS}, "
          "load average at start %.1f %.1f %.1f" % os.getloadavg())
    rows = []
    peak = None
    for name in args.shapes:
        s = SHAPES[name]
        cfg = model_config.PRESETS[name]()
        weights = params.init(cfg, jax.random.key(0))
        prompts = np.asarray(jax.random.randint(
            jax.random.key(1), (s.prompts, s.prompt_tokens), 0, cfg.vocab_size), np.int32)
        tokens = s.prompts * s.group * s.new_tokens
        print(f"\n[{name}] {cfg}\n  {s.prompts} prompts x group {s.group} = "
              f"{s.prompts * s.group} sequences, {s.prompt_tokens} prompt tokens, exactly "
              f"{s.new_tokens} new tokens, temperature 1.0 (no top-k/top-p), f32")
        peak_before = matmul_peak() if name == "small" else 0.0
        compile_s, our_times, hf_times = bench_shape(cfg, weights, prompts, s, args.runs,
                                                     args.hf_runs)
        ours, hf = statistics.median(our_times), statistics.median(hf_times)
        print(f"  locojax: compile {compile_s:.2f} s, runs " +
              " ".join(f"{t:.3f}" for t in our_times))
        print("  HF generate: runs " + " ".join(f"{t:.3f}" for t in hf_times))
        row = dict(name=name, tokens=tokens, ours=ours, hf=hf, compile=compile_s)
        if name == "small":
            # The machine's peak is the better of two measurements around the runs.
            peak = max(peak_before, matmul_peak())
            print(f"  f32 matmul peak (2048^3 jnp.dot): {peak / 1e9:.1f} GFLOP/s; generate "
                  f"does {generate_flops(cfg, s) / 1e9:.1f} GFLOP of matmuls")
            row["gflops"] = generate_flops(cfg, s) / ours / 1e9
        rows.append(row)

    print("\n| shape | tokens | locojax s | locojax tok/s | HF s | HF tok/s | ratio | compile s |"
          " achieved GFLOP/s (of peak) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        flops = (f"{r['gflops']:.1f} ({100 * r['gflops'] * 1e9 / peak:.0f}% of "
                 f"{peak / 1e9:.0f})" if "gflops" in r else "")
        print(f"| {r['name'].upper()} | {r['tokens']} | {r['ours']:.3f} | "
              f"{r['tokens'] / r['ours']:,.0f} | {r['hf']:.3f} | {r['tokens'] / r['hf']:,.0f} | "
              f"{r['hf'] / r['ours']:.2f}x | {r['compile']:.1f} | {flops} |")
    print("load average at end %.1f %.1f %.1f; times are medians of steady-state runs, "
          "locojax and HF alternating" % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
