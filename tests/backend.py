"""What a test needs of the backend it runs on (`make test-accelerator` runs the tests marked
`accelerator` on whatever JAX finds): devices enough for its mesh, and float64 only where
the backend computes it natively. The CPU suite has 8 simulated devices and f64, so neither
helper skips there; on one TPU chip a 2-device layout or an f64 reference is skipped with
its reason, not failed."""

import jax
import numpy as np
import pytest


def devices(n: int) -> list:
    """The first `n` devices, or a skip naming how many this backend has."""
    have = jax.devices()
    if len(have) < n:
        pytest.skip(f"needs {n} devices; {jax.default_backend()} has {len(have)} here")
    return have[:n]


def f64_or_skip(dtype) -> None:
    """Skip an f64 case where XLA emulates f64 (TPU): the f64 references run on the CPU."""
    if np.dtype(dtype) == np.float64 and jax.default_backend() == "tpu":
        pytest.skip("XLA:TPU has no native f64: the f64 reference runs in the CPU suite")


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a test's `locojax` subprocesses. Under `make test-accelerator`'s
    second pytest (LOCOJAX_ACCELERATOR_RUN=children) the pytest process itself stays on the
    CPU, since one process at a time can hold a TPU chip, and its children get the
    accelerator back: JAX_PLATFORMS, which pins the parent to the CPU, is dropped for them."""
    import os

    env = dict(os.environ, **extra)
    if os.environ.get("LOCOJAX_ACCELERATOR_RUN") == "children":
        env.pop("JAX_PLATFORMS", None)
    return env


def children_on_accelerator() -> bool:
    """Whether this run's children must have run on an accelerator (checked by the tests,
    so that a child that fell back to the CPU cannot pass as an accelerator run)."""
    import os

    return os.environ.get("LOCOJAX_ACCELERATOR_RUN") == "children"
