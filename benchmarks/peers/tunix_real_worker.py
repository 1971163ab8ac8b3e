"""The Tunix side of `bench_real_tunix.py`: Tunix's `GRPOLearner` on the real SmolLM2
checkpoint and locojax's own task, in Tunix's venv.

The model is the HF directory loaded as Tunix's nnx `Llama3` (`tunix_real_model.load`, with
its RoPE θ fix), in f32. The task is locojax's, imported from the repository as
`trl_real_worker.py` imports it: the same prompts in the same order as `locojax train` with
this seed (`train.data.PromptStream`), rendered with the checkpoint's chat template by its HF
tokenizer (Tunix's sampler encodes prompt strings; the ids are checked against locojax's own
`encode_prompt` on every batch), and the same reward function on each completion's text.

Set up as `tunix_worker.py` sets up Tunix's GRPO: an `RLCluster` with actor and rollout on
one (fsdp 1, tp 1) mesh of this process's CPU device (the rollout shares the actor's
weights; no reference model at β 0), the "vanilla" rollout engine, and `GRPOConfig(
num_generations=G, num_iterations=1, beta, epsilon, loss_agg_mode="token-mean")`. The
optimizer is `clip_by_global_norm(1.0)` then `adamw(lr, weight_decay)`, as both other sides.
Sampling is at temperature 1, top_p 1, no top_k, stopping at the tokenizer's EOS. Two
departures from Tunix's defaults, both for the same work: the rollout seed is folded with
the step (Tunix's default key is PRNGKey(0) for every step's sampling), and `load` fixes θ.
Micro-batches (`--train-micro-prompts`, `--rollout-micro-prompts`) bound memory: the update
is still one AdamW step a GRPO step, on the mean of the micro-batches' gradients
(`optax.MultiSteps`), each micro-batch's loss token-mean over its own tokens.

Writes OUT/metrics.jsonl in locojax's format (one line per step: `reward/mean`,
`perf/step_time`, `perf/phase/generate`), so `locojax plot` overlays it with the others.
A step ends when its actor update's weights are ready (`RLCluster.update_actor`, once a
step here); its reward is the mean of the step's rewards, as the reward function computed
them. With `--export DIR`, the trained model is written there as an HF directory, which
`locojax eval` scores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.peers import tunix_real_model


def locojax_batches(model: str, settings: dict, seed: int, steps: int):
    """(per-step lists of Examples, the HF tokenizer, locojax's tokenizer)."""
    from transformers import AutoTokenizer

    from locojax.envs.tasks import arith
    from locojax.model import loader
    from locojax.tokenizer.chat_template import with_chat_template
    from locojax.train.data import PromptStream

    b = settings["prompts_per_step"]
    task = arith.task(level=settings["level"], template="chat", mode=settings["reward"],
                      seed=seed)
    stream = PromptStream(task.train, seed)
    ours = with_chat_template(loader.load_tokenizer_of(model), loader.resolve_dir(model))
    return task, [stream.take(step, b, 0, b) for step in range(steps)], \
        AutoTokenizer.from_pretrained(model), ours


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--settings", required=True, help="JSON of bench_real_trl.SETTINGS")
    ap.add_argument("--train-micro-prompts", type=int, default=2,
                    help="prompts (x G rows) per gradient-accumulation micro-batch")
    ap.add_argument("--rollout-micro-prompts", type=int, default=0,
                    help="prompts (x G rows) per generate call (0: the whole step's)")
    ap.add_argument("--export", help="write the trained model here as an HF directory")
    return ap.parse_args(argv)


def build_cluster(args, s: dict, hf_tok, mesh):
    """(cluster, its rollout config, the GRPO config, the model's config): Tunix's
    `RLCluster` on the checkpoint, set up as the docstring says."""
    import optax
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner as grpo_lib
    from tunix.rl.rollout import base_rollout

    actor, cfg = tunix_real_model.load(args.model, mesh=mesh)
    p, n, b = s["max_prompt_tokens"], s["max_new_tokens"], s["prompts_per_step"]
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=n, max_prompt_length=p, kv_cache_size=p + n + 8,
        temperature=s["temperature"], top_p=1.0, top_k=None, eos_tokens=[hf_tok.eos_token_id])
    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(s["lr"], weight_decay=s["weight_decay"]))
    cluster = rl_cluster_lib.RLCluster(
        actor=actor, reference=None, tokenizer=hf_tok,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={role: mesh for role in (rl_cluster_lib.Role.ACTOR,
                                                  rl_cluster_lib.Role.REFERENCE,
                                                  rl_cluster_lib.Role.ROLLOUT)},
            rollout_engine="vanilla", offload_to_cpu=False, rollout_config=rollout,
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optimizer, eval_every_n_steps=10 ** 6,
                max_steps=args.steps, mini_batch_size=b,
                train_micro_batch_size=args.train_micro_prompts,
                rollout_micro_batch_size=args.rollout_micro_prompts or b,
                compute_logps_micro_batch_size=args.train_micro_prompts)))
    grpo = grpo_lib.GRPOConfig(num_generations=s["group_size"], num_iterations=1,
                               beta=s["beta"], epsilon=s["eps"], loss_agg_mode="token-mean")

    return cluster, rollout, grpo, cfg


def timed_steps(cluster, rollout, seed: int, rows: int, rewards: list[float], out: Path):
    """Wrap the cluster's generate (seeded per call) and actor update (a step ends with the
    update that completes its rows) to write OUT/metrics.jsonl; the clock they share."""
    import jax
    import numpy as np
    from flax import nnx

    base_key, generate, update_actor = jax.random.key(seed), cluster.generate, \
        cluster.update_actor
    clock = {"t0": time.perf_counter(), "generate": 0.0, "trained": 0, "calls": 0}
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "metrics.jsonl", "w")

    def seeded_generate(*a, **k):
        """Each generate call (a rollout micro-batch) samples with its own key."""
        rollout.seed = jax.random.fold_in(base_key, clock["calls"])
        clock["calls"] += 1
        t0 = time.perf_counter()
        result = generate(*a, **k)
        clock["generate"] += time.perf_counter() - t0
        print(f"generate: {len(result.text)} rows in {time.perf_counter() - t0:.1f} s",
              flush=True)
        return result

    def timed_update(examples, *a, **k):
        """A micro-batch's update (Tunix calls it once per micro-batch, a list of
        TrainExamples); the step ends with the update that completes its G·B rows, once the
        weights are ready. Its reward is the mean of those rows' (generated in step order)."""
        result = update_actor(examples, *a, **k)
        clock["trained"] += sum(int(ex.prompt_ids.shape[0]) for ex in examples)
        if clock["trained"] % rows:
            return result
        jax.block_until_ready(jax.tree.leaves(nnx.state(cluster.actor_trainer.model)))
        now, step = time.perf_counter(), clock["trained"] // rows
        reward = float(np.mean(rewards[(step - 1) * rows:step * rows]))
        log.write(json.dumps({"step": step, "reward/mean": reward,
                              "perf/step_time": now - clock["t0"],
                              "perf/phase/generate": clock["generate"]}) + "\n")
        log.flush()
        print(f"step {step}: reward {reward:.3f}, {now - clock['t0']:.1f} s "
              f"(generate {clock['generate']:.1f} s)", flush=True)
        clock.update(t0=now, generate=0.0)
        return result

    cluster.generate, cluster.update_actor = seeded_generate, timed_update
    return clock


def main(argv=None) -> int:
    args = parse(argv)
    s = json.loads(args.settings)

    import jax
    import numpy as np
    from jax.sharding import Mesh
    from tunix.rl.grpo import grpo_learner as grpo_lib

    from locojax.envs.prompt import encode_prompt

    task, steps, hf_tok, our_tok = locojax_batches(args.model, s, args.seed, args.steps)
    mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    cluster, rollout, grpo, cfg = build_cluster(args, s, hf_tok, mesh)
    p = s["max_prompt_tokens"]

    rewards: list[float] = []  # every completion's reward, in generation order
    texts = {}  # prompt text -> Example: the reward looks up the row's answer by its prompt
    for batch in steps:
        for ex in batch:
            texts[hf_tok.apply_chat_template(list(ex.prompt), tokenize=False,
                                             add_generation_prompt=True)] = ex

    def locojax_reward(prompts, completions, **_):
        r = [task.reward(c, texts[q]) for q, c in zip(prompts, completions)]
        rewards.extend(r)
        return r

    learner = grpo_lib.GRPOLearner(rl_cluster=cluster, reward_fns=locojax_reward,
                                   algo_config=grpo)
    clock = timed_steps(cluster, rollout, args.seed, s["prompts_per_step"] * s["group_size"],
                        rewards, Path(args.out))

    def batches():
        for batch in steps:
            text = [hf_tok.apply_chat_template(list(ex.prompt), tokenize=False,
                                               add_generation_prompt=True) for ex in batch]
            for ex, q in zip(batch, text):  # Tunix prepends BOS and dedups it: same ids
                ids = hf_tok.encode(q)
                if ids != encode_prompt(our_tok, ex) or len(ids) > p:
                    raise ValueError(f"prompt of {ex.id}: HF ids differ from locojax's or "
                                     f"exceed {p} tokens")
            yield {"prompts": np.asarray(text)}

    import importlib.metadata as md
    print(f"tunix {md.version('google-tunix')} jax {jax.__version__} "
          f"loss_agg_mode {grpo.loss_agg_mode} epsilon {grpo.epsilon} beta {grpo.beta}",
          flush=True)
    clock["t0"] = time.perf_counter()
    with mesh:
        learner.train(batches())
    if args.export:
        tunix_real_model.export(cluster.actor_trainer.model, cfg, args.model, args.export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
