"""The Tunix side of `bench_peers.py`: Tunix's `GRPOLearner` on a random Qwen3, in Tunix's venv.

Set up as Tunix's own GRPO tests and examples do: an nnx `Qwen3` from
`tunix.models.qwen3.model.ModelConfig` (f32), an `RLCluster` with actor, reference and
rollout roles on ONE mesh (colocated: the rollout shares the actor's weights), the
"vanilla" rollout engine (Tunix's jitted sampler with a KV cache), `GRPOConfig(num_generations
= G, num_iterations = 1, beta)`, `optax.adamw`, and a reward function over completion texts.
The mesh is this process's one CPU device as (fsdp 1, tp 1), like locojax's `single` mode.

The tokenizer is `common.IdTokenizer`, Tunix's duck-typed interface: prompt
ids as decimal words, bos 0 (falsy, so none is prepended), pad 0, EOS = V, which the V-way
model can never sample: exactly N new tokens.

Phases: generate = `RLCluster.generate`; reference = `RLCluster.get_ref_per_token_logps`
(blocked until ready); train = the actor trainer's jitted train step (blocked until ready);
other = the rest of the step. Steps are driven through the training data iterator: Tunix
pulls one batch per GRPO step, and that pull is where a step ends and the driver is asked.
"""

from __future__ import annotations

import os
import sys
import time

from benchmarks.peers import common


def build_learner(args):
    """(learner, its cluster, mesh): Tunix's `GRPOLearner` on the random model (the docstring)."""
    import jax
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import Mesh
    from tunix.models.qwen3 import model as qwen3_lib
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner as grpo_lib
    from tunix.rl.rollout import base_rollout

    s = common.SHAPES[args.shape]
    config = qwen3_lib.ModelConfig(
        num_layers=s.layers, vocab_size=s.vocab, embed_dim=s.hidden, hidden_dim=s.ffn,
        num_heads=s.heads, head_dim=s.head_dim, num_kv_heads=s.kv_heads,
        rope_theta=int(common.ROPE_THETA), norm_eps=common.RMS_EPS,
        use_tied_embedding=True)
    mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    with mesh:
        actor = qwen3_lib.Qwen3(config, rngs=nnx.Rngs(0))
        reference = qwen3_lib.Qwen3(config, rngs=nnx.Rngs(0)) if args.beta else None
    steps = args.max_steps + 1
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh,
                      rl_cluster_lib.Role.ROLLOUT: mesh},
        rollout_engine="vanilla", offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.adamw(common.LR), eval_every_n_steps=10 ** 6,
            max_steps=steps),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=s.new_tokens, max_prompt_length=s.prompt_tokens,
            kv_cache_size=s.prompt_tokens + s.new_tokens + 8, temperature=1.0,
            top_p=1.0, top_k=None, eos_tokens=[common.eos_id(s)]))
    cluster = rl_cluster_lib.RLCluster(actor=actor, reference=reference,
                                       tokenizer=common.IdTokenizer(common.eos_id(s)),
                                       cluster_config=cluster_config)
    grpo = grpo_lib.GRPOConfig(num_generations=s.group, num_iterations=1, beta=args.beta,
                               epsilon=0.2)

    def even_reward(prompts, completions, **_):
        return [common.even_fraction(c) for c in completions]

    learner = grpo_lib.GRPOLearner(rl_cluster=cluster, reward_fns=even_reward,
                                   algo_config=grpo)
    return learner, cluster, mesh


def timed_phases(cluster) -> common.PhaseClock:
    """Wrap the cluster's phases so each step's time goes to its `PhaseClock`."""
    import jax

    clock = common.PhaseClock()
    cluster.generate = clock.timed("generate", cluster.generate)
    cluster.get_ref_per_token_logps = clock.timed("reference", cluster.get_ref_per_token_logps,
                                                  jax.block_until_ready)
    trainer = cluster.actor_trainer
    jit_both = trainer.jit_train_and_eval_step

    class TimedStep:
        """The jitted train step, blocked until done so its time is device time."""

        def __init__(self, fn):
            self.fn, self.func = fn, getattr(fn, "func", None)

        def __call__(self, *a, **k):
            return clock.timed("train", self.fn, jax.block_until_ready)(*a, **k)

    def jit_timed(*a, **k):
        train_step, eval_step = jit_both(*a, **k)
        return TimedStep(train_step), eval_step

    trainer.jit_train_and_eval_step = jit_timed
    return clock


def main(argv=None) -> int:
    args = common.worker_args(argv)
    channel = common.Channel()
    t_setup = time.perf_counter()
    with channel.reporting("setup: "):
        import flax
        import jax
        import numpy as np
        import optax

        learner, cluster, mesh = build_learner(args)
    clock = timed_phases(cluster)
    versions = {"tunix": "0.1.7", "jax": jax.__version__, "flax": flax.__version__,
                "optax": optax.__version__}
    try:
        import importlib.metadata as md
        versions["tunix"] = md.version("google-tunix")
    except Exception:  # noqa: BLE001 (the version string is informational)
        pass
    driven = common.Driven(channel, versions, t_setup, args.warmup)
    s = common.SHAPES[args.shape]

    def batches():
        """One batch per GRPO step; each pull (after the first) ends the previous step."""
        t0 = time.perf_counter()
        for step in range(args.max_steps + 1):
            if step:
                if not driven.end_step(clock.close_step(step - 1, time.perf_counter() - t0)):
                    return
                t0 = time.perf_counter()
            yield {"prompts": np.asarray([common.to_text(p) for p in common.prompts(s, step)])}

    with channel.reporting(), mesh:
        learner.train(batches())
    os._exit(0)  # Tunix's executor threads and loggers need not be torn down


if __name__ == "__main__":
    sys.exit(main())
