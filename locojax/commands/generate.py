"""`locojax generate`: sample from a model with the jitted engine and report tokens/s.

    locojax generate --model tiny --prompt "2+3=" --batch 4 --max-new-tokens 32
    locojax generate --model path/to/hf_dir --prompt "Hello" --temperature 0 --template chat

`--model` is a spec of `locojax.model.loader.load`: `embedded`, a preset (`tiny`, `small`:
random weights, for timing) or an HF directory, with its tokenizer. The model, tokenizer,
sampling and engine are made by the builder training uses (`locojax/train/build.py`): f32
weights computing in `--precision`, as a run's rollout samples them. Compile time (the first
call) is reported apart from the steady-state time of a second, identical call.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Literal

import tyro


@dataclasses.dataclass(frozen=True)
class GenerateArgs:
    """Sample completions of one prompt with the jitted engine."""

    model: str = "tiny"
    """A shipped checkpoint (embedded, embedded-strict, embedded-calc), a preset with random
    weights (tiny, small, char_demo), or an HF checkpoint directory: Qwen3, Qwen2/2.5, Llama
    3.x or Gemma 3 (text)."""
    prompt: str = "Hello"
    """Prompt text, encoded with the model's tokenizer."""
    template: Literal["plain", "qwen", "chat"] = "plain"
    """How the prompt is sent, as in `train`/`eval`: plain text; qwen (one user turn of
    hand-written ChatML); chat (one user turn of the checkpoint's own chat template, from
    its tokenizer_config.json or chat_template.jinja)."""
    batch: int = 4
    """Number of samples of the prompt (one prefill, cache repeated)."""
    max_new_tokens: int = 32
    """Most tokens generated per sample."""
    temperature: float = 1.0
    """Sampling temperature; 0 is greedy."""
    top_k: int = 0
    """Top-k truncation (0 = off)."""
    top_p: float = 1.0
    """Nucleus truncation (1.0 = off)."""
    ignore_eos: bool = False
    """Generate exactly max_new_tokens (for timing)."""
    precision: Literal["f32", "bf16"] = "f32"
    """Compute dtype (weights are held in f32, as in training)."""
    seed: int = 0
    """PRNG seed of the weights (presets) and of the samples."""
    show: int = 4
    """How many samples to print."""


def main(argv: list[str]) -> int:
    args = tyro.cli(GenerateArgs, args=argv, prog="locojax generate")
    import jax

    from locojax.train import build
    from locojax.train.config import RolloutConfig

    try:
        if args.batch < 1:
            raise ValueError(f"--batch {args.batch} must be >= 1")
        cfg = build.model_config(args.model, args.precision)
        tok = build.tokenizer_of(args.model, args.template)
        if tok.vocab_size > cfg.vocab_size:
            raise ValueError(f"tokenizer has {tok.vocab_size} ids but the model only "
                             f"{cfg.vocab_size}")
        text = (tok.apply_chat_template([{"role": "user", "content": args.prompt}])
                if args.template != "plain" else args.prompt)
        ids = tok.encode(text)
        sampling = build.sampling_of(RolloutConfig(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            top_k=args.top_k, top_p=args.top_p, ignore_eos=args.ignore_eos), tok)
        weights = build.weights_of(args.model, args.seed, args.precision)
    except (ValueError, OSError) as e:
        print(f"locojax generate: {e}", file=sys.stderr)
        return 2

    engine = build.engine_of(cfg)
    key = jax.random.key(args.seed)

    def run(k):
        t0 = time.perf_counter()
        out = engine.generate(weights, [ids], k, sampling, num_samples=args.batch)
        jax.block_until_ready(out)
        return out, time.perf_counter() - t0

    _, first = run(jax.random.fold_in(key, 1))
    out, steady = run(key)
    tokens, lengths = jax.device_get((out.tokens, out.lengths))
    for i in range(min(args.show, args.batch)):
        completion = tok.decode(tokens[i, :lengths[i]].tolist())
        print(f"--- sample {i} ({int(lengths[i])} tokens)\n{text}{completion}")
    generated = int(lengths.sum())
    print(f"\nmodel {args.model}: {cfg.num_params():,} params, {args.batch} samples, prompt "
          f"{len(ids)} tokens, {generated} tokens generated in {steady:.3f} s = "
          f"{generated / steady:,.0f} tokens/s (decode steps {int(out.steps) + 1}); "
          f"compile {max(first - steady, 0.0):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
