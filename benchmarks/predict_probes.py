"""Link and machine probes for `locojax predict`'s cpu-here profile (calibrate_predict.py
runs them; each prints one JSON line).

- `matmul`: f32 [n, n] @ [n, n] FLOP/s, median of 5 (run under `taskset -c 0` for one core);
- `stream`: bytes/s of a 256 MB numpy copy (read + write), median of 5;
- `allreduce --n N`: N local processes joined by jax.distributed (gloo, as `locojax launch`
  joins them), one device each, time a jitted psum of a flat f32 buffer over the `data` axis
  (what the train step's gradient all-reduce is, `train_step._accumulate_flat`) at several
  sizes, median of 20 after 3 warm-ups; process 0 prints;
- `ray`: a local Ray cluster, one actor: the round trip of a call returning a small result,
  and of a call taking a weights-sized dict of arrays by reference (put + fetch), median of 30.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def median_time(fn, runs: int, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


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
    from locojax import distributed

    # Joined as `locojax launch` joins its hosts: through the environment.
    os.environ.update({distributed.ENV_COORDINATOR: f"127.0.0.1:{port}",
                       distributed.ENV_NUM_PROCESSES: str(n),
                       distributed.ENV_PROCESS_ID: str(pid)})
    distributed.initialize(devices_per_host=1)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "allreduce-worker", "--n", str(n),
                               "--pid", str(i), "--port", str(port)],
                              stdout=subprocess.PIPE, text=True) for i in range(n)]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("probe", choices=("matmul", "stream", "allreduce", "allreduce-worker", "ray"))
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    if args.probe == "allreduce-worker":
        _allreduce_worker(args.pid, args.n, args.port)
        return 0
    result = {"matmul": matmul, "stream": stream, "ray": ray_probe,
              "allreduce": lambda: allreduce(args.n)}[args.probe]()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
