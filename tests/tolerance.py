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
