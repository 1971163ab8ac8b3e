"""`train_state.apply_in_place` is optax's AdamW chain, written so XLA updates in place.

Compared with `optimizer(cfg).update` + `optax.apply_updates` on TINY-shaped weights over
three updates (warmup schedule, masked weight decay, clipped, not, clipped), in float64: the
two differ only by rounding (XLA fuses them differently, and the clip rounds differently),
which in f32 reaches 1e-4 relative where a moment's terms cancel, close to what a wrong
formula would give. A rejected update (`ok` False) must leave every leaf bitwise unchanged.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from locojax.model import config, params
from locojax.rl import train_state
from locojax.rl.config import OptimConfig

MODEL = config.tiny()


def _grads(seed, scale, dtype=jnp.float32):
    """Random gradients shaped like the weights (numpy: no per-leaf compiles)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: (scale * rng.standard_normal(s.shape)).astype(dtype),
                        params.abstract(MODEL))


def _f64(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def test_in_place_update_equals_optax():
    cfg = OptimConfig(lr=1e-3, warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0)
    tx = train_state.optimizer(cfg, MODEL)
    with jax.enable_x64(True):
        start = _f64(jax.jit(params.init, static_argnums=0)(MODEL, jax.random.key(0)))
        ours, theirs = start, start
        ours_opt = theirs_opt = jax.jit(tx.init)(start)

        @jax.jit
        def reference(p, o, g):
            u, o = tx.update(g, o, p)
            return optax.apply_updates(p, u), o

        @jax.jit
        def in_place(p, o, g):
            return train_state.apply_in_place(p, o, g, optax.tree.norm(g), jnp.bool_(True),
                                              cfg, MODEL)

        for step, grad_scale in enumerate([1.0, 1e-3, 1.0]):  # global norm ~300 (clipped), ~0.3
            g = _grads(step, grad_scale, jnp.float64)
            theirs, theirs_opt = reference(theirs, theirs_opt, g)
            ours, ours_opt = in_place(ours, ours_opt, g)
            assert jax.tree.structure(ours_opt) == jax.tree.structure(theirs_opt)
            # Every quantity is a handful of f64 operations (u = 2^-53) on terms no larger
            # than the leaf's largest entry, so rounding differences stay below ~1e-15 of
            # it even where terms cancel; 1e-12 leaves room, and a wrong term (bias
            # correction, decay mask, schedule) moves values by >= 1e-4 of it.
            for a, b in zip(jax.tree.leaves((ours, ours_opt)), jax.tree.leaves((theirs,
                                                                               theirs_opt))):
                a, b = np.asarray(a), np.asarray(b)
                assert a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * max(np.abs(b).max(), 1))
        # Something must actually have moved, or the comparison above proves nothing.
        moved = max(np.abs(np.asarray(a) - b).max() for a, b in zip(jax.tree.leaves(ours),
                                                                    jax.tree.leaves(start)))
        assert moved > 1e-4  # three lr-1e-3 Adam steps: ~lr per entry each


def test_rejected_update_changes_nothing():
    cfg = OptimConfig(lr=1e-3, weight_decay=0.1)
    p = jax.jit(params.init, static_argnums=0)(MODEL, jax.random.key(0))
    o = jax.jit(train_state.optimizer(cfg, MODEL).init)(p)
    g = _grads(0, 1.0)
    p2, o2 = jax.jit(lambda p, o, g: train_state.apply_in_place(
        p, o, g, optax.tree.norm(g), jnp.bool_(False), cfg, MODEL))(p, o, g)
    for a, b in zip(jax.tree.leaves((p, o)), jax.tree.leaves((p2, o2))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
