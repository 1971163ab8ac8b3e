"""The backend's f32 elementwise accuracy against `tolerance.ELEMENTWISE`, the table every
backend-aware bound reads: each function over 2M dense samples of its range, against numpy
in f64, under its error model. `-s` prints what was measured (how a new backend's row is
made); the test fails where the backend is worse than its row, so a bound derived from the
table cannot rest on an accuracy the backend does not have."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import tolerance

pytestmark = pytest.mark.accelerator

U = tolerance.unit_roundoff("float32")
N = 2_000_000
FUNCTIONS = {"exp": (jnp.exp, np.exp), "log": (jnp.log, np.log), "tanh": (jnp.tanh, np.tanh),
             "div": (lambda x: 1.0 / x, lambda x: 1.0 / x), "sqrt": (jnp.sqrt, np.sqrt),
             "rsqrt": (jax.lax.rsqrt, lambda x: 1.0 / np.sqrt(x))}


def measured(fn: str) -> float:
    """The largest error of `fn` over the samples, in u under its error model."""
    ours, exact = FUNCTIONS[fn]
    lo, hi = tolerance.RANGES[fn]
    rng = np.random.default_rng(0)
    if fn in ("log", "sqrt", "rsqrt"):  # log-uniform over the decades
        x = np.exp(rng.uniform(np.log(lo), np.log(hi), N))
    else:
        x = rng.uniform(lo, hi, N)
    x = x.astype(np.float32)
    got = np.asarray(jax.jit(ours)(jnp.asarray(x)), np.float64)
    want = exact(x.astype(np.float64))
    keep = np.isfinite(want) & (np.abs(want) < np.finfo(np.float32).max)
    got, want = got[keep], want[keep]
    floor = 1.0 if tolerance.ERROR_MODEL[fn] == "absolute" else 0.0
    return float((np.abs(got - want) / np.maximum(floor, np.abs(want))).max() / U)


@pytest.mark.parametrize("fn", list(FUNCTIONS))
def test_elementwise_error_within_the_backends_row(fn):
    got, row = measured(fn), tolerance.elementwise(fn)
    print(f"{jax.default_backend()} {fn}: {got:.1f} u (row {row})")
    assert got <= row, (f"{fn} on {jax.default_backend()} is off by {got:.1f} u, more than "
                        f"its row in tolerance.ELEMENTWISE ({row}): every bound derived "
                        "from that row is too tight here")
