"""The locojax side of `bench_peers.py`: the GRPO step of `locojax train --mode single`.

The same parts, in the same order, as `Trainer.step` (`locojax/train/loop.py`): the Single
wiring's one-device mesh, `Engine.prefill` + `Engine.decode` (jitted, KV cache, behaviour
logprobs), detokenize and score on the host, group advantages, `batch.from_rollout`, the cut
to the step's bucket (`buckets.fit`: nothing to cut here, every token is real) and
`global_batch`, then `train_step.update` (one AdamW step; at β > 0 `update` runs the
reference forward first, as its own program, so locojax's reference time is part of `train`).
Run by the driver in locojax's own environment, as `python -m benchmarks.peers.locojax_worker`.
"""

from __future__ import annotations

import sys
import time

from benchmarks.engine_work import generate_flops
from benchmarks.peers import common


def step_flops(cfg, s, beta: float) -> dict:
    """Matmul FLOPs of one locojax GRPO step at shape `s`, as its code does them.

    generate: `engine_work.generate_flops` (each prompt prefilled once, R·(N-1) decode
    tokens). train: the shared-prefix path of `train_step` (each group's prompt forward once:
    B·P tokens; each row's N - 1 response positions; the LM head on the N positions that
    predict a target), times 3 for forward + backward, plus one forward of the reference
    policy when β > 0. Attention context is exact (causal).
    """
    head = 2 * cfg.hidden_size * cfg.vocab_size
    body = lambda ctx: cfg.flops_per_token(ctx) - head  # noqa: E731
    p, n = s.prompt_tokens, s.new_tokens
    prefix = s.prompts * sum(body(t + 1) for t in range(p))
    suffix = s.rows * sum(body(p + i + 1) for i in range(n - 1))
    forward = prefix + suffix + s.rows * n * head
    train = 3 * forward + (forward if beta else 0)
    generate = generate_flops(cfg, s, lengths=[n] * s.rows)  # exactly N each
    return {"generate": float(generate), "train": float(train), "total": float(generate + train)}


def step_runner(args):
    """(cfg, one_step): one GRPO step at the worker's shape per call, its phase record out."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from locojax.engine.engine import Engine
    from locojax.engine.sampling import SamplingConfig
    from locojax.model import params as params_lib
    from locojax.model.config import ModelConfig
    from locojax.model.sharding import TRAIN_DP, weight_shardings
    from locojax.rl import algorithms, buckets, train_state
    from locojax.rl import batch as batch_lib
    from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
    from locojax.rl.train_step import update
    from locojax.train import wiring as wiring_lib

    s = common.SHAPES[args.shape]
    cfg = ModelConfig(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.ffn,
                      num_hidden_layers=s.layers, num_attention_heads=s.heads,
                      num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
                      rope_theta=common.ROPE_THETA, rms_norm_eps=common.RMS_EPS,
                      tie_word_embeddings=True)
    wiring = wiring_lib.join("single")
    weights = jax.device_put(params_lib.init(cfg, jax.random.key(0)),
                             weight_shardings(cfg, wiring.train_mesh, TRAIN_DP))
    engine = Engine(cfg, mesh=wiring.rollout_mesh)
    learner = LearnerConfig(algo=AlgoConfig(name="grpo", group_size=s.group, beta=args.beta,
                                            max_response_len=s.new_tokens),
                            optim=OptimConfig(lr=common.LR))
    ref = jax.tree.map(jnp.copy, weights) if args.beta else None
    # No stop token at all (locojax rejects ids outside the vocabulary), and ignore_eos.
    sampling = SamplingConfig(max_new_tokens=s.new_tokens, temperature=1.0, ignore_eos=True,
                              stop_token_ids=(), pad_token_id=common.PAD_ID)
    root = jax.random.key(0)
    clock = common.PhaseClock()
    box = {"state": train_state.init(weights, learner.optim, cfg), "step": 0}

    def one_step():
        step = box["step"]
        prompt_tokens = common.prompts(s, step).astype(np.int32)
        prompt_mask = np.ones(prompt_tokens.shape, bool)
        t0 = time.perf_counter()
        pending = engine.prefill(wiring.rollout_weights(box["state"].params), prompt_tokens,
                                 jax.random.fold_in(root, step), sampling, num_samples=s.group,
                                 prompt_mask=prompt_mask)
        gen = engine.decode(pending)
        jax.block_until_ready(gen)
        clock.add("generate", time.perf_counter() - t0)
        tokens, mask, logprobs = (np.asarray(x) for x in (gen.tokens, gen.mask, gen.logprobs))
        texts = [common.to_text(row[m]) for row, m in zip(tokens, mask)]
        rewards = np.asarray([common.even_fraction(t) for t in texts], np.float32)
        group_ids = np.repeat(np.arange(s.prompts), s.group).astype(np.int32)
        adv, _ = algorithms.compute_advantages(learner.algo, rewards, group_ids)
        rows = lambda x: np.repeat(x, s.group, axis=0)  # noqa: E731
        local = batch_lib.from_rollout(rows(prompt_tokens), rows(prompt_mask), tokens, mask,
                                       logprobs, np.asarray(adv), group_ids,
                                       group_size=s.group)
        batch = wiring.global_batch(buckets.fit(local, wiring.gather_over_hosts)[0])
        t1 = time.perf_counter()
        box["state"], _ = update(box["state"], batch, cfg, learner, ref,
                                 mesh=wiring.train_mesh)
        jax.block_until_ready(box["state"].params)
        clock.add("train", time.perf_counter() - t1)
        assert tokens.shape == (s.rows, s.new_tokens) and mask.all()
        box["step"] += 1
        return clock.close_step(step, time.perf_counter() - t0)

    return cfg, one_step


def main(argv=None) -> int:
    args = common.worker_args(argv)
    channel = common.Channel()
    t_setup = time.perf_counter()
    import jax

    import locojax

    cfg, one_step = step_runner(args)
    versions = {"locojax": locojax.__dict__.get("__version__", "0.1.0"), "jax": jax.__version__,
                "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else ""}
    driven = common.Driven(channel, versions, t_setup, args.warmup,
                           flops=step_flops(cfg, common.SHAPES[args.shape], args.beta))
    with channel.reporting():
        common.serve(driven, one_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
