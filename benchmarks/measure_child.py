"""One host's steps of a `locojax train` run, the run's own `Trainer.step`s timed by the
run's own `StepTimer`: what `predict_programs measure` runs in a child process per host
(`measure.py` starts them and reads their times).

    python -m benchmarks.measure_child SPEC.json

SPEC: {"argv": the run's train arguments, "mode": single or colocated, "devices": the
devices of that process, "reps": timed steps after the warm-ups (`WARMUPS`), "limits": each
rollout row's most tokens or null, "coordinator": the hosts' meeting address or "", "host":
this host's index, "hosts": how many, "run_dir": the run directory the hosts share (a
temporary one), "out": where the times go (JSON)}.

Nothing here composes a step: `loop.start` builds the run as `locojax train` does
(`RunParts.of`, the memory plan, which compiles the programs, the weights, the producer),
after `wiring.join` joined the hosts as the run's hosts join (colocated: one process each,
joined by `jax.distributed`, so the batch's gather, the train step's all-reduce and the
metrics' sum are the run's collectives). Each step is `Trainer.logged_step`, the run's own
lines: `Trainer.step` (rollout, batch, update, publish, metrics), its metrics and `perf/*`
logged. The times kept are the phases that step logs (`perf/phase/*`, `perf/other`: the
step less its phases, which holds the metrics line's write), the ones the cost model has a
phase for (`PHASES`). Two things differ from the run, each said where it is done: the rows
end at `limits` (the workload's completion lengths, so the engine compacts finished rows in
waves as it will in the run; `single_turn.rollout`'s `limits`), and the run's own
evaluations and checkpoints are left out of the measured steps.

What is not kept stays the cost model's: admission (the curator, tokenisation). Multi-turn
runs (an env pool, trajectories) are refused by name.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import sys
from pathlib import Path

PHASES = ("reshard", "prefill", "decode", "detokenize_reward", "batch", "train", "metrics",
          "other")
"""What a child keeps, in the step's order (`perf/phase/*` names; `other` is `perf/other`)."""
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


def measured_config(cfg, run_dir: str, steps: int):
    """The run's config for `steps` measured steps in `run_dir`: no evaluation, and no
    checkpoint among them (a run saves after its last step, so the run is one step longer
    than the steps taken), no progress bar, no time limit."""
    return dataclasses.replace(
        cfg, run_dir=run_dir, steps=steps + 1, progress=False, time_limit_s=0.0,
        eval=dataclasses.replace(cfg.eval, every=0),
        checkpoint=dataclasses.replace(cfg.checkpoint, every=0, resume=False))


def phases(perf: dict[str, float]) -> dict[str, float]:
    """`PHASES` of one logged step: `perf/phase/<k>` (0 where the step had none), `train` the
    sum of the update's phases (`--profile-split` splits it: `buckets.TRAIN_PHASES`), `other`
    the step's `perf/other`."""
    from locojax.rl import buckets

    out = {k: perf.get(f"perf/phase/{k}", 0.0) for k in PHASES if k != "other"}
    out["train"] = sum(perf.get(f"perf/phase/{k}", 0.0) for k in buckets.TRAIN_PHASES)
    out["other"] = perf["perf/other"]
    return out


def run(spec: dict) -> dict:
    """The run's steps on this host, timed as the run times them (the module docstring)."""
    import numpy as np
    import tyro

    from locojax.rollout import single_turn
    from locojax.train import loop
    from locojax.train.config import PRESETS

    cfg = tyro.extras.overridable_config_cli(PRESETS, args=spec["argv"], prog="measure")
    cfg = measured_config(cfg, spec["run_dir"], spec["reps"] + WARMUPS)
    wiring = _join(spec, cfg)
    trainer = loop.start(cfg, wiring)
    try:
        if trainer.producer.task.multi_turn:
            raise ValueError(f"measure times single-turn steps; {cfg.task.name!r} is "
                             "multi-turn")
        if spec.get("limits") is not None:  # the rows end as the workload's do
            trainer.producer.rollout_fn = functools.partial(
                single_turn.rollout, limits=np.asarray(spec["limits"], np.int32))
        trainer.rollouts.begin(0, trainer.state.params, None)
        times: dict[str, list[float]] = {k: [] for k in PHASES}
        for step in range(WARMUPS + spec["reps"]):
            logged = phases(trainer.logged_step(step))
            if step >= WARMUPS:
                for k in PHASES:
                    times[k].append(logged[k])
        trainer.rollouts.close()
    finally:
        trainer.close()
    return {"times": times, "median": {k: statistics.median(v) for k, v in times.items()},
            "compiled": [pr.name for pr in trainer.memory.programs]}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = run(spec)
    Path(spec["out"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main(sys.argv[1:]))
