"""One host's programs of a `locojax train` run, built by the run's own builder and timed on
this machine: what `locojax predict train ... --measure` runs in a child process per host
(`measure.py` starts them and reads their times).

    python -m locojax.predict.measure_child SPEC.json

SPEC: {"argv": the train arguments of one host's share (its prompts per step), "devices":
the devices of that process, "reps": timed repetitions after one warm-up, "limits": each
rollout row's most tokens or null, "barrier": a directory shared by the hosts or "",
"host": this host's index, "hosts": how many, "out": where the times go (JSON)}.

The programs are the run's: `RunParts.of` builds the parts, `loop.plan_memory` compiles the
train step, prefill and decode at the run's exact shapes and layouts (the memory plan's
compiles, which the run reuses), and they are called as the run calls them: the engine's
`prefill` and `decode` (its while loop, compacting finished rows to `engine.MIN_ROWS`: the
waves of a batch whose rows end at different lengths, given by `limits`), and
`train_step.update` on a batch of the run's shape. The weights are the run's (initialised
for presets, read for a checkpoint); prompts and batch contents are random, since a
program's time on a CPU depends on shapes, not values.

Colocated hosts share this machine's cores while they run; so they are timed together, one
child per host, meeting before each rollout and each update (`_meet`, a file barrier, as
the run's hosts meet at the batch's gather and the metrics' all-gather): each host's time
then holds the others' load, and the slowest host's is the step's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path


def _meet(barrier: str, name: str, host: int, hosts: int, timeout: float = 600.0) -> None:
    """Wait until every host has reached `name` (a file per host in `barrier`)."""
    if not barrier or hosts <= 1:
        return
    d = Path(barrier)
    (d / f"{name}.{host}").touch()
    end = time.monotonic() + timeout
    while sum((d / f"{name}.{h}").exists() for h in range(hosts)) < hosts:
        if time.monotonic() > end:
            raise TimeoutError(f"measure: host {host} waited {timeout:.0f} s for the others "
                               f"at {name}")
        time.sleep(0.0005)


def _batch(rows: int, prompt: int, new: int, group: int, vocab: int, mesh, rules, prefix):
    """A train batch of the run's shape with random content, placed as the run's is."""
    import jax
    import numpy as np

    from locojax.rl import batch as batch_lib

    rng = np.random.default_rng(0)
    cols = prompt + new
    tokens = rng.integers(0, vocab, (rows, cols)).astype(np.int32)
    positions = np.broadcast_to(np.arange(cols, dtype=np.int32), (rows, cols)).copy()
    loss = np.zeros((rows, cols), bool)
    loss[:, prompt:] = True
    local = batch_lib.TrainBatch(
        tokens=tokens, positions=positions, attn_mask=np.ones((rows, cols), bool),
        loss_mask=loss, advantages=rng.standard_normal(rows).astype(np.float32),
        old_logprobs=-rng.random((rows, cols)).astype(np.float32),
        group_id=(np.arange(rows) // group).astype(np.int32), shared_prefix=prefix)
    return jax.block_until_ready(batch_lib.shard(local, mesh, rules))


def run(spec: dict) -> dict:
    """Build the run's parts and programs and time them (see the module docstring)."""
    import jax
    import numpy as np
    import tyro

    from locojax.rl import batch as batch_lib
    from locojax.rl import train_state
    from locojax.rl import train_step as train_step_lib
    from locojax.train import wiring as wiring_lib
    from locojax.train.build import RunParts
    from locojax.train.config import PRESETS
    from locojax.train.loop import plan_memory

    cfg = tyro.extras.overridable_config_cli(PRESETS, args=spec["argv"], prog="measure")
    parts = RunParts.of(cfg)
    wiring = wiring_lib.join("single", spec["devices"], cfg.train, cfg.rollout.tp)
    engine = parts.engine(wiring.rollout_mesh, wiring.rollout_rules)
    plan = plan_memory(parts, wiring, engine)
    plan.check()
    learner, model_cfg = plan.learner, parts.model_cfg
    params = parts.weights(wiring.train_mesh, wiring.train_rules)
    state = train_state.init(params, learner.optim, model_cfg)
    b, g = cfg.rollout.prompts_per_step, cfg.group_size
    p, n = parts.cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens  # auto: resolved
    rng = np.random.default_rng(1)
    prompts = rng.integers(0, model_cfg.vocab_size, (b, p)).astype(np.int32)
    mask = np.ones((b, p), bool)
    limits = None if spec.get("limits") is None else np.asarray(spec["limits"], np.int32)
    batch = _batch(b * g, p, n, g, model_cfg.vocab_size, wiring.train_mesh,
                   wiring.train_rules, batch_lib.SharedPrefix(p, g))
    times: dict[str, list[float]] = {"prefill": [], "decode": [], "train": []}
    key = jax.random.key(cfg.seed)
    meet = lambda name: _meet(spec.get("barrier", ""), name, spec.get("host", 0),  # noqa: E731
                              spec.get("hosts", 1))
    for rep in range(spec["reps"] + 1):  # rep 0 warms up: the first call of a program
        weights = wiring.rollout_weights(state.params, engine.weight_shardings)
        meet(f"rollout{rep}")
        t0 = time.perf_counter()
        pending = engine.prefill(weights, prompts, key, parts.sampling, g, mask, 0, limits)
        jax.block_until_ready(pending.prefilled)
        t1 = time.perf_counter()
        jax.block_until_ready(engine.decode(pending))
        t2 = time.perf_counter()
        engine.release_cache()
        del weights, pending
        meet(f"train{rep}")
        t3 = time.perf_counter()
        state, _ = train_step_lib.update(state, batch, model_cfg, learner, None,
                                         mesh=wiring.train_mesh)
        jax.block_until_ready(state.params)
        t4 = time.perf_counter()
        if rep:
            times["prefill"].append(t1 - t0)
            times["decode"].append(t2 - t1)
            times["train"].append(t4 - t3)
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
