"""Coordination modes as wirings of the same parts (STYLE.md 8: a wiring, not a rewrite).

A wiring is made once this process has joined its hosts (`join`: the one place that does,
for the in-process modes; the Ray learner group joins in `fleet/learner.py`), and answers
five questions for the loop:
- where does the producer run, and how deep is the buffer?     `rollout_source`
- which of the step's prompts does this process admit?        `host_slice`
- how are the learner's state and batch laid out?             `train_mesh`, `train_rules`
                                                               (`--train.mesh`: meshes.py)
- on which devices does its engine generate, with which params? `rollout_mesh`,
                                                               `rollout_rules` (`--rollout.tp`),
                                                               `rollout_weights`
- how do the hosts' rows become one global training batch?     `global_batch`
- how are per-host statistics combined?                        `sum_over_hosts`,
                                                               `gather_over_hosts`,
                                                               `every_host`

`single`: one process owns every local device. It admits all prompts, runs one SPMD generate
over its mesh (rows sharded over `data`), scores everything itself and trains. The fastest
way to use one host's devices from one process; it never crosses a process boundary, so it
is not the single-controller baseline of the paper (docs/design.md, "Coordination modes").

`colocated` (LoCoJAX-CO): one process per host. Each admits its own contiguous share of the
prompts (whole groups), generates on its local devices with its host's copy of the params
(`rollout_weights`: the addressable shards of the params laid out for its engine on every
host; no copy when training is data parallel, no cross-host collective during decode),
scores locally, then joins one synchronous train step through
`make_array_from_process_local_data`.

Both run the producer inline at depth 0 (`source.InlineSource`). `disaggregated` and `async`
are wirings too, of a learner group fed by remote rollout workers (`fleet/learner.py`); only
those modules import Ray.
"""

from __future__ import annotations

import json

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from locojax import distributed
from locojax.distributed import HostInfo
from locojax.rl import batch as batch_lib
from locojax.train import meshes
from locojax.train.meshes import TrainConfig
from locojax.train.source import InlineSource


class Single:
    name = "single"
    remote_rollouts = False  # the producer runs inline, here: see `source.InlineSource`

    def __init__(self, host: HostInfo, train: TrainConfig | None = None, tp: int = 1):
        self.host = host
        self.train_mesh, self.train_rules = meshes.train_mesh(train or TrainConfig(),
                                                              jax.devices())
        self.rollout_mesh, self.rollout_rules = meshes.rollout_mesh(tp, jax.devices())
        if self.rollout_mesh.shape == self.train_mesh.shape:
            self.rollout_mesh = self.train_mesh  # plain data parallel: one mesh for both

    def rollout_source(self, producer) -> InlineSource:
        return InlineSource(producer, self)

    def host_slice(self, n: int) -> tuple[int, int]:
        return 0, n

    def reshard_target(self, layout):
        """The layout the reshard writes for an engine whose weights are laid out as
        `layout`: that layout itself (this process holds every device)."""
        return layout

    def rollout_weights(self, params, layout=None):
        """The params laid out as the engine's `layout` (`Engine.weight_shardings`; None:
        replicated over the rollout mesh): one program from the training layout
        (`meshes.to_layout`; nothing moves when the two agree, as data parallel)."""
        return meshes.to_layout(params, layout or _replicated(params, self.rollout_mesh))

    def global_batch(self, local: batch_lib.TrainBatch) -> batch_lib.TrainBatch:
        return batch_lib.shard(local, self.train_mesh, self.train_rules)

    def sum_over_hosts(self, values):
        return values

    def gather_over_hosts(self, rows: np.ndarray) -> np.ndarray:
        return rows

    def every_host(self, values: dict[str, float]) -> list[dict[str, float]]:
        return [values]


class Colocated:
    name = "colocated"
    remote_rollouts = False  # the producer runs inline, here: see `source.InlineSource`

    def __init__(self, host: HostInfo, train: TrainConfig | None = None, tp: int = 1):
        self.host = host
        # Global devices in process order, so process p's rows land on process p's devices.
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        self.train_mesh, self.train_rules = meshes.train_mesh(train or TrainConfig(), devices)
        self.rollout_mesh, self.rollout_rules = meshes.rollout_mesh(
            tp, meshes.host_devices(jax.process_index()))

    def rollout_source(self, producer) -> InlineSource:
        return InlineSource(producer, self)

    def host_slice(self, n: int) -> tuple[int, int]:
        share = n // jax.process_count()
        start = jax.process_index() * share
        return start, start + share

    def reshard_target(self, layout):
        """The global layout the reshard writes for an engine laid out as `layout` on this
        host: that layout on every host (`meshes.across_hosts`)."""
        return meshes.across_hosts(layout) if jax.process_count() > 1 else layout

    def rollout_weights(self, params, layout=None):
        """This host's weights laid out as its engine's `layout` (`Engine.weight_shardings`;
        None: replicated over the rollout mesh). The cross-host part is one program every
        host joins (each calls this at the same point of the same step): from the training
        layout to `layout` on every host, then each host views its own shards on its local
        mesh. No copy when the two layouts agree (data parallel, tp 1)."""
        layout = layout or _replicated(params, self.rollout_mesh)
        return meshes.local_view(meshes.to_layout(params, self.reshard_target(layout)), layout)

    def global_batch(self, local: batch_lib.TrainBatch) -> batch_lib.TrainBatch:
        return batch_lib.from_process_local(local, self.train_mesh, self.train_rules)

    def sum_over_hosts(self, values):
        """A pytree of numbers (the same structure on every host) summed over the hosts, in
        f64: one collective for the whole tree."""
        if jax.process_count() == 1:
            return values
        leaves, treedef = jax.tree.flatten(values)
        stacked = multihost_utils.process_allgather(np.asarray(leaves, np.float64))
        return jax.tree.unflatten(treedef, [float(x) for x in np.asarray(stacked).sum(axis=0)])

    def gather_over_hosts(self, rows: np.ndarray) -> np.ndarray:
        """Every host's [n, ...] rows (the same n on each), concatenated in process order."""
        if jax.process_count() == 1:
            return rows
        stacked = np.asarray(multihost_utils.process_allgather(rows))
        return stacked.reshape(-1, *rows.shape[1:])

    def every_host(self, values: dict[str, float]) -> list[dict[str, float]]:
        """Every host's `values`, host 0 first, over the union of their keys (a host that
        lacks a key, e.g. a phase it did not run this step, has 0 for it): two collectives,
        the key names (at most `NAMES_BYTES` of JSON) and then the numbers."""
        if jax.process_count() == 1:
            return [values]
        names = json.dumps(sorted(values)).encode()
        if len(names) > NAMES_BYTES:
            raise ValueError(f"{len(values)} keys do not fit {NAMES_BYTES} bytes")
        buf = np.zeros(NAMES_BYTES, np.uint8)
        buf[:len(names)] = np.frombuffer(names, np.uint8)
        every = np.asarray(multihost_utils.process_allgather(buf))
        keys = sorted({k for row in every for k in json.loads(bytes(row).rstrip(b"\0"))})
        rows = multihost_utils.process_allgather(np.asarray([values.get(k, 0.0) for k in keys],
                                                            np.float64))
        return [dict(zip(keys, map(float, row))) for row in np.asarray(rows)]


def _replicated(params, mesh):
    """Every leaf replicated over `mesh`: an engine without tensor parallelism."""
    return jax.tree.map(lambda _: NamedSharding(mesh, P()), params)


NAMES_BYTES = 8192
"""Room for one host's perf key names in `every_host` (a step logs a few dozen)."""

WIRINGS = {"single": Single, "colocated": Colocated}


def join(mode: str, devices_per_host: int = 0, train: TrainConfig | None = None,
         tp: int = 1) -> Single | Colocated:
    """Join the hosts this process belongs to (`distributed.initialize`), then wire `mode`
    with the learner's mesh `train` and rollout tensor parallelism `tp`."""
    if mode not in WIRINGS:
        raise ValueError(f"mode {mode!r} has no in-process wiring; choose from "
                         f"{sorted(WIRINGS)} (the Ray modes start through fleet/driver.py)")
    host = distributed.initialize(devices_per_host=devices_per_host or None)
    return WIRINGS[mode](host, train, tp)
