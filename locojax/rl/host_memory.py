"""Held state kept in host memory between the programs that read it (JAX memory kinds).

A run holds the reference policy's weights (β > 0) all run, but only one program reads them:
the reference logprobs before each train step (`train_step.with_reference`); and it holds
AdamW's moments all run, but only the train step reads them. When the memory plan needs the
room (`memory_plan.MemoryPlan.offloaded`), the trainer keeps them in the host's pinned
memory (`sharding.with_memory_kind("pinned_host")`), and `to_device` copies them back onto
the device, in the layout the program was compiled for, for that program alone: the
reference's copy is freed when its program returns, so the rollout and the train step run
without it; the moments go back to the host after each step (`Trainer.step`), so the
rollout runs without them. On a TPU v5e at Qwen3-0.6B that is 2.38 GB (reference) and 4.77
GB (moments) off the device for 2.38 GB and 2 x 4.77 GB of copies per step over the host
link (derived, not measured here: benchmarks/tpu/qwen3_fit.sh times the step with them).

XLA:CPU in jax 0.10.2 offers the memory kinds `device`, `pinned_host` and `unpinned_host` on
every CPU device, and `device_put` between them copies (the same RAM: no device memory is
saved there, but the moves and the jit-cache hits are exercised, tests/test_offload.py).
`supported` asks the device, so a backend without host memory kinds keeps the reference on
the device.

Reference: JAX docs, "Memory and computation offloading" (memory kinds, `pinned_host`).
"""

from __future__ import annotations

import jax

HOST = "pinned_host"


def supported(device=None) -> bool:
    """Whether `device` (default: the first local one) has host memory arrays can live in."""
    device = device or jax.local_devices()[0]
    try:
        return HOST in {m.kind for m in device.addressable_memories()}
    except (AttributeError, NotImplementedError, jax.errors.JaxRuntimeError):
        return False


def _kind(x) -> str | None:
    return getattr(getattr(x, "sharding", None), "memory_kind", None)


def on_host(tree) -> bool:
    """Whether every array of `tree` lives in host memory."""
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(_kind(x) == HOST for x in leaves)


def to_host(tree):
    """A copy of `tree` in host memory, each array sharded as it was (its device buffers
    are not freed here: drop the device tree to free them)."""
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding.with_memory_kind(HOST)), tree)


def to_device(tree):
    """`tree` with every array that lives in host memory copied onto its devices' own
    memory, in the same layout; the others as given."""
    if not any(_kind(x) == HOST for x in jax.tree.leaves(tree)):
        return tree
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding.with_memory_kind("device"))
                        if _kind(x) == HOST else x, tree)
