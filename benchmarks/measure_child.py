"""One host's step of a `locojax train` run, built by the run's own builder and timed on
this machine: what `predict_programs measure` runs in a child process per host
(`measure.py` starts them and reads their times).

    python -m benchmarks.measure_child SPEC.json

SPEC: {"argv": the run's train arguments (each host takes its share of the prompts as the
run's hosts do, `host_slice`), "mode": single or colocated, "devices": the devices of that
process, "reps": timed repetitions after the warm-ups (`WARMUPS`), "limits": each rollout
row's most tokens or null, "coordinator": the hosts' meeting address or "", "host": this
host's index, "hosts": how many, "out": where the times go (JSON)}.

Everything timed is the run's own code at the run's exact shape: `RunParts.of` builds the
parts, `wiring.join` joins the hosts as the run does (colocated hosts: one process each,
joined by `jax.distributed`, so the train step is the run's multi-process program with its
gradient all-reduce, and the batch's gather and the metrics' sum are the run's
collectives), `loop.plan_memory` compiles the programs. Per repetition, in the run's order:
`reshard` (the training layout to the engine's), `prefill` and `decode` (the engine's loop,
compacting finished rows to `engine.MIN_ROWS`: the waves of a batch whose rows end at
different lengths, given by `limits`), `detokenize_reward` (`single_turn.scored`, the run's
tokenizer, task and reward runner), `batch` (`Producer.assemble`, then the loop's
`buckets.fit` and `global_batch`), `train` (`train_step.update` on that batch),
`metrics` (`sum_over_hosts` of the step's sums) and `other` (the step's metrics line,
`MetricsLogger.log` as the run writes it, TensorBoard where the run has it on). The prompts
are each host's first training prompts of the task; the weights are the run's (initialised
for presets, read for a checkpoint).

What is not timed stays the cost model's: admission (the curator). Multi-turn runs (an env
pool, trajectories) are refused by name.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("reshard", "prefill", "decode", "detokenize_reward", "batch", "train", "metrics",
          "other")
"""What a child times, in the step's order (`perf/phase/*` names)."""
WARMUPS = 2
"""Untimed steps first: the first compiles what the memory plan did not (a shape the rows'
widths give), and the second still ran a TINY train step ~1.8x slower than the ones after
it (8.2 ms against 4.3-4.9, tiny 4 x 4, P 16, N 16: a shape in no validation set)."""


def _join(spec: dict, cfg):
    """This host's wiring, joined as the run's hosts join (see the module docstring)."""
    from locojax import distributed
    from locojax.train import wiring as wiring_lib

    if spec["mode"] == "colocated" and spec["hosts"] > 1:
        os.environ.update({distributed.ENV_COORDINATOR: spec["coordinator"],
                           distributed.ENV_NUM_PROCESSES: str(spec["hosts"]),
                           distributed.ENV_PROCESS_ID: str(spec["host"])})
    return wiring_lib.join(spec["mode"], spec["devices"], cfg.train, cfg.rollout.tp)


class _Clock:
    """Seconds of each phase of one repetition, `jax.block_until_ready` at each end."""

    def __init__(self):
        self.times: dict[str, float] = {}

    def __call__(self, name: str, fn, ready=lambda out: out):
        """`fn()`, timed until `ready(out)` is on the host."""
        import jax

        t0 = time.perf_counter()
        out = fn()
        jax.block_until_ready(ready(out))
        self.times[name] = time.perf_counter() - t0
        return out


def run(spec: dict) -> dict:
    """Build the run's parts and programs and time one host's step (the module docstring)."""
    import jax
    import numpy as np
    import tyro

    from locojax.envs.rewards import RewardRunner
    from locojax.metrics import MetricsLogger
    from locojax.rl import buckets, train_state
    from locojax.rl import train_step as train_step_lib
    from locojax.rollout import single_turn
    from locojax.train.build import RunParts
    from locojax.train.config import PRESETS
    from locojax.train.loop import plan_memory

    cfg = tyro.extras.overridable_config_cli(PRESETS, args=spec["argv"], prog="measure")
    parts = RunParts.of(cfg)
    if parts.task.multi_turn:
        raise ValueError(f"measure builds single-turn steps; {cfg.task.name!r} is multi-turn")
    wiring = _join(spec, cfg)
    engine = parts.engine(wiring.rollout_mesh, wiring.rollout_rules)
    plan = plan_memory(parts, wiring, engine)
    plan.check()
    learner, model_cfg = plan.learner, parts.model_cfg
    state = train_state.init(parts.weights(wiring.train_mesh, wiring.train_rules),
                             learner.optim, model_cfg)
    runner = RewardRunner(cfg.reward)
    producer = parts.producer(engine, runner)
    start, stop = wiring.host_slice(cfg.rollout.prompts_per_step)  # this host's share
    b, g, p = stop - start, cfg.group_size, cfg.rollout.max_prompt_tokens
    examples = [parts.task.train[i % len(parts.task.train)] for i in range(start, stop)]
    prompts, mask = single_turn.encode_prompts(parts.tokenizer, examples, p)
    limits = None if spec.get("limits") is None else np.asarray(spec["limits"], np.int32)
    key = jax.random.key(cfg.seed)
    times: dict[str, list[float]] = {k: [] for k in PHASES}
    log_dir = tempfile.TemporaryDirectory(prefix="locojax_measure_log_")
    logger = MetricsLogger(log_dir.name, tensorboard=cfg.tensorboard)
    for rep in range(spec["reps"] + WARMUPS):
        clock = _Clock()
        weights = clock("reshard", lambda: wiring.rollout_weights(state.params,
                                                                  engine.weight_shardings))
        pending = clock("prefill", lambda: engine.prefill(
            weights, prompts, key, parts.sampling, g, mask, 0, limits),
                        lambda out: out.prefilled)
        gen = clock("decode", lambda: engine.decode(pending))
        out = clock("detokenize_reward", lambda: producer.shaped(single_turn.scored(
            gen, parts.tokenizer, parts.task, runner, examples, prompts, mask, start, g)))
        engine.release_cache()
        del weights, pending, gen

        def batch():
            _, local, stats = producer.assemble([out], np.zeros(b, np.int64), 0)
            local, _ = buckets.fit(local, wiring.gather_over_hosts)
            return wiring.global_batch(local), stats
        global_batch, stats = clock("batch", batch)
        state, metrics = clock("train", lambda: train_step_lib.update(
            state, global_batch, model_cfg, learner, None, mesh=wiring.train_mesh),
                               lambda out: out[0].params)
        sums = clock("metrics", lambda: wiring.sum_over_hosts(stats).metrics())
        clock("other", lambda: logger.log(rep + 1, {**metrics, **sums}))
        if rep >= WARMUPS:
            for k in PHASES:
                times[k].append(clock.times[k])
    runner.close()
    logger.close()
    log_dir.cleanup()
    return {"times": times, "median": {k: statistics.median(v) for k, v in times.items()},
            "compiled": [pr.name for pr in plan.programs]}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = run(spec)
    Path(spec["out"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main(sys.argv[1:]))
