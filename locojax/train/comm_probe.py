"""Time the gradient all-reduce on its own.

In data-parallel training the gradient all-reduce is fused into the jitted train step, so it
cannot be timed inside it. This probe runs the same collective, a sum over the `data` axis of
a params-shaped f32 tree (the gradient volume), outside the timed step, and reports its
device-synchronised time as `perf/comm/allreduce_grads`. It adds that much wall time per
step, which is why it is off by default and measured apart from `perf/step_time`.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


class AllReduceProbe:
    def __init__(self, params, mesh: Mesh):
        n = mesh.shape["data"]
        sharded = NamedSharding(mesh, P("data"))
        # One [n, *shape] stack per param: row i lives on device i, as a gradient would.
        self._stack = jax.tree.map(
            lambda x: jax.make_array_from_callback(
                (n,) + x.shape, sharded, lambda idx, x=x: jnp.ones((1,) + x.shape, jnp.float32)),
            params)
        self._reduce = jax.jit(lambda t: jax.tree.map(lambda a: a.sum(0), t),
                               out_shardings=NamedSharding(mesh, P()))
        jax.block_until_ready(self._reduce(self._stack))  # compile outside any measurement

    def measure(self) -> dict[str, float]:
        start = time.perf_counter()
        jax.block_until_ready(self._reduce(self._stack))
        return {"perf/comm/allreduce_grads": time.perf_counter() - start}
