"""`locojax curate`: score a dataset's prompts with a model, keep those that can teach.

    locojax curate gsm8k/train.jsonl --out curated/train.jsonl --model DIR --k 8
    locojax curate math/train.parquet --task math --out curated/train.parquet --model DIR

Samples k completions per prompt on the engine, scores them with the task's reward, and keeps
the rows whose pass rate c/k is strictly between --too-hard and --too-easy (by default the
prompts solved sometimes but not always). Writes OUT (the kept rows, unchanged),
OUT.passrates.jsonl and OUT.hist.png, and prints the histogram (see `locojax.curate`).
A malformed row stops it with `file:line: reason`; --skip-invalid skips such rows and counts
them.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Literal

import tyro


@dataclasses.dataclass(frozen=True)
class CurateArgs:
    """Score every prompt of a data file with a model (pass@k) and keep the informative ones."""

    data: tyro.conf.Positional[str]
    """The data file (.jsonl or .parquet) in the task's row format."""
    out: str
    """Where the kept rows go (same format as the input)."""
    model: str = "embedded"
    """embedded, a preset (tiny, small: random weights) or an HF Qwen3 directory."""
    task: Literal["gsm8k", "math"] = "gsm8k"
    """Row format and reward: gsm8k (question/answer, `#### N`) or math (boxed answers)."""
    template: Literal["plain", "qwen", "chat"] = "plain"
    """Prompt template: plain text, qwen (hand-written ChatML) or chat (the checkpoint's own
    chat template, from its tokenizer_config.json)."""
    k: int = 8
    """Samples per prompt; the pass rate is solved / k."""
    too_easy: float = 1.0
    """Drop rows with pass rate >= this (1.0: solved by every sample)."""
    too_hard: float = 0.0
    """Drop rows with pass rate <= this (0.0: solved by no sample)."""
    temperature: float = 1.0
    """Sampling temperature of the k samples."""
    max_new_tokens: int = 256
    """Most tokens per completion."""
    max_prompt_tokens: int = 256
    """Prompts are left-padded to this; a longer one is an error naming it."""
    batch_size: int = 32
    """Prompts per generate call (each sampled k times)."""
    seed: int = 0
    """Seed of the samples (and of a preset's random weights)."""
    skip_invalid: bool = False
    """Skip malformed rows (and report how many) instead of stopping at the first."""
    limit: int = 0
    """Score only the first this many valid rows (0: all)."""


def main(argv: list[str]) -> int:
    args = tyro.cli(CurateArgs, args=argv, prog="locojax curate")
    import numpy as np

    from locojax import curate
    from locojax.envs.base import Task, single_turn_demo
    from locojax.envs.data import DataError
    from locojax.envs.registry import TASKS
    from locojax.train import build
    from locojax.train.config import RolloutConfig

    try:
        if args.k < 1 or args.batch_size < 1 or args.limit < 0:
            raise ValueError("--k and --batch-size must be >= 1 and --limit >= 0")
        if not args.too_hard < args.too_easy:
            raise ValueError(f"need --too-hard < --too-easy, got {args.too_hard}, {args.too_easy}")
        if args.out == args.data:
            raise ValueError("--out must not be the input file")
        module = importlib.import_module(TASKS[args.task].module)
        data = module.load(args.data, args.template, skip_invalid=args.skip_invalid,
                           limit=args.limit or None)
        # The model as training samples it: the builder's parts (locojax/train/build.py).
        tok = build.tokenizer_of(args.model, args.template)
        sampling = build.sampling_of(RolloutConfig(
            max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
            temperature=args.temperature), tok)
        engine = build.engine_of(build.model_config(args.model))
        weights = build.weights_of(args.model, args.seed)
    except (ValueError, OSError, DataError) as e:
        print(f"locojax curate: {e}", file=sys.stderr)
        return 2
    if data.skipped:
        print(f"skipped {data.skipped} invalid rows of {args.data}; first: {data.problems[0]}")
    task = Task(args.task, data.examples, data.examples, module.reward(), demo=single_turn_demo)
    n = len(data.examples)
    print(f"scoring {n} prompts x {args.k} samples with {args.model} ...", flush=True)
    try:
        scored = curate.score(engine, weights, tok, task, data.examples, args.k,
                              sampling, args.max_prompt_tokens, min(args.batch_size, n),
                              args.seed)
    except ValueError as e:  # a prompt longer than --max-prompt-tokens, names the example
        print(f"locojax curate: {e}", file=sys.stderr)
        return 2
    kept = scored.keep(args.too_easy, args.too_hard)
    written = curate.write_filtered(args.data, [i for i, k in zip(scored.ids, kept) if k],
                                    args.out)
    rates, png = curate.write_report(scored, kept, args.out)
    s = scored.summary()
    rate = scored.solved / args.k
    print(curate.text_histogram(scored))
    print(f"pass@1 {s['pass@1']:.3f}  pass@{args.k} {s[f'pass@{args.k}']:.3f}")
    print(f"kept {written} of {n} ({1 - written / n:.1%} filtered: "
          f"{int(np.sum(rate >= args.too_easy))} too easy, "
          f"{int(np.sum(rate <= args.too_hard))} too hard) -> {args.out}")
    print(f"pass rates: {rates}\nhistogram: {png}")
    return 0
