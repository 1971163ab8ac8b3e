"""Where a run's weights live: the learner's mesh (`--train.mesh`), the rollout's
(`--rollout.tp`), and the move between them each step.

    --train.mesh data=2,fsdp=4    # 8 learner devices: batch over both axes, params, grads
                                  # and Adam moments sharded over `fsdp` (TRAIN_FSDP)
    --rollout.tp 2                # each host generates with heads / mlp / vocab split over
                                  # 2 of its devices (ROLLOUT_TP), batch over the rest

The learner's devices are laid out data-major, fsdp-minor, in process order, so the batch,
split over (data, fsdp), lands on the same devices as over a plain `data` mesh, and an
fsdp group spans hosts only when F exceeds a host's devices. Rollout always stays inside a
host (docs/design.md: no cross-host synchronisation during decode), so before each step's
rollout the weights move from the training layout to the rollout layout in one program
(`to_layout`; across hosts to `across_hosts`' layout, then `local_view`): the step's
`perf/phase/reshard`. No device holds the whole params for the move: from FSDP F to
tensor-parallel rollout over the same F devices, XLA's SPMD partitioner sends each shard where
it belongs (all-to-all).

References: levanter's separate parameter and compute mappings; Tunix `role_to_mesh`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from locojax.model.sharding import ROLLOUT_REPLICATED, ROLLOUT_TP, RULES, Rules, make_mesh

TRAIN_AXES = ("data", "fsdp")
"""The axes `--train.mesh` may name, in the order the devices are laid out (fsdp innermost)."""


def parse_mesh(text: str) -> dict[str, int]:
    """`--train.mesh` as {axis: size}: `data=D,fsdp=F` (either may be left out: size 1).
    Empty: {} (data parallel over every learner device)."""
    where = f"--train.mesh {text!r}"
    sizes: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, eq, value = (s.strip() for s in item.partition("="))
        if not eq:
            raise ValueError(f"{where}: {item!r} is not AXIS=SIZE (write e.g. data=2,fsdp=4)")
        if name not in TRAIN_AXES:
            raise ValueError(f"{where}: unknown axis {name!r}; the axes are "
                             f"{', '.join(TRAIN_AXES)}")
        if name in sizes:
            raise ValueError(f"{where}: axis {name!r} is given twice")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{where}: {name}={value!r} must be a whole number >= 1")
        sizes[name] = int(value)
    if text.strip() and not sizes:
        raise ValueError(f"{where}: no axis given (write e.g. data=2,fsdp=4)")
    return {a: sizes[a] for a in TRAIN_AXES if a in sizes}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How the learner lays out its state over its devices."""

    mesh: str = ""
    """The learner's mesh, `data=D,fsdp=F` (an axis left out has size 1): the batch is split
    over all D x F devices, and params, gradients and Adam moments are sharded over `fsdp`
    on their model-width axis (ZeRO-3 style), so each device holds 1/F of them. D x F must
    be the learner's devices (all hosts'). Empty: `data` over every device (params
    replicated). Every mode (in disaggregated and async, the learner group's)."""

    def __post_init__(self):
        parse_mesh(self.mesh)

    @property
    def fsdp(self) -> int:
        return parse_mesh(self.mesh).get("fsdp", 1)

    @property
    def rules(self) -> str:
        """`LearnerConfig.rules`: train_fsdp once params are sharded, else train_dp."""
        return "train_fsdp" if self.fsdp > 1 else "train_dp"

    def shape(self, devices: int) -> dict[str, int]:
        """The mesh over `devices` learner devices; refuses a setting that does not cover them."""
        sizes = parse_mesh(self.mesh)
        if not sizes:
            return {"data": devices}
        data, fsdp = sizes.get("data", 1), sizes.get("fsdp", 1)
        if data * fsdp != devices:
            raise ValueError(f"--train.mesh {self.mesh!r} covers data x fsdp = {data} x {fsdp} "
                             f"= {data * fsdp} devices, but the learner has {devices}: the "
                             f"product must equal {devices}")
        return {"data": data} if fsdp == 1 else {"data": data, "fsdp": fsdp}


def check_tp(tp: int, local_devices: int, flag: str = "--rollout.tp") -> None:
    """The tensor-parallel size `flag` names (`--rollout.tp`, `eval --tp`) must split a
    host's devices into whole groups."""
    if tp < 1 or local_devices % tp:
        raise ValueError(f"{flag} {tp} does not divide this host's {local_devices} "
                         "device(s): rollout is tensor-parallel within a host")


def check_tp_model(tp: int, model_cfg, flag: str = "--rollout.tp") -> None:
    """Refuse a tp that would leave the attention or the MLP unsplit (a rule whose axis does
    not divide a dimension falls back to replication: `sharding.spec`). K/V heads fewer than
    tp are replicated, as in Megatron's GQA."""
    for name in ("num_attention_heads", "intermediate_size"):
        if getattr(model_cfg, name) % tp:
            raise ValueError(f"{flag} {tp} does not divide the model's {name} "
                             f"({getattr(model_cfg, name)})")


def train_mesh(cfg: TrainConfig, devices) -> tuple[Mesh, Rules]:
    """The learner's mesh over `devices` (process order) and its rules table."""
    return make_mesh(cfg.shape(len(devices)), devices), RULES[cfg.rules]


def rollout_mesh(tp: int, local_devices) -> tuple[Mesh, Rules]:
    """One host's rollout mesh and its rules: `data` over its devices, or data x tensor."""
    check_tp(tp, len(local_devices))
    if tp == 1:
        return make_mesh({"data": len(local_devices)}, local_devices), ROLLOUT_REPLICATED
    return make_mesh({"data": len(local_devices) // tp, "tensor": tp}, local_devices), ROLLOUT_TP


def replicated(params, mesh: Mesh):
    """`params` replicated over `mesh` (an all-gather over `fsdp`; a no-op when they are
    already): the whole model on every device, e.g. to export it."""
    if all(x.is_fully_replicated for x in jax.tree.leaves(params)):
        return params
    return _gather(mesh)(params)


@functools.cache
def _gather(mesh: Mesh):
    return jax.jit(lambda tree: tree, out_shardings=NamedSharding(mesh, P()))


def to_layout(tree, shardings):
    """`tree` laid out as `shardings` (a tree of NamedShardings over the same devices) say, in
    one program that every process holding a part of it joins (`layout_program`). Where a
    leaf's layout changes, XLA's SPMD partitioner moves its shards device to device: when
    the rollout's tensor groups are the learner's fsdp groups (F = T, e.g. fsdp 8 and tp 8),
    FSDP's model-width shards become head, MLP and vocabulary shards by all-to-alls, never
    through a whole replica. When they are not (data 2 x fsdp 4 to tensor 2), XLA replicates
    each such weight on its way ("involuntary full rematerialization"): the whole of one
    weight at a time, not the whole params. (`jax.device_put` between two shardings in one
    process goes through the host's copy of each whole array.) Leaves already laid out so
    are returned as they are (no copy)."""
    leaves, treedef = jax.tree.flatten(tree)
    moving, program = layout_program(tree, shardings)
    if moving:
        for i, x in zip(moving, program([leaves[i] for i in moving])):
            leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)


def layout_program(tree, shardings):
    """(the positions of `tree`'s leaves whose layout `to_layout` changes, the jitted program
    that moves them: a list of those leaves in, the list laid out as `shardings` out). `tree`
    may be abstract (ShapeDtypeStructs with shardings): the memory plan compiles the program
    that each step then runs."""
    leaves, treedef = jax.tree.flatten(tree)
    targets = treedef.flatten_up_to(shardings)
    moving = [i for i, (x, s) in enumerate(zip(leaves, targets)) if not _same_layout(x, s)]
    return moving, _identity(tuple(targets[i] for i in moving))


@functools.cache
def _identity(shardings: tuple):
    """One jitted identity per target layout, so that each step's move hits its cache."""
    return jax.jit(lambda xs: xs, out_shardings=list(shardings))


def _same_layout(x, sharding) -> bool:
    """Whether every device of `sharding` already holds its part of `x` (device order and
    mesh shape aside: a replicated leaf is laid out alike on any mesh of its devices)."""
    have = x.sharding
    if have.device_set != sharding.device_set:
        return False
    return have.devices_indices_map(x.shape) == sharding.devices_indices_map(x.shape)


def host_devices(process: int) -> list:
    """Process `process`'s devices, by id: a host's rollout mesh and its block of
    `across_hosts`' mesh list them in this order, so their device positions coincide."""
    return sorted((d for d in jax.devices() if d.process_index == process), key=lambda d: d.id)


def across_hosts(shardings):
    """The global layout whose shards on each host are the host-local layout `shardings`
    (NamedShardings over this host's rollout mesh, `host_devices` order): the same specs
    over a mesh {host: H, *the local mesh's axes}, so replicated across hosts. The move to
    it is the cross-host part of the reshard; `local_view` then takes each host's part."""
    local = jax.tree.leaves(shardings)[0].mesh
    hosts = jax.process_count()
    grid = np.stack([np.asarray(host_devices(p)).reshape(local.devices.shape)
                     for p in range(hosts)])
    mesh = Mesh(grid, ("host", *local.axis_names),
                axis_types=(AxisType.Auto,) * (1 + len(local.axis_names)))
    return jax.tree.map(lambda s: NamedSharding(mesh, s.spec), shardings)


def local_view(tree, shardings):
    """This host's part of a multi-process `tree` laid out as `across_hosts(shardings)`, as
    arrays laid out as `shardings` on its local mesh: its own shards, no copy, no collective."""
    if all(x.is_fully_addressable for x in jax.tree.leaves(tree)):
        return tree

    def local(x, sharding):
        shards = {s.device: s.data for s in x.addressable_shards}
        return jax.make_array_from_single_device_arrays(
            x.shape, sharding,
            [shards[d] for d in sharding.addressable_devices_indices_map(x.shape)])

    return jax.tree.map(local, tree, shardings)


def host_copy(tree):
    """Every leaf of `tree` whole, as numpy in this process's memory, with no whole copy of
    the params on any device: what the Ray modes publish as a version.

    Each leaf is assembled from this host's shards (one device-to-host copy per distinct
    shard). A leaf sharded over an fsdp group that spans hosts has shards this host lacks:
    it is first moved, alone, to `spread_over_hosts` (a whole copy per host, split over that
    host's devices: 1/L of the leaf on each of its L), in one program every process joins
    (each calls this at the same point), and copied out before the next leaf moves. So a
    device holds at most 1/L of one leaf beyond its own shards; a host of one device holds
    one whole leaf at a time, never the whole params, which `replicated` put on every
    learner device."""
    return jax.tree.map(_host_leaf, tree)


def _host_leaf(x):
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    if not _every_host_holds_it(x):
        x = to_layout(x, spread_over_hosts(x, _hosts_grid()))
    return assemble(x)


def assemble(x) -> np.ndarray:
    """`x` whole in numpy, from this process's shards; they must cover it."""
    out, seen = np.empty(x.shape, x.dtype), set()
    for shard in x.addressable_shards:
        box = _box(shard.index, x.shape)
        if box not in seen:
            seen.add(box)
            out[shard.index] = np.asarray(shard.data)
    if _size(seen) != x.size:
        raise ValueError(f"this process's shards of a {x.shape} array do not cover it "
                         f"({x.sharding})")
    return out


def _box(index, shape) -> tuple:
    """A shard's index as ((start, stop) per dim): equal for replicas of the same shard."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _size(boxes) -> int:
    """Elements in distinct boxes (shards of a NamedSharding are equal or disjoint)."""
    return sum(int(np.prod([b - a for a, b in box])) for box in boxes)


def _every_host_holds_it(x) -> bool:
    """Whether each process's devices hold every part of `x` (the same answer on every
    process: computed from the global layout). Shards of a NamedSharding are equal or
    disjoint, so a process covers `x` when its distinct shards add up to its size."""
    boxes: dict[int, set] = {}
    for device, index in x.sharding.devices_indices_map(x.shape).items():
        boxes.setdefault(device.process_index, set()).add(_box(index, x.shape))
    return all(_size(held) == x.size for held in boxes.values())


@functools.cache
def _hosts_grid() -> np.ndarray:
    """Every process's devices, a row per process (`host_devices` order)."""
    return np.stack([np.asarray(host_devices(p)) for p in range(jax.process_count())])


def spread_over_hosts(x, grid: np.ndarray) -> NamedSharding:
    """A whole copy of `x` per row of `grid` (a host), split over the row's L devices on the
    dimension `x` is sharded on (or the first that L divides); replicated over the row when
    none is (a norm scale, or L = 1)."""
    mesh = Mesh(grid, ("host", "local"), axis_types=(AxisType.Auto,) * 2)
    L = grid.shape[1]
    spec = getattr(x.sharding, "spec", ())
    dims = [d for d, axes in enumerate(spec) if axes is not None] + list(range(x.ndim))
    dim = next((d for d in dims if L > 1 and x.shape[d] % L == 0), None)
    if dim is None:
        return NamedSharding(mesh, P())
    return NamedSharding(mesh, P(*[None] * dim, "local"))


def another_layout(engine_shardings, params) -> bool:
    """Whether the engine's weights are laid out otherwise than the training params (FSDP
    training, tensor-parallel rollout), so that rollout needs a copy of them. In the same
    layout (both replicated) it reads the params' own buffers, even on another mesh
    (`Colocated.rollout_weights`: a host's shards viewed on its local mesh)."""
    def spec(sharding):
        s = tuple(getattr(sharding, "spec", ()) or ())
        while s and s[-1] is None:
            s = s[:-1]
        return s

    return any(spec(e) != spec(p.sharding)
               for e, p in zip(jax.tree.leaves(engine_shardings), jax.tree.leaves(params)))
