"""Which `locojax train` config fields `locojax predict train` consumes: every field of
`RunConfig` is in exactly one of three tables, so that no flag is silently ignored.

- HONOURED: the prediction reads it (the text says how);
- REFUSED: it changes the step's cost in a way the model does not cost; a value other than
  the field's default is refused, naming the flag and why;
- IRRELEVANT: it does not change a steady step's time or memory (the text says why).

tests/test_predict_train_fields.py walks every field of `RunConfig` and fails when one is
in none of the tables (a new train flag must be placed here) or in a table but no longer a
field. `locojax predict fields` prints the tables (docs/pod_scale.md holds a run of it).
"""

from __future__ import annotations

import dataclasses

HONOURED = {
    "mode": "which modes are predicted (only this one when --mode is given)",
    "model": "the shapes costed (spec.py)",
    "task.name": "host rates per row (reward, env) and multi-turn turns",
    "task.data": "completion lengths from the file's reference solutions; a path that does "
                 "not exist is refused",
    "steps": "hours and chip-hours of the whole run",
    "rollout.prompts_per_step": "B",
    "rollout.max_new_tokens": "N",
    "rollout.max_prompt_tokens": "P",
    "rollout.ignore_eos": "every completion exactly N",
    "rollout.cache_dtype": "KV cache bytes (memory and decode reads)",
    "rollout.tp": "rollout tensor parallelism (chips per copy of the weights); at most a "
                  "host's chips",
    "algo.group_size": "G",
    "algo.beta": "the reference model's forward and memory",
    "algo.ppo_epochs": "train compute and gradient all-reduces per step, times the epochs",
    "algo.num_minibatches": "one gradient all-reduce per mini-batch",
    "multi_turn.max_turns": "model turns per trajectory (calc, swe)",
    "multi_turn.max_obs_tokens": "the extend prefill after each env turn",
    "multi_turn.max_trajectory_tokens": "M: the cache's and the train batch's columns",
    "multi_turn.env_workers": "env threads per host",
    "precision": "compute dtype (FLOPs' peak, weight and cache bytes)",
    "remat": "on / off fixes it; auto lets the layout choose",
    "grad_accum": "micro-batches of the train step (memory)",
    "offload": "auto: where a layout does not fit, the reference, then the moments, in host "
               "memory as the plan keeps them (the copies' time is not costed)",
    "device_memory_gb": "memory per chip the layout must fit (replaces the profile's HBM)",
    "devices_per_host": "single: the simulated devices (the cluster's chips)",
    "controller.decode_chunk": "controller: decode iterations per round trip",
    "train.mesh": "data x fsdp of the learner (FSDP sharding, its all-gathers); must cover "
                  "the learner's chips",
    "placement.hosts": "Ray modes: the hosts on this machine (default cpu-here cluster)",
    "placement.rollout_fraction": "disaggregated: hosts on rollout",
    "placement.workers": "async: rollout workers",
    "placement.learner_hosts": "async: learner hosts",
    "placement.max_staleness": "k of the buffered modes' simulation",
    "placement.prompts_per_lease": "prompts per leased unit in the buffered modes",
    "lora.rank": "LoRA: optimizer state, gradients and all-reduce of the adapters; the frozen "
                 "base held and read; a backward without the base's weight gradients",
    "lora.targets": "LoRA: which adapters, so their parameters",
    "lora.base_dtype": "LoRA: the frozen base's bytes",
}

REFUSED = {
    "rollout.tail_median": "per-row length caps (a benchmark's long tail) are not costed",
    "rollout.tail_sigma": "per-row length caps (a benchmark's long tail) are not costed",
    "dynamic.max_rounds": "refill rounds generate a data-dependent number of extra groups",
    "multi_turn.max_cache_slots": "the cache is costed at P + M slots, not a cap",
    "reward.isolation": "host rates were measured with isolation auto",
    "reward.workers": "host rates were measured with 2 reward workers",
    "task.sandbox": "the env rate was measured with the sandbox auto picks",
    "task.prompt_field": "lengths are read from prompt/question/problem fields; pass "
                         "--lengths-from RUN_DIR (a rollout dump)",
    "task.answer_field": "lengths are read from answer/solution fields; pass --lengths-from "
                         "RUN_DIR (a rollout dump)",
    "placement.verifiers": "rewards are costed on the worker, not on verifier actors",
    "rollout.weights_dtype": "decode's weight bytes and dots are costed in the compute dtype",
    "rollout.refill_slots": "decode is costed as one batch of the step's rows, not R slots",
    "rollout.refill_at": "decode is costed as one batch of the step's rows, not R slots",
    "rollout.waves": "decode is costed as one batch of the step's rows, not in waves",
    "placement.inflight_chunk": "the async simulation swaps versions between units only",
    "placement.partial_rollouts": "the async simulation trains each step's own units",
    "batch_invariant": "the cost model prices XLA's own kernels, not the fixed-order ones",
}

IRRELEVANT = {
    "lora.alpha": "a constant factor on the adapters' product",
    "task.level": "arith difficulty: lengths come from ignore_eos, data or the cap",
    "task.test_data": "evaluation is outside the steady step",
    "task.template": "prompts are padded to P whatever the template",
    "task.autosubmit": "when a trajectory stops, not its cap (turns are costed at the cap)",
    "task.train_size": "how many prompts exist, not a step's",
    "task.skip_invalid": "data loading, before the first step",
    "task.reward": "costed at the task's measured reward rate per row",
    "task.reward_weights": "weights of the rewards, not their cost",
    "task.split": "which rows are read, not their shapes",
    "task.test_split": "evaluation is outside the steady step",
    "task.format_weight": "a weight of the reward, not its cost",
    "seed": "values, not costs",
    "run_dir": "where output goes",
    "rollout.temperature": "sampling: elementwise over the logits (in the decode step)",
    "rollout.top_k": "sampling filters are not costed (a sort over V per row per step)",
    "rollout.top_p": "sampling filters are not costed (a sort over V per row per step)",
    "algo.name": "the objective is elementwise over [R, T]",
    "algo.kl_estimator": "elementwise (the reference forward is beta's)",
    "algo.eps_low": "elementwise clipping",
    "algo.eps_high": "elementwise clipping",
    "algo.dual_clip": "elementwise clipping",
    "algo.loss_agg": "a reduction's denominator",
    "algo.max_response_len": "Dr.GRPO's constant",
    "algo.scale_by_std": "advantage normalisation over R values",
    "algo.adv_eps": "advantage normalisation over R values",
    "algo.is_cap": "elementwise importance weight",
    "algo.is_all_samples": "elementwise importance weight",
    "optim.lr": "values, not costs (AdamW's update is in the train step's bytes)",
    "optim.warmup_steps": "the schedule's values",
    "optim.decay_steps": "the schedule's values",
    "optim.min_lr_ratio": "the schedule's values",
    "optim.b1": "AdamW's values",
    "optim.b2": "AdamW's values",
    "optim.eps": "AdamW's values",
    "optim.weight_decay": "AdamW's values",
    "optim.max_grad_norm": "one norm over the gradients",
    "optim.hf_padding_idx": "one row's gradient masked (elementwise)",
    "skip_nonfinite": "what happens on a NaN, not a step's cost",
    "reward.timeout_s": "a deadline, not a cost",
    "reward.load_timeout_s": "a deadline at start",
    "multi_turn.env_timeout_s": "a deadline, not a cost",
    "curation.enabled": "which prompts are admitted; a step stays B x G",
    "curation.too_easy": "curation's thresholds",
    "curation.too_hard": "curation's thresholds",
    "curation.readmit_after": "curation's schedule",
    "curation.keep_prob": "curation's schedule",
    "curation.memory": "curation's statistics",
    "dynamic.overlong_filter": "a mask over the loss",
    "multi_turn.compact": "every row is costed for every turn, the worst case either way",
    "dynamic.overlong_buffer": "a reward shaping (elementwise)",
    "dynamic.overlong_penalty": "a reward shaping (elementwise)",
    "eval.every": "evaluation is outside the steady step",
    "eval.num_examples": "evaluation is outside the steady step",
    "eval.batch_size": "evaluation is outside the steady step",
    "checkpoint.every": "checkpoint steps are outside the steady step",
    "checkpoint.keep": "checkpoint steps are outside the steady step",
    "checkpoint.resume": "where a run starts",
    "checkpoint.resume_force": "where a run starts",
    "checkpoint.export_dtype": "the export after the last step",
    "profile_dir": "a trace of steps 2-4 only",
    "tensorboard": "a few scalars per step",
    "report_to": "a few scalars per step, to a tracker",
    "progress": "a progress bar",
    "probe_allreduce": "timed apart from the step",
    "profile_split": "timing instrumentation: the step is costed fused (the validation reads "
                     "its phases from the split step, benchmarks/validate_predict.py)",
    "dump_rollouts": "written after the step's phases",
    "logprob_chunk": "memory: the analytic plan sizes the logits with its own chunk",
    "plan_only": "`locojax train --plan-only` prints XLA's plan; predict prints its own",
    "time_limit_s": "when the run stops (steps bounds the hours)",
    "placement.versions_kept": "parameter-server memory on the host",
    "placement.lease_timeout_s": "failure handling",
    "placement.start_timeout_s": "failure handling",
    "placement.max_attempts": "failure handling",
    "placement.stall_warning_s": "a warning",
    "placement.verifier_timeout_s": "failure handling",
    "placement.ray_address": "which Ray cluster",
    "placement.ray_cpus": "Ray's CPU accounting",
}

NO_PREFIX = ("placement",)  # tyro.conf.OmitArgPrefixes: --hosts, not --placement.hosts


def flag(path: str) -> str:
    """The command-line flag of a field path: `algo.num_minibatches` -> --algo.num-minibatches."""
    head, _, rest = path.partition(".")
    name = rest if head in NO_PREFIX and rest else path
    return "--" + name.replace("_", "-")


def fields(cls=None, prefix: str = "") -> dict[str, object]:
    """Every leaf field of the run config, by dotted path, with its default."""
    if cls is None:
        from locojax.train.config import RunConfig

        cls = RunConfig
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            out.update(fields(type(default), f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = default
    return out


def value(cfg, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check(cfg) -> None:
    """Refuse, by flag, every REFUSED field of `cfg` set away from its default."""
    defaults = fields()
    bad = [f"{flag(p)} {value(cfg, p)!r} ({why})" for p, why in REFUSED.items()
           if value(cfg, p) != defaults[p]]
    if bad:
        raise ValueError("predict does not cost " + "; ".join(bad)
                         + ". Leave it at its default to predict the rest of the run")


def table() -> str:
    """The three tables as one markdown table (`locojax predict fields`)."""
    lines = ["| flag | predict | how / why |", "|---|---|---|"]
    for kind, t in (("honoured", HONOURED), ("refused", REFUSED),
                    ("irrelevant", IRRELEVANT)):
        lines += [f"| `{flag(p)}` | {kind} | {why} |" for p, why in t.items()]
    return "\n".join(lines)
