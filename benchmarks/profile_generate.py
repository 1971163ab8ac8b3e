"""Where a locojax generate's time per token goes at the long-tailed lengths, phase by phase.

small-512 at 128 and 64 rows and small-4096 at 64 (`bench_engine.py --prompts-4096 8`), each
compiled, then `--runs` generates of each, interleaved. Every program (prefill, each decode
phase at its batch size, each compaction) is synchronised and timed as `engine_runners.profile`
times it; each decode phase's live tokens (row-steps whose row has not ended) are counted
from the forced lengths. docs/results/engine_generation.md, "The 4096 target", holds a run.

    .venv/bin/python -m benchmarks.profile_generate [--runs 2]

`--smoke`: one toy long-tailed shape on the TINY model instead (64 new tokens a row at most),
for the test that runs every benchmark.
"""

import argparse
import dataclasses
import sys


import jax
import numpy as np

from benchmarks import engine_runners, engine_work
from benchmarks import harness
from benchmarks.harness import loads as load
from locojax.model import config as model_config
from locojax.model import params


def report(name, s, total, spans):
    lengths = s.lengths()
    tokens = int(lengths.sum())
    print(f"\n{name}: {total:.3f} s, {tokens} tokens, {1000 * total / tokens:.3f} ms/token, "
          f"load {load()}")
    for program, sec, rows, a, b in spans:
        if program != "decode_jit":
            print(f"  {program[:-4]} -> {rows} rows: {sec:.3f} s")
            continue
        live = int(np.clip(np.minimum(lengths, b) - a, 0, None).sum())  # tokens a..b-1
        print(f"  decode {rows:4d} rows, tokens {a}..{b - 1} ({b - a} steps): "
              f"{1000 * sec / max(b - a, 1):.2f} ms/step, {sec:.3f} s, live tokens {live} "
              f"({live / max((b - a) * rows, 1):.2f} of row-steps), "
              f"{1000 * sec / max(live, 1):.3f} ms/live token; written slots "
              f"{s.prompt_tokens + a}..{s.prompt_tokens + b}")
    print(f"  rest (host syncs, dispatch, result): {total - sum(x[1] for x in spans):.3f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="profiled generates of each shape")
    ap.add_argument("--smoke", action="store_true", help="one toy shape (TINY, <= 64 tokens)")
    args = ap.parse_args(argv)
    print(harness.header("profile_generate"), flush=True)
    if args.smoke:
        shapes = {"tiny-64 (8 rows)": engine_work.Shape("tiny-64", "tiny", 4, 2, 16, 64, True)}
    else:
        known = engine_work.SHAPES
        shapes = {"small-512 (128 rows)": known["small-512"],
                  "small-512 (64 rows)": dataclasses.replace(known["small-512"], prompts=8),
                  "small-4096 (64 rows)": dataclasses.replace(known["small-4096"], prompts=8)}
    cfg = model_config.PRESETS[next(iter(shapes.values())).model]()
    weights = params.init(cfg, jax.random.key(0))
    runners = {}
    for name, s in shapes.items():
        prompts = np.asarray(jax.random.randint(
            jax.random.key(1), (s.prompts, s.prompt_tokens), 1, cfg.vocab_size - 1), np.int32)
        runners[name] = engine_runners.locojax_runner(cfg, weights, prompts, s)
        print(f"{name}: first run (compiles) {harness.timed(runners[name]):.1f} s", flush=True)
    spans = engine_runners.program_spans
    harness.interleave({name: lambda name=name: report(name, shapes[name],
                                                        *spans(runners[name]))
                        for name in runners}, args.runs)
    print("load average at end " + load())
    return 0


if __name__ == "__main__":
    sys.exit(main())
