"""The train step's memory as XLA compiles it, against the memory plan's expectation.

    python -m benchmarks.train_step_memory                 # every configuration below
    python -m benchmarks.train_step_memory 0.6b-remat 0.6b # some of them

Compile only, from abstract shapes: nothing is allocated, so the 0.6B configurations need no
more than a compile's memory. For each, XLA's per-device arguments, aliased outputs and
temporaries (`compiled.memory_analysis()`), and `memory_plan.expected_train_temporaries`.
A configuration's batch carries the shared prefix a run's batch has (`TrainBatch.
shared_prefix`: P prompt columns, groups of G rows) unless its name ends in `-noprefix`.

`--xla-only` uses nothing newer than locojax's first train step (params.abstract,
train_state.optimizer, TrainState, train_step.train_step; so no shared prefix either), so it
also measures an older checkout: `git archive REV locojax | tar -x -C DIR`, then run with
PYTHONPATH=DIR.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp

from locojax.model import config, params
from locojax.rl import batch as batch_lib
from locojax.rl import train_state, train_step
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig

QWEN3_0_6B = dict(vocab_size=151_936, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128)
NARROW = dict(vocab_size=151_936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16)
BF16 = {"compute_dtype": "bfloat16"}
REAL = (8, 192, (160, 2))  # bench_real_size.py: 4 prompts x G 2, 160 prompt + 32 new tokens
GSM8K = (256, 768, (256, 8))  # the gsm8k preset: 32 prompts x G 8, 256 prompt + 512 new
SMOLLM2 = dict(model_type="llama", vocab_size=49_152, hidden_size=576, intermediate_size=1536,
               num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
               rope_theta=100_000.0, tie_word_embeddings=True)  # SmolLM2-135M-Instruct
GSM8K_128 = (32, 384, (256, 4))  # issue 56 item 5: 8 GSM8K chat prompts (bucket 256) x G 4, 128 new
# name: (model overrides, rows, columns, (P, G) of the shared prefix, learner overrides)
CONFIGS = {
    "0.6b": (QWEN3_0_6B, *REAL, {}),
    "0.6b-noprefix": (QWEN3_0_6B, *REAL, {}),
    "0.6b-chunk32": (QWEN3_0_6B, *REAL, {"logprob_chunk": 32}),
    "0.6b-remat": (QWEN3_0_6B, *REAL, {"remat": True}),
    "0.6b-remat-noprefix": (QWEN3_0_6B, *REAL, {"remat": True}),
    "0.6b-bf16": ({**QWEN3_0_6B, **BF16}, *REAL, {}),
    "0.6b-remat-bf16": ({**QWEN3_0_6B, **BF16}, *REAL, {"remat": True}),
    "0.6b-4l-accum2-beta": ({**QWEN3_0_6B, "num_hidden_layers": 4}, *REAL,
                            {"grad_accum": 2, "beta": 0.04}),
    "gsm8k-narrow": (NARROW, *GSM8K, {}),
    "gsm8k-narrow-remat": (NARROW, *GSM8K, {"remat": True}),
    "gsm8k-narrow-remat-bf16": ({**NARROW, **BF16}, *GSM8K, {"remat": True}),
    "gsm8k-narrow-remat-noprefix": (NARROW, *GSM8K, {"remat": True}),
    "smollm2-gsm8k128": (SMOLLM2, *GSM8K_128, {}),
    "smollm2-gsm8k128-remat": (SMOLLM2, *GSM8K_128, {"remat": True}),
    "small": (dataclasses.asdict(config.small()), 128, 96, (48, 8), {}),
    "small-noprefix": (dataclasses.asdict(config.small()), 128, 96, (48, 8), {}),
    "tiny": (dataclasses.asdict(config.tiny()), 32, 48, (16, 4), {}),
}


def _abstract_inputs(cfg, learner, rows, columns, prefix):
    """State and batch as ShapeDtypeStructs, using only long-standing APIs (and the batch's
    `shared_prefix` when `prefix` is not None)."""
    shapes = params.abstract(cfg)
    opt = jax.eval_shape(train_state.optimizer(learner.optim, cfg).init, shapes)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    state = train_state.TrainState(shapes, opt, scalar, scalar)

    def per(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype)

    tok = (rows, columns)
    batch = batch_lib.TrainBatch(
        tokens=per(tok, jnp.int32), positions=per(tok, jnp.int32), attn_mask=per(tok, bool),
        loss_mask=per(tok, bool), advantages=per((rows,), jnp.float32),
        old_logprobs=per(tok, jnp.float32), group_id=per((rows,), jnp.int32),
        **({"shared_prefix": batch_lib.SharedPrefix(*prefix)} if prefix else {}))
    return state, batch


def measure(name: str, xla_only: bool) -> None:
    model, rows, columns, prefix, extra = CONFIGS[name]
    if xla_only or name.endswith("-noprefix"):
        prefix = None
    cfg = config.ModelConfig(**model)
    extra = dict(extra)
    beta = extra.pop("beta", 0.0)
    learner = LearnerConfig(algo=AlgoConfig(group_size=2, beta=beta), optim=OptimConfig(lr=1e-6),
                            **extra)
    state, batch = _abstract_inputs(cfg, learner, rows, columns, prefix)
    t0 = time.perf_counter()
    compiled = train_step.train_step.lower(state, batch, state.params if beta else None,
                                           model_cfg=cfg, cfg=learner).compile()
    seconds = time.perf_counter() - t0
    m = compiled.memory_analysis()
    gb = lambda b: f"{b / 1e9:6.2f}"  # noqa: E731
    shared = f"P {prefix[0]:3d} G {prefix[1]}" if prefix else "no prefix"
    line = (f"{name:28s} {rows:4d} x {columns:<4d} {shared:9s} args "
            f"{gb(m.argument_size_in_bytes)} aliased {gb(m.alias_size_in_bytes)} temporaries "
            f"{gb(m.temp_size_in_bytes)} GB")
    if not xla_only:
        from locojax.train.memory_plan import expected_train_temporaries

        expected = expected_train_temporaries(cfg, learner, rows, columns, devices=1,
                                              prefix=batch.shared_prefix)
        total = sum(expected.values())
        line += (f" | expected {gb(total)} GB, XLA/expected {m.temp_size_in_bytes / total:.2f}"
                 f" ({', '.join(f'{k} {v / 1e9:.2f}' for k, v in expected.items())})")
    print(line + f" [compile {seconds:.0f} s]", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="*", help=f"some of {', '.join(CONFIGS)} (default: all)")
    ap.add_argument("--xla-only", action="store_true", help="skip the plan's expectation")
    args = ap.parse_args()
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from {', '.join(CONFIGS)}")
    print(f"jax {jax.__version__}, {jax.default_backend()}; per device, 1 device; GB = 1e9 B")
    for name in args.configs or list(CONFIGS):
        measure(name, args.xla_only)


if __name__ == "__main__":
    main()
