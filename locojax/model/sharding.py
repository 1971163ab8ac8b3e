"""Logical axes → mesh axes, one rules table per role.

Training and rollout map the same logical axes differently (as levanter's parameter vs
compute mappings, or Tunix's `is_sampling`):
- TRAIN_DP: params replicated, batch over `data` (plain data parallel; best for small models).
- TRAIN_FSDP: params additionally sharded over `fsdp` on their model-width axis.
- ROLLOUT_REPLICATED: every local device holds the whole model; batch over `data`.
- ROLLOUT_TP: heads / mlp / vocab over `tensor` inside one host.

A rule naming a mesh axis the mesh does not have, or a dimension the axis does not divide,
falls back to replication, so one table serves every mesh size.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from locojax.model.params import declare, is_decl

Rules = dict[str, str | None]

TRAIN_DP: Rules = {"batch": "data"}
TRAIN_FSDP: Rules = {"batch": ("data", "fsdp"), "embed": "fsdp"}
ROLLOUT_REPLICATED: Rules = {"batch": "data"}
ROLLOUT_TP: Rules = {
    "batch": "data", "q_heads": "tensor", "kv_heads": "tensor", "mlp": "tensor", "vocab": "tensor",
}
RULES = {
    "train_dp": TRAIN_DP, "train_fsdp": TRAIN_FSDP,
    "rollout_replicated": ROLLOUT_REPLICATED, "rollout_tp": ROLLOUT_TP,
}


def make_mesh(shape: dict[str, int], devices=None) -> Mesh:
    """A mesh with Auto axes (jax 0.10's `make_mesh` defaults to Explicit ones)."""
    devices = jax.devices() if devices is None else devices
    size = int(np.prod(list(shape.values())))
    if size != len(devices):
        raise ValueError(f"mesh {shape} needs {size} devices, but {len(devices)} are available")
    grid = np.asarray(devices).reshape(tuple(shape.values()))
    return Mesh(grid, tuple(shape), axis_types=(AxisType.Auto,) * len(shape))


def spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh, rules: Rules) -> P:
    """PartitionSpec for one array, dropping rules that do not fit this mesh."""
    out = []
    for logical, dim in zip(axes, shape):
        mesh_axes = rules.get(logical) if logical else None
        if mesh_axes is not None:
            names = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
            names = tuple(a for a in names if a in mesh.shape)
            size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
            mesh_axes = None if not names or size == 1 or dim % size else (
                names[0] if len(names) == 1 else names)
        out.append(mesh_axes)
    return P(*out)


def weight_shardings(cfg, mesh: Mesh, rules: Rules, decls=None):
    """NamedSharding per weight, derived from the declarations (`decls`: another declared
    tree than the model's weights, e.g. its LoRA adapters, `lora.declare`)."""
    return jax.tree.map(lambda w: NamedSharding(mesh, spec(w.axes, w.shape, mesh, rules)),
                        declare(cfg) if decls is None else decls, is_leaf=is_decl)


def batch_sharding(mesh: Mesh, rules: Rules, ndim: int, batch_size: int | None = None):
    """Sharding for a [B, ...] batch array: B over the rules' batch axis."""
    shape = (batch_size or 0,) + (1,) * (ndim - 1)
    axes = ("batch",) + (None,) * (ndim - 1)
    if batch_size is None:  # caller promises divisibility
        shape = (int(np.prod(list(mesh.shape.values()))),) + shape[1:]
    return NamedSharding(mesh, spec(axes, shape, mesh, rules))
