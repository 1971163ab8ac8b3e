"""The kernel list read from a compiled program's HLO (`benchmarks/hlo_kernels.py`)."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.hlo_kernels import Dot, kernels, type_bytes


def _program(fn, *args):
    return kernels(jax.jit(fn).lower(*args).compile().as_text())


def test_type_bytes_of_arrays_and_tuples():
    assert type_bytes("f32[2,3]{1,0}") == 24
    assert type_bytes("(s32[], bf16[4,8]{1,0}, pred[3])") == 4 + 64 + 3
    assert type_bytes("f32[]") == 4


def test_one_matmul_is_one_dot_kernel_of_its_shape():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 32))
    prog = _program(lambda x, w: x @ w, x, w)
    dots = [d for k in prog.kernels for d in k.dots]
    assert dots == [Dot(1, 8, 16, 32)]
    assert prog.dot_flops == 2 * 8 * 16 * 32


def test_a_scan_multiplies_its_body_by_the_trip_count():
    """cost_analysis counts a loop's body once; the kernel list counts it per iteration."""
    w = jnp.ones((5, 16, 16))

    def f(x, w):
        return jax.lax.scan(lambda c, wl: (jnp.tanh(c @ wl), None), x, w)[0]

    x = jnp.ones((4, 16))
    prog = _program(f, x, w)
    assert prog.unknown_loops == []
    assert prog.dot_flops == 5 * 2 * 4 * 16 * 16
    assert prog.launches >= 5  # at least the dot, each iteration


def test_a_loop_of_unknown_count_is_named_and_counted_once():
    def f(x):
        return jax.lax.while_loop(lambda c: c[0] < c[1].sum(), lambda c: (c[0] + 1, c[1] @ c[1]),
                                  (0, x))[1]

    prog = _program(f, jnp.ones((8, 8)))
    assert len(prog.unknown_loops) == 1
    assert prog.dot_flops == 2 * 8 * 8 * 8


def test_a_sliced_operand_reads_only_its_slice():
    """A scanned layer reads its slice of the stacked weights, not the whole stack: the
    bytes of the scan stay those of one [16, 16] slice per iteration (plus carries), far
    below the whole [64, 16, 16] stack per iteration."""
    w = jnp.ones((64, 16, 16))
    prog = _program(lambda x, w: jax.lax.scan(lambda c, wl: (c @ wl, None), x, w)[0],
                    jnp.ones((4, 16)), w)
    moved = sum(k.bytes * k.count for k in prog.kernels)
    assert moved < 64 * (64 * 16 * 16 * 4) / 4


@pytest.mark.parametrize("preset", ["tiny"])
def test_train_step_dots_are_the_cost_models_flops(preset):
    """The dots of the compiled train step are the analytic model's FLOPs (flops.py counts
    only matmuls, as the dots are): equal to float rounding, TINY being unrolled and the
    kernel list counting every layer."""
    from locojax.model import config
    from benchmarks.kernel_programs import compiled_update
    from locojax.predict.flops import ModelCosts

    cfg = getattr(config, preset)()
    compiled = compiled_update(cfg, 4, 4, 20, 48)
    prog = kernels(compiled.as_text())
    model = ModelCosts(cfg, "float32").train_step(16, 4, 20, 48).flops
    assert prog.dot_flops == pytest.approx(model, rel=1e-9)
