"""Where a run's weights live: the learner's mesh (`--train.mesh`), the rollout's
(`--rollout.tp`), and the move between them each step.

    --train.mesh data=2,fsdp=4    # 8 learner devices: batch over both axes, params, grads
                                  # and Adam moments sharded over `fsdp` (TRAIN_FSDP)
    --rollout.tp 2                # each host generates with heads / mlp / vocab split over
                                  # 2 of its devices (ROLLOUT_TP), batch over the rest

The learner's devices are laid out data-major, fsdp-minor, in process order, so the batch,
split over (data, fsdp), lands on the same devices as over a plain `data` mesh, and an
fsdp group spans hosts only when F exceeds a host's devices. Rollout always stays inside a
host (DESIGN.md: no cross-host synchronisation during decode), so before each step's
rollout the weights move from the training layout to the rollout layout (`replicated`, then
the engine's `place_weights`): the step's `perf/phase/reshard`.

References: levanter's separate parameter and compute mappings; Tunix `role_to_mesh`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

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
    replicated). Single and colocated modes."""

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


def check_tp(tp: int, local_devices: int) -> None:
    """`--rollout.tp` must split a host's devices into whole tensor-parallel groups."""
    if tp < 1 or local_devices % tp:
        raise ValueError(f"--rollout.tp {tp} does not divide this host's {local_devices} "
                         "device(s): rollout is tensor-parallel within a host")


def check_tp_model(tp: int, model_cfg) -> None:
    """Refuse a tp that would leave the attention or the MLP unsplit (a rule whose axis does
    not divide a dimension falls back to replication: `sharding.spec`). K/V heads fewer than
    tp are replicated, as in Megatron's GQA."""
    for name in ("num_attention_heads", "intermediate_size"):
        if getattr(model_cfg, name) % tp:
            raise ValueError(f"--rollout.tp {tp} does not divide the model's {name} "
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
    already): the whole model on every device, e.g. to hand each host its replica or to
    export it."""
    if all(x.is_fully_replicated for x in jax.tree.leaves(params)):
        return params
    return _gather(mesh)(params)


@functools.cache
def _gather(mesh: Mesh):
    return jax.jit(lambda tree: tree, out_shardings=NamedSharding(mesh, P()))


def local_replica(params, mesh: Mesh):
    """This host's replica of replicated (possibly multi-process) params: its own shards,
    viewed as arrays on `mesh` (its local devices): no copy, no collective."""
    if all(x.is_fully_addressable for x in jax.tree.leaves(params)):
        return params
    sharding = NamedSharding(mesh, P())

    def local(x):
        shards = {s.device: s.data for s in x.addressable_shards}
        return jax.make_array_from_single_device_arrays(
            x.shape, sharding, [shards[d] for d in np.asarray(mesh.devices).flat])

    return jax.tree.map(local, params)
