"""The suite's float tolerances: derived from unit roundoff, reduction depth and scale.

XLA:CPU picks its kernels by CPU model (vector width, matmul blocking, how work is split over
threads), so two programs that compute the same sum, or one program on two CPUs, may add its
terms in different orders. A bound that merely passed on one machine proves nothing; each
bound in the suite is one of these:

  worst_case(n)     γ_n = n·u: a sum or dot product of n terms in ANY order has
                    |fl(s) - s| ≤ γ_n Σ|terms| (Higham, "Accuracy and Stability of Numerical
                    Algorithms", 2nd ed., §3.1; first order, n·u ≪ 1). Order-independent, so
                    it holds for every kernel on every CPU. Used where it is tight enough.
  probabilistic(n)  λ·√n·u with λ = 10: the same error when rounding errors are independent
                    and of mean zero, which holds with probability ≥ 1 - 2n·exp(-λ²/2) (> 1 -
                    1e-17 for n ≤ 4096) whatever the order (Higham & Mary, "A new approach to
                    probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019).
                    Used for deep chains (a forward and backward pass), where γ_n would be
                    too loose to tell rounding from a bug.

Both are relative to Σ|terms|; a comparison relative to the result's own magnitude adds the
condition number Σ|terms| / |Σ terms|, which is a property of the fixed test problem, not of
the CPU, and each use says how large it is. Where rounding and a real bug could be close in
f32, the test runs in float64 (`x64`), where the same bound is 2^29 times smaller.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

LAMBDA = 10.0  # probabilistic bound's confidence factor: failure probability ≤ 2n·e^-50


def unit_roundoff(dtype) -> float:
    """u: half the machine epsilon (2^-24 for f32, 2^-53 for f64, 2^-8 for bf16)."""
    return float(jnp.finfo(dtype).eps) / 2  # jnp's finfo knows bfloat16


def worst_case(depth: int, dtype=np.float32) -> float:
    """γ_n ≈ n·u: relative error bound of an n-term sum in any order."""
    return depth * unit_roundoff(dtype)


def probabilistic(depth: int, dtype=np.float32) -> float:
    """λ·√n·u: the same with independent rounding errors (Higham & Mary 2019)."""
    return LAMBDA * math.sqrt(depth) * unit_roundoff(dtype)


def x64():
    """Context in which jax computes in float64 (the suite's default is x64 off)."""
    return jax.enable_x64(True)


# --- elementwise functions, by backend ------------------------------------------------------
#
# The f32 elementwise functions are not correctly rounded, and how far off they are depends
# on the backend: XLA:CPU's exp and log are polynomial approximations within a few u, XLA:TPU's
# (v5e) are far coarser (log about 6e3 u, like a bf16-seeded approximation). A bound that
# counts an exp or a log as a few roundings is derived for the CPU only; on an accelerator it
# counts the backend's own error. ELEMENTWISE[backend][fn] is that error in units of u under
# fn's error model (ERROR_MODEL): the largest seen over 2M dense f32 samples of the range in
# RANGES against numpy in f64, rounded up by a quarter for the inputs between the samples:
# tests/test_backend_arithmetic.py measures it (`-s` prints the table) and fails on every run
# where a backend exceeds its row.

ERROR_MODEL = {"exp": "relative", "log": "absolute", "tanh": "absolute", "div": "relative",
               "sqrt": "relative", "rsqrt": "relative"}
"""relative: |got - f(x)| ≤ k·u·|f(x)|; absolute: |got - f(x)| ≤ k·u·max(1, |f(x)|) (log's
relative error is unbounded near x = 1, where it is near 0; its absolute error is what
reaches a loss)."""

RANGES = {"exp": (-80.0, 80.0), "log": (1e-30, 1e30), "tanh": (-10.0, 10.0),
          "div": (0.01, 100.0), "sqrt": (1e-6, 1e6), "rsqrt": (1e-6, 1e6)}
"""Where each function is checked: exp up to f32's overflow, log over 60 decades
(log-uniform), the others over what the model and losses feed them."""

ELEMENTWISE = {
    # XLA:CPU (Zen 4 and the TPU host's AVX2 CPU, 2026-12-06): exp 1.4, log 1.5, tanh 4.5,
    # div 1.0, sqrt 1.0, rsqrt 2.7; with the classic fusion emitters (`make test`'s
    # in-process phase) tanh 6.4 and rsqrt 3.1. 4 for exp and log is what the suite's CPU
    # bounds count; div and sqrt are correctly rounded (IEEE).
    "cpu": {"exp": 4, "log": 4, "tanh": 8, "div": 1, "sqrt": 1, "rsqrt": 4},
    # XLA:TPU, one v5e, JAX 0.10.2, libtpu 0.0.42.1 (2026-12-06): exp 135, log 1788, tanh
    # 738, div 2.0, sqrt 3.1, rsqrt 2.4 (sqrt and rsqrt sampled uniformly on [1e-6, 1e6]
    # then; this test samples them log-uniformly). docs/results/tpu_numerics.md.
    "tpu": {"exp": 170, "log": 2240, "tanh": 925, "div": 2.5, "sqrt": 4, "rsqrt": 3},
}
"""Per backend, each function's error in u (see above); a backend without a row has not
been measured, and `elementwise` refuses it rather than guess."""


def elementwise(fn: str, backend: str | None = None) -> float:
    """The error of `fn` on `backend` (default: jax's) in units of u, under ERROR_MODEL."""
    backend = backend or jax.default_backend()
    if backend not in ELEMENTWISE:
        raise KeyError(f"no measured elementwise accuracy for backend {backend!r}: run "
                       "`pytest -s tests/test_backend_arithmetic.py` there and add its row")
    return ELEMENTWISE[backend][fn]
