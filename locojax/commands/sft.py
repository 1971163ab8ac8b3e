"""`locojax sft`: train a fresh char-level model on a built-in task's demonstrations.

This is how the shipped arith checkpoints were made: `embedded` (mostly the loose answer
format) and `embedded-strict` (the `demo` preset's: strict format, arithmetic half learned):

    locojax sft --out locojax/assets/tiny-arith --level 2 --sft.steps 1150 --loose-format 0.6
    locojax sft --out locojax/assets/tiny-arith-strict --arch tiny --level 2 --sft.steps 600 \
        --sft.schedule-steps 1150

The output is an HF-format Qwen3 directory plus `locojax.json` naming the tokenizer and
recording how it was made, so `locojax train --model DIR` can start GRPO from it.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import tyro

from locojax.sft import SFTConfig


@dataclasses.dataclass(frozen=True)
class SFTArgs:
    """Supervised fine-tuning of a fresh char-level model on built-in task demonstrations."""

    out: str
    """Output directory (HF Qwen3 checkpoint + locojax.json)."""
    task: str = "arith"
    """Built-in task whose demonstrations to learn: arith or calc."""
    level: int = 3
    """Task difficulty level."""
    arch: str = "char_demo"
    """Model shape preset (see locojax.model.config.PRESETS)."""
    sft: SFTConfig = SFTConfig()
    """Optimisation settings."""
    eval_examples: int = 200
    """Held-out problems for the greedy accuracy printed at the end (0 to skip)."""
    loose_format: float = 0.0
    """arith only: the fraction of demonstrations whose last line reads `The answer is N`
    instead of the `#### N` the strict reward requires. The embedded checkpoint learned from
    such a mix, which leaves GRPO a format to enforce (README, "The embedded checkpoints")."""
    direct: float = 0.0
    """calc only: the fraction of demonstrations that answer at once (`#### N`) instead of
    calling the calculator first. The tiny-calc checkpoint learned from such a mix, which
    leaves GRPO a tool call to discover (docs/calc_demo.md)."""
    save_dtype: str = "float32"
    """dtype of the saved weights: float32, or bfloat16 (half the size; the tiny-calc
    checkpoint ships so, to stay under 2 MB). They load as float32 either way."""


def main(argv: list[str]) -> int:
    args = tyro.cli(SFTArgs, args=argv, prog="locojax sft")
    import jax

    from locojax import sft
    from locojax.envs.registry import make_task
    from locojax.envs.tasks import arith, calc
    from locojax.model import config as model_config
    from locojax.model import loader
    from locojax.model import params
    from locojax.tokenizer import CharTokenizer

    try:
        task = make_task(args.task, level=args.level, seed=args.sft.seed)
        if not 0.0 <= args.loose_format <= 1.0:
            raise ValueError(f"--loose-format must be in [0, 1], got {args.loose_format}")
        if args.loose_format and args.task != "arith":
            raise ValueError(f"--loose-format applies to the arith task only, not {args.task!r}")
        if not 0.0 <= args.direct <= 1.0:
            raise ValueError(f"--direct must be in [0, 1], got {args.direct}")
        if args.direct and args.task != "calc":
            raise ValueError(f"--direct applies to the calc task only, not {args.task!r}")
        if args.save_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--save-dtype must be float32 or bfloat16, got {args.save_dtype!r}")
        if args.arch not in model_config.PRESETS:
            raise ValueError(f"unknown arch {args.arch!r}; choose from {list(model_config.PRESETS)}")
    except (ValueError, TypeError) as e:
        print(f"locojax sft: {e}", file=sys.stderr)
        return 2
    tok = CharTokenizer()
    cfg = model_config.PRESETS[args.arch]()
    weights = params.init(cfg, jax.random.key(args.sft.seed))

    def demo(example, rng):
        if args.loose_format and rng.random() < args.loose_format:
            return arith.loose_format_demo(example)
        if args.direct and rng.random() < args.direct:
            return calc.direct_demo(example)
        return task.demo(example)

    def sample_batch(rng, n):
        idx = rng.integers(0, len(task.train), n)
        return [sft.demo_sequence(tok, demo(task.train[int(i)], rng)) for i in idx]

    start = time.perf_counter()

    def on_step(i, loss, _weights):
        if i % 50 == 0 or i == args.sft.steps - 1:
            print(f"step {i:5d}  loss {loss:.4f}  ({time.perf_counter() - start:.0f}s)", flush=True)

    weights = sft.train(weights, cfg, args.sft, sample_batch, tok.pad_id, on_step)
    meta = {"tokenizer": "char", "task": args.task, "level": args.level, "arch": args.arch,
            "loose_format": args.loose_format, "direct": args.direct,
            "save_dtype": args.save_dtype, "made_by": "locojax sft " + " ".join(argv),
            "sft": dataclasses.asdict(args.sft)}
    out = loader.save(args.out, cfg, weights, args.arch, meta, dtype=args.save_dtype)
    print(f"saved {out}")
    if args.save_dtype != "float32":  # evaluate what was saved, not the f32 weights
        weights = loader.load(str(out), param_dtype="float32").weights
    if args.eval_examples:
        from locojax.evaluate import greedy_eval

        res = greedy_eval(weights, cfg, tok, task, args.eval_examples)
        print(f"held-out greedy accuracy: {res['eval/accuracy']:.3f} on {args.eval_examples} "
              "problems")
        if task.multi_turn:
            alone = res.get("eval/accuracy_no_tool")  # absent when every answer used a tool
            print(f"tool-call rate {res['eval/tool_call_rate']:.3f}, accuracy without a tool "
                  f"call {'n/a' if alone is None else f'{alone:.3f}'}")
    return 0
