"""What `--batch-invariant` costs: the learner's update and a generate, default against
batch-invariant kernels (`locojax/model/invariant.py`), interleaved in one run.

    python -m benchmarks.bench_invariant [--shape tiny|small] [--rounds 5]

Per arm, one round times (each blocked until ready, after a compile and a warm call):
`learn`, the gradient of the summed logprobs of the rollout's rows (the train step's
forward and backward, `logprobs.sequence_logprobs` with remat off), and `generate`, the
engine's whole generate (prefill + decode, exactly N tokens a row). Arms alternate their
order each round; the median of each is printed with its ratio to the default kernels.
Shapes: docs/design.md's canonical TINY and SMALL (prompts x G, P prompt tokens, N new).
A third arm, `no-option`, runs the batch-invariant kernels compiled without their backend's
per-program options (`locojax/model/invariant_jit.py`: excess precision off on an
accelerator, LLVM -O0 on XLA:CPU): the options' own cost, apart from the kernels'.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness
from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config, invariant_jit, params
from locojax.rl import logprobs

SHAPES = {"tiny": (config.tiny, 8, 4, 16, 32), "small": (config.small, 16, 8, 32, 64)}
"""name -> (model preset, prompts, G, P, N)."""


def option_off():
    """A context in which batch-invariant programs compile without their backend's options:
    held over each call of the `no-option` arm, so its programs are traced, compiled and run
    under it."""
    return mock.patch.object(invariant_jit, "backend_options", lambda: {})


def arms(shape: str, invariant: bool, option: bool = True) -> dict:
    """The two timed calls of one arm, compiled and warmed; `option` False: see `option_off`."""
    context = contextlib.nullcontext if option else option_off
    with context():
        return _arms(shape, invariant, context)


def _arms(shape: str, invariant: bool, context) -> dict:
    preset, b, g, p, n = SHAPES[shape]
    cfg = preset(batch_invariant=invariant)
    w = params.init(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, cfg.vocab_size, (b, p)).astype(np.int32)
    sampling = SamplingConfig(max_new_tokens=n, temperature=1.0, ignore_eos=True)
    engine = Engine(cfg)
    out = engine.generate(w, prompts, jax.random.key(0), sampling, num_samples=g)
    tokens = jnp.concatenate([jnp.repeat(jnp.asarray(prompts), g, 0), out.tokens], axis=1)
    positions = jnp.broadcast_to(jnp.arange(p + n, dtype=jnp.int32), tokens.shape)
    mask = jnp.ones(tokens.shape, bool)
    grad = jax.jit(jax.grad(lambda w: jnp.sum(logprobs.sequence_logprobs(
        w, tokens, positions, mask, cfg)[0])), compiler_options=invariant_jit.compiler_options(cfg))

    def learn():
        with context():
            jax.block_until_ready(grad(w))

    def generate():
        with context():
            jax.block_until_ready(engine.generate(w, prompts, jax.random.key(1), sampling,
                                                  num_samples=g).tokens)

    for fn in (learn, generate):
        fn()
    return {"learn": learn, "generate": generate}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(harness.header("bench_invariant", f"shape {args.shape}"))
    print(harness.command_line())
    built = {"default": arms(args.shape, False), "invariant": arms(args.shape, True)}
    if invariant_jit.backend_options():
        built["no-option"] = arms(args.shape, True, option=False)
    for what in ("learn", "generate"):
        calls = {name: (lambda f=b[what]: harness.timed(f)) for name, b in built.items()}
        times = harness.interleave(calls, args.rounds, how="alternate")
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"{what:9s} default {med['default'] * 1e3:9.1f} ms  invariant "
              f"{med['invariant'] * 1e3:9.1f} ms  {med['invariant'] / med['default']:.2f}x "
              f"vs default (median of {args.rounds})")
        if "no-option" in med:
            print(f"{what:9s} invariant without the option {med['no-option'] * 1e3:9.1f} ms: "
                  f"the option costs {med['invariant'] / med['no-option']:.2f}x")


if __name__ == "__main__":
    main()
