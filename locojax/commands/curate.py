"""`locojax curate`: score a dataset's prompts with a model, keep those that can teach.

    locojax curate gsm8k/train.jsonl --out curated/train.jsonl --model DIR --k 8
    locojax curate math/train.parquet --task math --out curated/train.parquet --model DIR
    locojax curate rows.jsonl --task data --reward my_mod:fn --out kept.jsonl --model DIR

Samples k completions per prompt on the engine, scores them with the task's reward, and keeps
the rows whose pass rate c/k is strictly between --too-hard and --too-easy (by default the
prompts solved sometimes but not always). A sample counts as solved when its total reward
is at least 1 (`evaluate.CORRECT`), as in evaluation. Writes OUT (the kept rows, unchanged),
OUT.passrates.jsonl and OUT.hist.png, and prints the histogram (see `locojax.curate`).

The task, its rows and its reward are named as `train --task.*` names them (the same
builder: `registry.build`): gsm8k and math rows, or `data` (any jsonl/parquet rows, the
prompt from --prompt-field) scored by your own TRL-style rewards (`--reward mod:fn`,
several after one flag, `--reward-weights`), or a built-in reward chosen by name (gsm8k:
`--reward flexible`, `--format-weight`). Every prompt is encoded before any sampling, and
--max-prompt-tokens auto (the default) sizes the prompt width from the longest. A malformed
row, a prompt the tokenizer cannot encode, or one over an explicit --max-prompt-tokens stops
it with `file:line: reason`; --skip-invalid skips such rows and counts them.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated, Literal

import tyro


@dataclasses.dataclass(frozen=True)
class CurateArgs:
    """Score every prompt of a data file with a model (pass@k) and keep the informative ones."""

    data: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="DATA")]
    """The data file (.jsonl or .parquet) in the task's row format (data: any columns)."""
    out: str
    """Where the kept rows go (same format as the input)."""
    model: str = "embedded"
    """A shipped checkpoint (embedded, embedded-strict, embedded-calc), a preset (tiny, small,
    char_demo: random weights) or an HF checkpoint directory: Qwen3, Qwen2/2.5, Llama 3.x or
    Gemma 3 (text)."""
    task: str = "gsm8k"
    """Row format and reward: gsm8k (question/answer, `#### N`), math (boxed answers), data
    (any rows, your --reward), or your own single-turn `module:function` task over --data
    (as `train --task.name`; docs/your_task.md)."""
    reward: tuple[str, ...] = ()
    """gsm8k: strict (the default) or flexible; or your own TRL-style rewards, module:function
    or file.py:function, several after one flag, with strict or flexible among them to keep
    the built-in correctness (as `train --task.reward`)."""
    reward_weights: tuple[float, ...] = ()
    """Weights of the module:function rewards (default: all 1)."""
    format_weight: float = 0.0
    """Weight of the task's format reward (gsm8k, math), as `train --task.format-weight`."""
    prompt_field: str = "prompt"
    """data: the prompt column (text, or a list of chat messages)."""
    answer_field: str = "answer"
    """data: the gold-answer column (optional); every other column reaches the reward."""
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
    max_prompt_tokens: int | Literal["auto"] = "auto"
    """Prompts are left-padded to this. auto: the longest prompt of the file, rounded up to a
    bucket; a prompt over an explicit width is an error naming its row (--skip-invalid:
    skipped and counted)."""
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
    from locojax.commands.eval import own_flags
    from locojax.envs.data import DataError

    try:
        if args.k < 1 or args.batch_size < 1 or args.limit < 0:
            raise ValueError("--k and --batch-size must be >= 1 and --limit >= 0")
        if not args.too_hard < args.too_easy:
            raise ValueError(f"need --too-hard < --too-easy, got {args.too_hard}, {args.too_easy}")
        if args.out == args.data:
            raise ValueError("--out must not be the input file")
        if not args.data.endswith((".jsonl", ".parquet")):
            raise ValueError(f"{args.data}: curate writes the kept rows as the input wrote "
                             "them, so it reads .jsonl or .parquet files")
        task, tok, sampling, engine, weights, width = _setup(args)
    except (ValueError, OSError, TypeError, DataError) as e:
        print(f"locojax curate: {own_flags(str(e))}", file=sys.stderr)
        return 2
    rows = task.test  # --data as a held-out split: a Dataset, which knows what it skipped
    examples = list(rows)[:args.limit or None]
    if getattr(rows, "skipped", 0):
        print(f"skipped {rows.skipped} invalid rows of {args.data}; first: {rows.problems[0]}")
    n = len(examples)
    print(f"scoring {n} prompts x {args.k} samples with {args.model} ...", flush=True)
    scored = curate.score(engine, weights, tok, task, examples, args.k, sampling, width,
                          min(args.batch_size, n), args.seed)
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


def _setup(args: CurateArgs):
    """The task (its rows, reward, prompt width), tokenizer, sampling, engine and weights,
    by the builder's parts (locojax/train/build.py), as `train` would make them."""
    from locojax.envs import data_lengths, registry
    from locojax.train import build
    from locojax.train.config import RolloutConfig

    task = registry.build(registry.TaskConfig(
        name=args.task, data=args.data, test_data=args.data, template=args.template,
        skip_invalid=args.skip_invalid, reward=args.reward, reward_weights=args.reward_weights,
        format_weight=args.format_weight, prompt_field=args.prompt_field,
        answer_field=args.answer_field), args.seed)
    if task.multi_turn:
        raise ValueError(f"task {args.task!r} is multi-turn: curate scores single-turn rows")
    tok = build.tokenizer_of(args.model, args.template)
    task, prompts = data_lengths.fit(task, tok, args.max_prompt_tokens, args.skip_invalid)
    print(f"prompts: {prompts.describe(args.max_prompt_tokens)}", flush=True)
    sampling = build.sampling_of(RolloutConfig(
        max_new_tokens=args.max_new_tokens, max_prompt_tokens=prompts.max_prompt_tokens,
        temperature=args.temperature), tok)
    engine = build.engine_of(build.model_config(args.model))
    weights = build.weights_of(args.model, args.seed)
    return task, tok, sampling, engine, weights, prompts.max_prompt_tokens
