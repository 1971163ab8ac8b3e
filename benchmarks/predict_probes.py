"""Link and machine probes for `locojax predict`'s cpu-here profile (calibrate_predict.py
runs them; each prints one JSON line).

- `matmul`: f32 [n, n] @ [n, n] FLOP/s, median of 5 (run under `taskset -c 0` for one core);
- `stream`: bytes/s of a 256 MB numpy copy (read + write), median of 5;
- `allreduce --n N`: N local processes joined by jax.distributed (gloo, as `locojax launch`
  joins them), one device each, time a jitted psum of a flat f32 buffer over the `data` axis
  (what the train step's gradient all-reduce is, `train_step._accumulate_flat`) at several
  sizes, median of 20 after 3 warm-ups; process 0 prints;
- `ray`: a local Ray cluster, one actor: the round trip of a call returning a small result,
  and of a call taking a weights-sized dict of arrays by reference (put + fetch), median of 30;
- `oversub --ks K...`: K processes at once, each the GRPO train step at TINY on a
  synthetic 32-row, 128-token batch (`OVERSUB_SHAPE`, a shape no benchmark runs) run 12
  times after warm-up, started together, in 3 rounds (the median of the processes' walls,
  then of the rounds); pinned one per core when K <= cores and unpinned otherwise, as
  `locojax launch` places its hosts by default (the workers started together:
  `probe_walls.py`). Prints each K's median wall per process against one process alone on
  one core (taskset) times max(1, K / cores), fair time-slicing: the ratio is the penalty of their contention (memory
  system, shared cache) and over-subscription;
- `multidev --ns N...`: one process with N simulated CPU devices (`jax_num_cpu_devices`, as
  `--mode single --devices-per-host N`) running the engine's own decode loop: TINY's
  config, 16 rows (4 prompts x 4 samples) of 16-token prompts sharded over the N devices
  as `--mode single` shards them, every row decoding to the end (`ignore_eos`). Seconds
  per iteration from the difference of 64- and 16-token generates (prefill and call
  overhead cancel), median of 9. No benchmark runs this shape (bench_modes' TINY points
  have 32 rows and 256- or 768-token prompts). The decode step's dozens of small kernels
  per device and its two cross-device reductions per iteration are what N device threads
  on 2 cores contend on; a tiny loop with one reduction measured a tenth of it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


from benchmarks.harness import ROOT, median_time
from benchmarks.probe_walls import serve, walls

PROBE = [sys.executable, "-m", "benchmarks.predict_probes"]
"""This script in a fresh process (a worker of a probe), run from the repository root."""
from locojax import distributed


def matmul(n: int = 2048) -> dict:
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(jnp.dot)
    t = median_time(lambda: f(a, b).block_until_ready(), 5)
    return {"matmul_flops_per_s": 2 * n ** 3 / t, "n": n, "cpus": len(os.sched_getaffinity(0))}


def stream(mb: int = 256) -> dict:
    import numpy as np

    src = np.ones(mb * 2 ** 20 // 8)
    dst = np.empty_like(src)
    t = median_time(lambda: np.copyto(dst, src), 5)
    return {"copy_bytes_per_s": 2 * src.nbytes / t, "mb": mb}


SIZES = (1024, 106_880, 1_081_344, 4_362_496)  # f32 elements: 4 KB, TINY, 1M, SMALL params


def _allreduce_worker(pid: int, n: int, port: int) -> None:
    # Joined as `locojax launch` joins its hosts: through the environment.
    os.environ.update({distributed.ENV_COORDINATOR: f"127.0.0.1:{port}",
                       distributed.ENV_NUM_PROCESSES: str(n),
                       distributed.ENV_PROCESS_ID: str(pid)})
    distributed.initialize(devices_per_host=1)
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("data",))
    out = {}
    for size in SIZES:
        local = np.ones((1, size), np.float32)
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
        f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "data"), mesh=mesh,
                                  in_specs=P("data"), out_specs=P("data")))
        out[size * 4] = median_time(lambda: f(x).block_until_ready(), 20, warm=3)
    if pid == 0:
        print(json.dumps({"n": n, "allreduce_s_by_bytes": out}), flush=True)


def allreduce(n: int) -> dict:
    port = distributed.free_port()
    procs = [subprocess.Popen([*PROBE, "allreduce-worker", "--n", str(n), "--pid", str(i),
                               "--port", str(port)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for i in range(n)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"allreduce probe failed: {[p.returncode for p in procs]}")
    return json.loads(outs[0].strip().splitlines()[-1])


def ray_probe(weight_bytes: int = 427_520) -> dict:
    import numpy as np
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    try:
        @ray.remote(num_cpus=0)
        class Echo:
            def small(self):
                return 1

            def take(self, tree):
                return sum(int(v.size) for v in tree.values())

        actor = Echo.remote()
        ray.get(actor.small.remote())
        call = median_time(lambda: ray.get(actor.small.remote()), 30)
        tree = {f"w{i}": np.ones(weight_bytes // 4 // 8, np.float32) for i in range(8)}
        push = median_time(lambda: ray.get(actor.take.remote(ray.put(tree))), 30)
        return {"ray_call_s": call, "ray_push_s": push, "push_bytes": weight_bytes}
    finally:
        ray.shutdown()


OVERSUB_SHAPE = (8, 4, 64, 64)  # B prompts, G, prompt and completion tokens: no benchmark's


def _train_step():
    """The GRPO train step itself at TINY on a synthetic batch of 32 rows x 128 tokens (a
    shape no benchmark runs), and its arguments: what a host's processes run, with its
    working set (activations and logits, some tens of MB) and so its contention for the
    memory system, which a small cache-resident kernel would not show."""
    import jax
    from benchmarks.profile_train import synthetic_setup
    from locojax.rl.train_step import train_step

    state, batch, _, cfg, lcfg = synthetic_setup("tiny", OVERSUB_SHAPE)
    state = [state]

    def step():
        state[0], _ = train_step(state[0], batch, None, model_cfg=cfg, cfg=lcfg)
        jax.block_until_ready(state[0])
    return step


OVERSUB_CALLS = 12  # about 1.6 s alone on one core: long against start-up jitter
OVERSUB_ROUNDS = 3


def _oversub_worker() -> None:
    serve(_train_step(), OVERSUB_CALLS, OVERSUB_ROUNDS)


def _oversub_once(k: int, cpus: list[int], one_core: bool = False) -> float:
    """Median over rounds of the median wall of k processes started together (see the
    module docstring; the protocol is `calibrate`'s own probe's)."""
    cmd = [*PROBE, "oversub-worker"]
    commands = []
    for i in range(k):
        pin = [cpus[0]] if one_core else [cpus[i]] if k <= len(cpus) else None
        prefix = ["taskset", "-c", ",".join(map(str, pin))] if pin else []
        commands.append([*prefix, *cmd])
    return walls(commands, OVERSUB_ROUNDS)


def oversub(ks: list[int]) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    alone = _oversub_once(1, cpus, one_core=True)
    out = {}
    for k in ks:
        wall = _oversub_once(k, cpus)
        out[k] = {"wall": wall, "penalty": wall / (alone * max(1.0, k / len(cpus)))}
    b, g, prompt, completion = OVERSUB_SHAPE
    program = (f"the GRPO train step at TINY, {b * g} rows x {prompt + completion} tokens, "
               f"synthetic")
    return {"program": program, "cores": len(cpus), "alone_1_core": alone, "calls": OVERSUB_CALLS,
            "rounds": OVERSUB_ROUNDS, "by_k": out}


MULTIDEV_TOKENS = (16, 64)  # two generate lengths: their difference is 48 iterations


def _multidev_one(n: int) -> float:
    distributed.set_cpu_devices(n)
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from locojax.engine.engine import Engine
    from locojax.engine.sampling import SamplingConfig
    from locojax.model import config as model_config
    from locojax.model import params
    from locojax.model.sharding import ROLLOUT_REPLICATED

    cfg = model_config.PRESETS["tiny"]()
    weights = params.init(cfg, jax.random.key(0))
    prompts = np.asarray(jax.random.randint(jax.random.key(1), (4, 16), 0, cfg.vocab_size),
                         np.int32)
    engine = Engine(cfg, mesh=Mesh(np.array(jax.devices()[:n]), ("data",)),
                    rules=ROLLOUT_REPLICATED)

    def timed(tokens: int) -> float:
        sampling = SamplingConfig(max_new_tokens=tokens, temperature=1.0, ignore_eos=True)
        return median_time(lambda: jax.block_until_ready(engine.generate(
            weights, prompts, jax.random.key(0), sampling, num_samples=4)), 9)

    short, long = MULTIDEV_TOKENS
    return (timed(long) - timed(short)) / (long - short)


def multidev(ns: list[int]) -> dict:
    """One fresh process per N: the device count is fixed when the backend starts."""
    out = {}
    for n in ns:
        r = subprocess.run([*PROBE, "multidev-worker", "--n", str(n)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600, check=False)
        if r.returncode:
            raise RuntimeError(f"multidev probe n={n} failed:\n{r.stderr[-2000:]}")
        out[n] = json.loads(r.stdout.strip().splitlines()[-1])["iteration_s"]
    return {"iteration_s_by_devices": out, "loops": "engine decode, 64 - 16 tokens"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("probe", choices=("matmul", "stream", "allreduce", "allreduce-worker", "ray",
                                      "oversub", "oversub-worker", "multidev",
                                      "multidev-worker"))
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8])
    ap.add_argument("--ns", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    if args.probe == "allreduce-worker":
        _allreduce_worker(args.pid, args.n, args.port)
        return 0
    if args.probe == "oversub-worker":
        _oversub_worker()
        return 0
    if args.probe == "multidev-worker":
        print(json.dumps({"iteration_s": _multidev_one(args.n)}), flush=True)
        return 0
    result = {"matmul": matmul, "stream": stream, "ray": ray_probe,
              "allreduce": lambda: allreduce(args.n), "oversub": lambda: oversub(args.ks),
              "multidev": lambda: multidev(args.ns)}[args.probe]()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
