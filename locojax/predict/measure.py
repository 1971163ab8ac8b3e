"""`locojax predict train ... --measure`: the run's own programs, compiled at its shapes and
timed on this machine, in place of the cost model's device phases.

Where the run fits this machine (its hosts are local processes: `single`, or `colocated`
under `locojax launch --hosts N`), the surest cost of a program is the program itself: each
host's prefill, decode loop and train step, built by the run's own builder and compiled by
its memory plan, timed after one warm-up (`measure_child.py`, one child process per host,
the colocated hosts at once so that they share the cores as the run's do). The decode is the
engine's own loop over the whole context, compacting finished rows as the engine does
(halving to `engine.MIN_ROWS`), with each row's length drawn from the workload's completion
lengths (`--rollout.ignore-eos`: every row at N, one wave).

What is not a program stays the model's (`phases.py`, on the profile given): admission,
detokenize and reward, the batch's assembly, the gradient all-reduce between hosts, the
step's fixed host cost. Nothing is fitted: a new shape is measured, not extrapolated. Where
a run cannot be built here (a pod), `--measure` is refused and the model's estimate stands.

The rollout phase of a colocated step waits for the slowest host, and so does its update:
each measured repetition takes the slowest host's time, then the median over repetitions.
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

from locojax.predict.modes import Prediction

MEASURABLE = ("single", "colocated")
REPS = 3
"""Timed repetitions per program after the warm-up (their median is kept)."""
DEVICE_PHASES = ("prefill", "decode", "train")
DROP_ENV = ("LOCOJAX_COORDINATOR", "JAX_COORDINATOR_ADDRESS", "LOCOJAX_NUM_PROCESSES",
            "JAX_NUM_PROCESSES", "LOCOJAX_PROCESS_ID", "JAX_PROCESS_ID",
            "LOCOJAX_DEVICES_PER_HOST", "LOCOJAX_CPUS")
"""A child is one process of its own run: nothing of a surrounding `launch` may reach it."""


def host_argv(argv: list[str], prompts_per_host: int) -> list[str]:
    """The train arguments of one host: its share of the prompts, no run dir written."""
    out, i = [], 0
    while i < len(argv):
        key = argv[i].partition("=")[0]
        if key in ("--rollout.prompts-per-step", "--run-dir"):
            i += 1 if "=" in argv[i] else 2
            continue
        out.append(argv[i])
        i += 1
    return out + ["--rollout.prompts-per-step", str(prompts_per_host)]


def limits_of(ctx, rows: int, seed: int = 0) -> list[int] | None:
    """Each rollout row's most tokens, drawn from the workload's completion lengths: the
    engine then compacts its finished rows in waves as it will in the run. None when every
    row runs to N (`--rollout.ignore-eos`, or a fixed length N)."""
    wl = ctx.wl
    drawn = np.clip(np.rint(wl.completion.sample(np.random.default_rng(seed), rows)), 1,
                    wl.max_new).astype(int)
    return None if (drawn == wl.max_new).all() else [int(x) for x in drawn]


def _spec(argv, devices, reps, limits, barrier, host, hosts, out) -> dict:
    return {"argv": argv, "devices": devices, "reps": reps, "limits": limits,
            "barrier": barrier, "host": host, "hosts": hosts, "out": str(out)}


def measure(mode: str, argv: list[str], hosts: int, prompts: int, group: int,
            limits: list[int] | None = None, reps: int = REPS,
            timeout: float = 1800.0) -> dict[str, float]:
    """Seconds per call of prefill, decode and train, as the step sees them (see the module
    docstring). mode: single (one process, `hosts` devices) or colocated (`hosts`
    processes, one device each)."""
    if mode not in MEASURABLE:
        raise ValueError(f"--measure times the programs of {' and '.join(MEASURABLE)} runs on "
                         f"this machine, not {mode!r}")
    procs = hosts if mode == "colocated" else 1
    if prompts % procs:
        raise ValueError(f"--measure: {prompts} prompts per step do not split over {procs} "
                         "hosts")
    per = prompts // procs
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
    env.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory(prefix="locojax_measure_") as tmp:
        d = Path(tmp)
        children = []
        for h in range(procs):
            rows = limits[h * per * group:(h + 1) * per * group] if limits else None
            spec = _spec(host_argv(argv, per), hosts if mode == "single" else 1, reps, rows,
                         str(d) if procs > 1 else "", h, procs, d / f"out{h}.json")
            (d / f"spec{h}.json").write_text(json.dumps(spec))
            children.append(subprocess.Popen(
                [sys.executable, "-m", "locojax.predict.measure_child", str(d / f"spec{h}.json")],
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
            raise RuntimeError("--measure: a program could not be built or run here; "
                               + "\n".join(failed))
        outs = [json.loads((d / f"out{h}.json").read_text()) for h in range(procs)]
    return slowest(outs)


def slowest(outs: list[dict]) -> dict[str, float]:
    """Per phase, the median over repetitions of the slowest host's time."""
    return {k: statistics.median(max(o["times"][k][r] for o in outs)
                                 for r in range(len(outs[0]["times"][k])))
            for k in DEVICE_PHASES}


def apply(pred: Prediction, measured: dict[str, float]) -> Prediction:
    """`pred` with its device phases replaced by the measured programs' (tensor-parallel
    communication and extend, inside the measured decode where they occur, dropped)."""
    phases = {k: v for k, v in pred.phases.items() if k not in ("tp_comm", "extend")}
    phases.update(measured)
    return Prediction(pred.mode, pred.layout, phases, pred.staleness, pred.wait,
                      [*pred.notes, "prefill, decode and train: the run's own programs, timed "
                                    "here (--measure)"])
