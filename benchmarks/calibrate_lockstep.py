"""Lock-step, for `predict_programs calibrate`: what meeting costs where the units
that meet share the machine's cores.

The program model (`kernel_model.py`) prices one device's program on its share of the
cores. Two kinds of unit run such programs together here, and wait for each other:
- **device threads of one process** (`--mode single` with N simulated devices): every
  program call, and every iteration of the decode loop, ends when all N have run their
  part (the runtime joins them; a psum or the loop condition reduces over them);
- **processes** (`colocated` under `locojax launch --hosts k`): the hosts meet at a few
  collectives a step (the batch widths, the gradient all-reduce, the metric sums), each
  the slowest host's arrival late, through gloo over 127.0.0.1.
Neither is in a one-device program's price, and both grow with the units per core (set 6
of docs/predict_compiled.md under-predicted every TINY run of several devices or hosts by
a third).

The probe times one program at three sizes of work W between meetings: each unit runs
`reps` f32 [64, 256] x [256, 256] matmuls on its own rows, then all units meet: in a psum
inside the program, or (processes) in the host-side all-gather the train loop makes.
For n devices (one process, `jax_num_cpu_devices` n) the reference is the same work by one
device on one core, times max(1, n / c) (fair time-slicing: what the program model prices
on c / n cores); for k processes (joined by `jax.distributed`, one device each) it is the
same k processes running the work without the psum, side by side (what the program model
prices times the contention ρ(k)). Each size is timed `REPEATS` times, and the excess over
the reference fitted as a + b · reference by least squares over the nine points: `a` is a
meeting's own cost, `b` the share of the work by which the slowest unit arrives late. `b`
is kept only where it stands clear of zero (`RESOLVED` standard errors, from the points'
scatter about the line); else b = 0 and `a` is the mean excess. The predictions multiply
`b` by every meeting's work, so a `b` that is noise (seventh set, docs/predict_compiled.md:
signs that changed run to run, 306 ms of meetings priced on a step whose host phases total
15 ms) costs more than no `b`. n and k are 2 and 4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from locojax import distributed
from benchmarks import calibrate_joined
from benchmarks.calibrate_joined import call_time_over
from locojax.predict.calibrate_host import median_time

COUNTS = (2, 4)
WORKS = (1, 16, 256)  # matmuls per unit between meetings: about 0.1, 1 and 17 ms on a core
CALLS = (60, 24, 6)
WINDOW_S = 0.6  # each size's side-by-side run without meetings
REPEATS = 3
RESOLVED = 2.0  # standard errors from zero that keep b
ROWS, WIDTH = 64, 256
MEETINGS = ("device_calls", "process_psum", "process_gather", "process_update")
"""n device threads ending one program call; k processes meeting in a program's psum; k
processes meeting in `multihost_utils.process_allgather` after the work (the train loop's
batch widths and metric sums: `wiring.Colocated`); k processes joined in a GRPO update,
its `b` per gradient byte (`calibrate_joined.py`)."""


def _programs(mesh, reps: int):
    """(the meeting program over `mesh`, the same work alone on one device)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def work(x, w):
        return jnp.sum(jax.lax.fori_loop(0, reps, lambda i, y: jnp.tanh(y @ w), x))

    meet = jax.jit(jax.shard_map(lambda x, w: jax.lax.psum(work(x, w), "data"), mesh=mesh,
                                 in_specs=(P("data"), P()), out_specs=P()))
    return meet, jax.jit(work)


def _median_call(fn, args, calls: int) -> float:
    return median_time(lambda: fn(*args).block_until_ready(), calls, warm=3)


def _inputs(mesh):
    """The units' rows [64 each, 256] and the shared [256, 256] weight, as global arrays."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(0)
    local = len(mesh.local_devices)
    x = rng.standard_normal((ROWS * local, WIDTH), np.float32) / 16
    w = rng.standard_normal((WIDTH, WIDTH), np.float32) / 16
    return (jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), x),
            jax.make_array_from_process_local_data(NamedSharding(mesh, P()), w))


def devices_worker(n: int) -> dict:
    """{str(reps): [seconds of each repeat]} of the meeting program over n devices of this
    process."""
    distributed.pin_cpus(os.environ.get(distributed.ENV_CPUS))  # before JAX starts
    import jax

    jax.config.update("jax_num_cpu_devices", n)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    args = _inputs(mesh)
    programs = {r: _programs(mesh, r)[0] for r in WORKS}
    out: dict[str, list] = {str(r): [] for r in WORKS}
    for _ in range(REPEATS):
        for r, c in zip(WORKS, CALLS):
            out[str(r)].append(_median_call(programs[r], args, c))
    return out


def processes_worker(k: int, pid: int, port: int) -> dict:
    """{"meet" | "host" | "free": {str(reps): [seconds of each repeat]}} of one of k joined
    processes: the meeting program, the work then a host-side all-gather, and the work alone
    on its device while the others run theirs (each size's side-by-side run started by a
    meeting)."""
    distributed.initialize(devices_per_host=1, coordinator=f"127.0.0.1:{port}",
                           num_processes=k, process_id=pid)
    import jax
    from jax.experimental import multihost_utils

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    x, w = _inputs(mesh)
    mine = x.addressable_shards[0].data, w.addressable_shards[0].data
    out: dict[str, dict] = {m: {str(r): [] for r in WORKS} for m in ("meet", "host", "free")}
    programs = {r: _programs(mesh, r) for r in WORKS}
    for _ in range(REPEATS):
        for r, c in zip(WORKS, CALLS):
            meet, free = programs[r]

            def gathered(*args):  # as `wiring.Colocated.sum_over_hosts` meets
                y = free(*args)  # noqa: B023 (called in this iteration)
                multihost_utils.process_allgather(np.asarray([float(y)], np.float64))
                return y

            out["meet"][str(r)].append(_median_call(meet, (x, w), c))
            out["host"][str(r)].append(_median_call(gathered, mine, c))
            meet(x, w).block_until_ready()
            out["free"][str(r)].append(call_time_over(
                lambda: free(*mine).block_until_ready(), WINDOW_S))  # noqa: B023 (called here)
    return out


def _spawn(args: list[str], envs: list[dict], timeout: float,
           module: str = "calibrate_lockstep") -> list[dict]:
    """One worker per environment in `envs`, worker i running `args(i)`; their outputs."""
    code = (f"import json, sys; from benchmarks import {module} as m; "
            "print(json.dumps(getattr(m, sys.argv[1])(*map(int, sys.argv[2:]))))")
    procs = [subprocess.Popen([sys.executable, "-c", code, *args(i)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i, env in enumerate(envs)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:  # one dead worker leaves the others waiting at a meeting: end them all
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [o[1][-2000:] for p, o in zip(procs, outs) if p.returncode]
    if bad:
        raise RuntimeError("lock-step probe failed:\n" + "\n".join(bad))
    return [json.loads(o[0].strip().splitlines()[-1]) for o in outs]


def line(x: list[float], y: list[float]) -> dict[str, float]:
    """{"a", "b", "b_se"}: the least-squares y = a + b · x, b's standard error from the
    points' scatter about the line; b = 0 and a the mean of y where |b| < `RESOLVED`
    standard errors (the module docstring)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    (b, a), residuals = np.polyfit(x, y, 1, full=True)[:2]
    spread = float(np.sum((x - x.mean()) ** 2))
    dof = len(x) - 2
    se = (float(np.sqrt(residuals[0] / dof / spread)) if dof > 0 and len(residuals) and spread
          else float("inf"))
    if not abs(b) >= RESOLVED * se:
        return {"a": float(y.mean()), "b": 0.0, "b_se": se}
    return {"a": float(a), "b": float(b), "b_se": se}


def fit(reference: list[float], measured: list[float]) -> dict[str, float]:
    """`line` of the excess measured - reference on the reference: a meeting's cost a and
    the slowest unit's lateness b, a share of the work."""
    ref = np.asarray(reference, float)
    return line(list(ref), list(np.asarray(measured, float) - ref))


def _points(samples: dict[str, list]) -> list[float]:
    """Every repeat of every size, in the order of `WORKS`."""
    return [t for r in WORKS for t in samples[str(r)]]


def _across(workers: list[dict], kind: str) -> dict[str, list]:
    """{str(reps): [the workers' median of each repeat]} of one kind of time."""
    return {str(r): [float(np.median([w[kind][str(r)][i] for w in workers]))
                     for i in range(len(workers[0][kind][str(r)]))] for r in WORKS}


def lockstep(counts: tuple[int, ...] = COUNTS, timeout: float = 600) -> dict:
    """The program model's `lockstep` entry: {meeting: {str(n): {"a", "b", "b_se"}}} for the
    meetings `MEETINGS` names, and the samples each fit was made from."""
    # one process of n devices unpinned, n processes placed as `locojax launch` places its
    # hosts (`distributed.placed`): a surrounding launch's share must not reach either
    env = {k: v for k, v in os.environ.items() if k != distributed.ENV_CPUS}
    cpus = sorted(os.sched_getaffinity(0))
    alone = _spawn(lambda i: ["devices_worker", "1"], [{**env, distributed.ENV_CPUS: str(cpus[0])}],
                   timeout)[0]
    out: dict = {**{m: {} for m in MEETINGS}, "samples": {"alone_1_core": alone}}
    for n in counts:
        got = _spawn(lambda i: ["devices_worker", str(n)], [env], timeout)[0]
        fair = {str(r): [t * max(1.0, n / len(cpus)) for t in alone[str(r)]] for r in WORKS}
        out["device_calls"][str(n)] = fit(_points(fair), _points(got))
        out["samples"][f"devices_{n}"] = got
        port = distributed.free_port()
        each = _spawn(lambda i: ["processes_worker", str(n), str(i), str(port)],
                      distributed.placed(env, n), timeout)
        free, meet, host = (_across(each, kind) for kind in ("free", "meet", "host"))
        out["process_psum"][str(n)] = fit(_points(free), _points(meet))
        out["process_gather"][str(n)] = fit(_points(free), _points(host))
        out["samples"][f"processes_{n}"] = {"free": free, "meet": meet, "host": host}
        port = distributed.free_port()
        each = _spawn(lambda i: ["worker", str(n), str(i), str(port)],
                      distributed.placed(env, n), timeout, "calibrate_joined")
        grads, excess = calibrate_joined.excess(each)
        out["process_update"][str(n)] = line(grads, excess)
        out["samples"][f"update_{n}"] = {"bytes": grads, "excess": excess}
    out["works"] = list(WORKS)
    return out

