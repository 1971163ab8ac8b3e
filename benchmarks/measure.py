"""`predict_programs measure`: steps of the run, their phases timed on this machine by the
run's own code, in place of the cost model's phases.

Where the run fits this machine (its hosts are local processes: `single`, or `colocated`
under `locojax launch --hosts N`), the surest cost of a step's work is that work: the run's
own `Trainer.step`s, built by `loop.start` at the run's exact shape, compiled by its memory
plan, and timed after warm-ups by the `StepTimer` every run logs with (`measure_child.py`:
one child process per host; colocated children join each other by `jax.distributed` as the
run's hosts do, so the train step is the run's multi-process program, all-reduce included).
The phases kept: each host's reshard, prefill, decode loop, detokenize and reward, batch
assembly and gather, train step, metrics' sum, and the step's other time. The decode is the
engine's own loop, compacting finished rows as the engine does, with each row's length
drawn from the workload's completion lengths (`--rollout.ignore-eos`: every row at N, one
wave).

What stays the model's (`phases.py`, on the profile given): admission. Nothing is fitted:
a new shape is measured, not extrapolated; the model is what extrapolates, and where a run
cannot be built here (a pod) `predict_programs measure` is refused and the model's estimate stands.

Every host's step ends in the same collectives, so each repetition's step is the slowest
host's: its phases are kept, then each phase's median over the repetitions.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from locojax import distributed
from benchmarks import measure_child
from locojax.predict.modes import Prediction

MEASURABLE = ("single", "colocated")
REPS = 5
"""Timed repetitions of the step after its warm-ups (`measure_child.WARMUPS`); each phase's
median is kept."""
TIMED = measure_child.PHASES
REPLACED = ("tp_comm", "extend", "allreduce", "collectives")
"""Model phases inside a timed one: tensor-parallel traffic and extend in the decode loop,
the gradient all-reduce in the train step, the small collectives in `metrics`."""
DROP_ENV = ("LOCOJAX_COORDINATOR", "JAX_COORDINATOR_ADDRESS", "LOCOJAX_NUM_PROCESSES",
            "JAX_NUM_PROCESSES", "LOCOJAX_PROCESS_ID", "JAX_PROCESS_ID",
            "LOCOJAX_DEVICES_PER_HOST", "LOCOJAX_CPUS")
"""A child is one process of its own run: nothing of a surrounding `launch` may reach it."""


def child_argv(argv: list[str]) -> list[str]:
    """The run's train arguments less its run dir: a child writes no run."""
    out, i = [], 0
    while i < len(argv):
        if argv[i].partition("=")[0] == "--run-dir":
            i += 1 if "=" in argv[i] else 2
            continue
        out.append(argv[i])
        i += 1
    return out


def limits_of(ctx, rows: int, seed: int = 0) -> list[int] | None:
    """Each rollout row's most tokens, drawn from the workload's completion lengths: the
    engine then compacts its finished rows in waves as it will in the run. None when every
    row runs to N (`--rollout.ignore-eos`, or a fixed length N)."""
    wl = ctx.wl
    drawn = np.clip(np.rint(wl.completion.sample(np.random.default_rng(seed), rows)), 1,
                    wl.max_new).astype(int)
    return None if (drawn == wl.max_new).all() else [int(x) for x in drawn]


def _spec(argv, mode, devices, reps, limits, coordinator, host, hosts, out) -> dict:
    """A child's spec (`measure_child.py`); its hosts share the run dir beside `out`."""
    return {"argv": argv, "mode": mode, "devices": devices, "reps": reps, "limits": limits,
            "coordinator": coordinator, "host": host, "hosts": hosts,
            "run_dir": str(Path(out).parent / "run"), "out": str(out)}


def measure(mode: str, argv: list[str], hosts: int, prompts: int, group: int,
            limits: list[int] | None = None, reps: int = REPS,
            timeout: float = 1800.0) -> dict[str, float]:
    """Seconds of each timed phase (`TIMED`) of one step, as the step sees them (the module
    docstring). mode: single (one process, `hosts` devices) or colocated (`hosts`
    processes, one device each)."""
    if mode not in MEASURABLE:
        raise ValueError(f"measure times the programs of {' and '.join(MEASURABLE)} runs on "
                         f"this machine, not {mode!r}")
    procs = hosts if mode == "colocated" else 1
    if prompts % procs:
        raise ValueError(f"measure: {prompts} prompts per step do not split over {procs} "
                         "hosts")
    per = prompts // procs
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
    env.setdefault("JAX_PLATFORMS", "cpu")
    coordinator = f"127.0.0.1:{distributed.free_port()}" if procs > 1 else ""
    with tempfile.TemporaryDirectory(prefix="locojax_measure_") as tmp:
        d = Path(tmp)
        children = []
        for h in range(procs):
            rows = limits[h * per * group:(h + 1) * per * group] if limits else None
            spec = _spec(child_argv(argv), mode, hosts if mode == "single" else 1, reps,
                         rows, coordinator, h, procs, d / f"out{h}.json")
            (d / f"spec{h}.json").write_text(json.dumps(spec))
            children.append(subprocess.Popen(
                [sys.executable, "-m", "benchmarks.measure_child", str(d / f"spec{h}.json")],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        failed = []
        for h, c in enumerate(children):
            try:
                log, _ = c.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                c.kill()
                log, _ = c.communicate()
            if c.returncode != 0:
                failed.append(f"host {h} exited {c.returncode}:\n{log[-3000:]}")
        if failed:
            for c in children:
                if c.poll() is None:
                    c.kill()
            raise RuntimeError("measure: a program could not be built or run here; "
                               + "\n".join(failed))
        outs = [json.loads((d / f"out{h}.json").read_text()) for h in range(procs)]
    return slowest(outs)


def slowest(outs: list[dict]) -> dict[str, float]:
    """Per repetition the phases of the host whose step took longest, then per phase the
    median over the repetitions."""
    reps = len(outs[0]["times"][TIMED[0]])
    worst = [max(outs, key=lambda o: sum(o["times"][k][r] for k in TIMED)) for r in range(reps)]
    return {k: statistics.median(worst[r]["times"][k][r] for r in range(reps)) for k in TIMED}


def apply(pred: Prediction, measured: dict[str, float]) -> Prediction:
    """`pred` with the timed phases replaced by the measured ones (and the model's phases
    inside them, `REPLACED`, dropped)."""
    phases = {k: v for k, v in pred.phases.items() if k not in REPLACED}
    phases.update(measured)
    return Prediction(pred.mode, pred.layout, phases, pred.staleness, pred.wait,
                      [*pred.notes, f"{', '.join(TIMED)}: the run's own code, timed here "
                                    "(predict_programs measure)"])
