"""The joined train step, for `predict_programs calibrate`: what a GRPO update
costs when k colocated hosts (processes on this machine, joined by `jax.distributed`) run
it as one data-parallel program, over what the same update costs each of them alone.

The lock-step probe (`calibrate_lockstep.py`) prices a meeting in a psum of one number. A
real update meets differently: its gradients, the size of the model, are summed over the
hosts inside the program, through gloo over 127.0.0.1. Measured on a 2-core machine (scratch
probes of the run's own `train_step.update` over `wiring.Colocated`'s mesh, 2026-12-06), a
TINY update took 11 to 14 ms joined against 4 to 7 ms alone side by side, and a SMALL one
164 to 172 ms against 124 to 135; a psum of TINY's 0.43 MB of gradients alone took 0.74 ms.
Neither the psum probe nor the cost model's link fit (a psum of one array, back to back)
holds that: the excess has a part per update and a part per gradient byte.

Each of k processes (placed as `locojax launch` places its hosts) builds the update of two
probe decoders (`DECODERS`, of 1.6 and 12.6 MB of f32 gradients) on `SHAPE` rows per host,
the state replicated over the joined mesh and the batch made global as the train loop
makes it (`Colocated.global_batch`), and times it (median of `CALLS`) joined, then alone
on its own device while the others run theirs, for `WINDOW_S` (so that none has the cores
to itself when the others are done), each `REPEATS` times. The excess (joined - alone, the
hosts' median) is fitted as a + b · gradient bytes (`calibrate_lockstep.line`, b kept only
where resolved from zero); `priced.py` adds a(k) + b(k) x the run's gradient bytes to a
colocated host's train step, in place of the cost model's all-reduce and the psum meeting.
"""

from __future__ import annotations

import time

import numpy as np

from locojax import distributed
from locojax.predict.calibrate_host import median_time

DECODERS = {
    "d96": dict(hidden_size=96, intermediate_size=256, num_attention_heads=3,
                num_key_value_heads=1, head_dim=32, vocab_size=2048),
    "d192": dict(hidden_size=192, intermediate_size=512, num_attention_heads=3,
                 num_key_value_heads=1, head_dim=64, vocab_size=12288),
}
"""Two layers each; no shipped model's or validation point's width."""
LAYERS = 2
SHAPE = (2, 2, 16, 16)  # prompts x group x prompt tokens x new tokens, per host
CALLS = 6
WINDOW_S = 0.6  # the side-by-side run alone: every process busy throughout (`call_time_over`)
REPEATS = 3


def call_time_over(call, window: float) -> float:
    """Seconds per call of `call` (which returns when done) called back to back for
    `window` seconds (every process busy for the whole window, where a count of calls would
    let the first to finish leave the others the cores)."""
    call()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < window:
        call()
        calls += 1
    return (time.perf_counter() - start) / calls


def _updates(host, cfg):
    """(joined, alone, gradient bytes): callables running one update of decoder `cfg` over
    every process's device, and on this process's device alone, each returning when done."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from locojax.predict import calibration_step
    from locojax.rl import train_step as ts
    from locojax.train.wiring import Colocated

    wiring = Colocated(host)
    lcfg, local_state, local_batch = calibration_step.inputs(cfg, *SHAPE)
    replicated = NamedSharding(wiring.train_mesh, P())
    state = [jax.tree.map(lambda x: jax.make_array_from_process_local_data(
        replicated, np.asarray(x), x.shape), local_state), local_state]
    batch = wiring.global_batch(jax.tree.map(np.asarray, local_batch))
    program = ts.program_cfg(lcfg)

    def joined():
        state[0], _ = ts.update(state[0], batch, cfg, lcfg, None, mesh=wiring.train_mesh)
        jax.block_until_ready(state[0].params)

    def alone():
        state[1], _ = ts.train_step(state[1], local_batch, None, model_cfg=cfg, cfg=program)
        jax.block_until_ready(state[1].params)
    grads = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(local_state.params))
    return joined, alone, float(grads)


def worker(k: int, pid: int, port: int) -> dict:
    """{"joined" | "alone": {decoder: [seconds of each repeat]}, "bytes": {decoder: gradient
    bytes}} of one of k joined processes (each repeat's side-by-side run started together)."""
    host = distributed.initialize(devices_per_host=1, coordinator=f"127.0.0.1:{port}",
                                  num_processes=k, process_id=pid)
    from jax.experimental import multihost_utils

    from locojax.model import config

    out: dict = {"joined": {}, "alone": {}, "bytes": {}}
    for name, dims in DECODERS.items():
        joined, alone, out["bytes"][name] = _updates(
            host, config.tiny(num_hidden_layers=LAYERS, **dims))
        out["joined"][name], out["alone"][name] = [], []
        for i in range(REPEATS):
            out["joined"][name].append(median_time(joined, CALLS))
            multihost_utils.sync_global_devices(f"{name} alone {i}")
            out["alone"][name].append(call_time_over(alone, WINDOW_S))
            multihost_utils.sync_global_devices(f"{name} joined {i}")
    return out


def excess(workers: list[dict]) -> tuple[list[float], list[float]]:
    """(gradient bytes, the hosts' median excess joined - alone) of every decoder and repeat,
    from every process's `worker` output: the points `calibrate_lockstep.line` fits."""
    x, y = [], []
    for name in DECODERS:
        for i in range(REPEATS):
            x.append(workers[0]["bytes"][name])
            y.append(float(np.median([w["joined"][name][i] - w["alone"][name][i]
                                      for w in workers])))
    return x, y
