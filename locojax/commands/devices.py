"""`locojax devices`: what this host sees, and proof that cross-host collectives work.

Run it under `locojax launch --hosts N -- devices` (or on each host of a real cluster) before
a long job: each host prints its devices and the result of one all-reduce over every device.
"""

from __future__ import annotations

import dataclasses
import os

import tyro

from locojax import distributed


@dataclasses.dataclass(frozen=True)
class DevicesArgs:
    """Print local and global devices and run one cross-host all-reduce."""

    devices_per_host: int = 0
    """Simulated CPU devices for a single-process run (0: leave the default)."""


def main(argv: list[str]) -> int:
    args = tyro.cli(DevicesArgs, args=argv, prog="locojax devices")
    host = distributed.initialize(devices_per_host=args.devices_per_host or None)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from locojax.model.sharding import make_mesh

    mesh = make_mesh({"data": jax.device_count()})
    sharding = NamedSharding(mesh, P("data"))
    # Each device contributes its global index + 1; the sum proves every device took part.
    local = np.array([d.id + 1 for d in mesh.local_devices], np.float32)
    ids = jax.make_array_from_process_local_data(sharding, local)
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(ids)
    expected = sum(d.id + 1 for d in mesh.devices.flat)
    print(
        f"process {host.process_id}/{host.num_processes}: {jax.local_device_count()} local / "
        f"{jax.device_count()} global {jax.default_backend()} devices; "
        f"all-reduce {float(total):g} (expected {expected}); "
        f"cpus {','.join(map(str, sorted(os.sched_getaffinity(0))))}"
    )
    return 0 if float(total) == expected else 1
