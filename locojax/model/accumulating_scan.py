"""The layer scan whose backward adds each layer's weight gradient into a running sum, in place.

Differentiated the usual way, `lax.scan` over stacked [L, ...] weights returns their gradient
as a new [L, ...] buffer (the backward scan's stacked outputs); a train step that sums
micro-batches then holds two f32 copies of the layers' gradients, the running sum and the
micro-batch's own (2.4 GB more at Qwen3-0.6B, issue 55). `scan` takes the running sum `acc`
as an argument and, under `jax.vjp`/`grad`, returns as `acc`'s cotangent `acc` plus this
call's weight gradient: its backward is a reverse scan carrying `acc`, which adds layer i's
gradient into `acc[i]` (a dynamic-update-slice of the carried, donated buffer: in place), so
only one layer's gradient exists beside it. The weights themselves get no cotangent (zero):
their gradient is what arrives in `acc`. `rl/gradients.accumulate` threads the train step's
f32 sum through it (`decoder.forward(..., layer_grads=)`, `logprobs.prefix_hidden`).

The backward rematerialises: the forward keeps each layer's input (the carry), and the
backward runs `jax.vjp` of that layer again from it, exactly what `jax.checkpoint` of the
scanned body does (`decoder.forward(remat=True)`), so it serves the remat path only; the
layer's arithmetic, and so each layer's gradient, is the plain scan's (tests/test_grad_in_place.py
compares them in f64).

Reference: the "gradient accumulation in the backward" of Megatron-LM's
`gradient_accumulation_fusion` (a wgrad GEMM that accumulates into `main_grad`), here as a
custom VJP of the whole layer scan (JAX docs, "Custom derivative rules": `jax.custom_vjp`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def scan(body, carry, weights, kinds, acc, consts=(), unroll: bool = False):
    """`carry` after every layer: `body(carry, w, kind, consts)` over the stacked `weights`
    and `kinds` ([L, ...] each), as `lax.scan` (remat: each layer's input kept).

    Under differentiation the cotangent of `acc` (f32 pytree like `weights`) is `acc` plus
    d(out)/d(weights), summed layer by layer into `acc` in place; `weights`, `kinds` and
    `consts` get zero cotangents. `body` must be a function of its arguments alone (close
    over nothing traced: pass arrays in `consts`)."""
    return _scan(body, unroll, carry, weights, kinds, acc, consts)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _scan(body, unroll, carry, weights, kinds, acc, consts):
    del acc  # the forward does not read it: only its cotangent means something
    out, _ = jax.lax.scan(lambda c, xs: (body(c, *xs, consts), None), carry, (weights, kinds),
                          unroll=unroll)
    return out


def _forward(body, unroll, carry, weights, kinds, acc, consts):
    """The forward, keeping each layer's input carry [L, ...] for the backward."""
    out, inputs = jax.lax.scan(lambda c, xs: (body(c, *xs, consts), c), carry,
                               (weights, kinds), unroll=unroll)
    return out, (inputs, weights, kinds, acc, consts)


def _backward(body, unroll, residuals, ct_out):
    """Layers last to first: layer i's vjp from its kept input, its weight gradient added
    into acc[i] where acc is carried (in place), the input's cotangent passed down."""
    inputs, weights, kinds, acc, consts = residuals
    layers = jax.tree.leaves(weights)[0].shape[0]

    def layer(state, xs):
        ct, acc = state
        c, w, kind, i = xs
        _, pullback = jax.vjp(lambda c, w: body(c, w, kind, consts), c, w)
        ct, grads = pullback(ct)
        acc = jax.tree.map(lambda a, g: jax.lax.dynamic_update_index_in_dim(
            a, jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False) + g.astype(a.dtype), i, 0),
            acc, grads)
        return (ct, acc), None

    (ct, acc), _ = jax.lax.scan(layer, (ct_out, acc),
                                (inputs, weights, kinds, jnp.arange(layers, dtype=jnp.int32)),
                                reverse=True, unroll=False)
    return ct, None, None, acc, None  # None: a zero cotangent for that whole argument


_scan.defvjp(_forward, _backward)
