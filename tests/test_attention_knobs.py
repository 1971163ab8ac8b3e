"""The decode knobs an accelerator's profile may turn (benchmarks/tpu/decode_profile.py):
`attention.DECODE_AS_DOTS` (decode's scores and mixes as dots, not multiply-reduces),
`attention.HALF_AS_BITS` off (a bf16 cache sliced and updated as bf16, not as its bits) and
`attention.DECODE_KERNEL = "pallas"` (the cache read by one Pallas kernel in place; here in
Pallas' interpreter, so its math is checked, and its lowering to a Mosaic call for a v5e,
not its speed), each settable for a whole run by `LOCOJAX_DECODE`.

Checked, each with the knob seen to change the traced program (so a knob that does nothing
fails): decode attention as dots, and through the kernel, equals the multiply-reduce within
the blocked attention's derived bound plus the scores' own rounding (the kernel over row
tiles of 1 and 6 of a cache's first rows, from a first block past left padding, with
holes); and a generate under each knob samples the default's greedy tokens (decisive
argmax: the same in any program) with logprobs within the bound of two programs
(`logprob_tol`), over f32 and bf16 caches; the environment sets the knobs in a new
process, and a misspelt knob stops it, naming the known ones.
"""

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import attention, decode_kernel, decoder
from tests.hf_reference import assert_decisive_argmax, logprob_tol
from tests.test_attention_whole import _stale
from tests.test_long_decode import (  # weights: the module's fixture
    MODEL,
    _attention_bound,
    _attention_case,
    _rollout,
    _trainer_logprobs,
    weights,  # noqa: F401
)
from tests.tolerance import worst_case, x64


def _score_gap(q, dense, dtype) -> float:
    """Most two computations of one score q·k·scale can differ: each sum of H products is
    within γ_H·Σ_h |q_h k_h| of the exact one (the products exact or rounded once, which γ
    counts), times the scale."""
    k = np.asarray(dense[0][0], np.float64)  # [b, K, H, S]
    b, t, n, h = q.shape
    qa = np.abs(np.asarray(q, np.float64)).reshape(b, t, k.shape[1], n // k.shape[1], h)
    terms = np.einsum("btkgh,bkhs->bkgts", qa, np.abs(k))
    return 2 * worst_case(h + 1, dtype) * float(terms.max()) * h ** -0.5


@pytest.mark.parametrize("rows", [11, 12], ids=["tile1", "tile6"])
def test_the_pallas_kernel_is_the_multiply_reduce_within_its_bound(rows, monkeypatch):
    """The bound of the dots test below (`test_decode_as_dots_is_the_multiply_reduce_...`),
    for the kernel's dots against the multiply-reduce: 256 slots in two 128-slot
    blocks, 200 written, so the kernel folds block 1 partly written (and block 0 unless the
    valid slots start past it)."""
    dtype = np.float32
    q, new, prefix, dense = _attention_case(dtype, 1, rows=rows, cache_rows=16, shards=1,
                                            block=128, slots=256, index=200)
    valid = np.asarray(prefix.cache.valid).copy()
    valid[:, :130] = False  # left padding past block 0: the kernel starts at block 1
    cache = dataclasses.replace(prefix.cache, valid=jnp.asarray(valid))
    prefix = dataclasses.replace(prefix, cache=cache)
    dense[0] = (*dense[0][:2], dense[0][2] & jnp.asarray(valid[:rows])[:, None])
    out = {}
    for kernel in ("xla", "pallas"):
        monkeypatch.setattr(attention, "DECODE_KERNEL", kernel)
        jaxpr = str(jax.make_jaxpr(lambda q: decoder.attention(q, [new], prefix))(q))
        assert ("pallas_call" in jaxpr) == (kernel == "pallas"), kernel
        out[kernel] = np.asarray(decoder.attention(q, [new], prefix), np.float64)
    assert int(prefix.first) == 1 and decode_kernel.row_tile(rows) == {11: 1, 12: 6}[rows]
    vmax = max(float(np.abs(np.asarray(v)).max()) for _, v, _ in dense)
    bound = (_attention_bound(q, dense, dtype, int(prefix.count))
             + 2 * 2 * _score_gap(q, dense, dtype) * vmax)
    err = float(np.abs(out["pallas"] - out["xla"]).max())
    assert np.isfinite(out["pallas"]).all()
    assert err <= bound, (err, bound)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decode_as_dots_is_the_multiply_reduce_within_its_bound(dtype, monkeypatch):
    """A score off by ε moves its weight exp(s - m) by a factor e^ε ≈ 1 + ε, so the gap of
    the scores adds to each weight's relative error δ, which moves a convex combination of
    values by ≤ 2δ·max|v| (`_attention_bound`'s argument)."""
    with x64():
        q, new, prefix, dense = _attention_case(dtype, 1)  # 5 blocks: read whole
        prefix = _stale(prefix)  # finite unwritten slots, as a real cache's: masked, 0·v
        out = {}
        for dots in (False, True):
            monkeypatch.setattr(attention, "DECODE_AS_DOTS", dots)
            jaxpr = str(jax.make_jaxpr(lambda q: decoder.attention(q, [new], prefix))(q))
            assert ("dot_general" in jaxpr) == dots, dots
            out[dots] = np.asarray(decoder.attention(q, [new], prefix), np.float64)
        vmax = max(float(np.abs(np.asarray(v)).max()) for _, v, _ in dense)
        bound = (_attention_bound(q, dense, dtype, int(prefix.count))
                 + 2 * 2 * _score_gap(q, dense, dtype) * vmax)
        err = float(np.abs(out[True] - out[False]).max())
        assert np.isfinite(out[True]).all()
        assert err <= bound, (err, bound)


def _decode_step_program(weights, dtype) -> str:
    """The jaxpr of one cached forward (a decode step) of 2 rows over a 48-slot cache."""
    cache = decoder.KVCache.empty(MODEL, 2, 48, dtype, 24, 1)
    tokens, positions = np.ones((2, 1), np.int32), np.zeros((2, 1), np.int32)
    return str(jax.make_jaxpr(lambda w, c: decoder.forward(w, tokens, positions, MODEL,
                                                           cache=c))(weights, cache))


@pytest.mark.parametrize("backend,dots,bits", [("cpu", False, True), ("tpu", True, False),
                                               ("gpu", True, False)])
def test_the_default_knobs_follow_the_backend(backend, dots, bits, weights,  # noqa: F811
                                              monkeypatch):
    """Unset (None), the knobs are XLA:CPU's settings on a CPU and dots, bf16 as bf16, on an
    accelerator (the v5e's A/B: docs/results/tpu_decode.md), read when a program is traced:
    traced as if on that backend, decode attention has dots, and a bf16 decode step uint16
    bits, exactly where the backend's settings say."""
    assert attention.DECODE_AS_DOTS is None and attention.HALF_AS_BITS is None
    monkeypatch.setattr(attention.jax, "default_backend", lambda: backend)
    assert (attention.decode_as_dots(), attention.half_as_bits()) == (dots, bits)
    q, new, prefix, _ = _attention_case(np.float32, 1)
    scores = str(jax.make_jaxpr(lambda q: decoder.attention(q, [new], prefix))(q))
    assert ("dot_general" in scores) == dots, backend
    assert ("u16" in _decode_step_program(weights, "bfloat16")) == bits, backend
    monkeypatch.setattr(attention, "HALF_AS_BITS", not bits)  # a setting outranks the backend
    assert attention.half_as_bits() == (not bits)


@pytest.mark.parametrize("knob,value,cache", [("DECODE_AS_DOTS", True, None),
                                             ("HALF_AS_BITS", False, "bf16"),
                                             ("DECODE_KERNEL", "pallas", None),
                                             ("DECODE_KERNEL", "pallas", "bf16")],
                         ids=["dots", "bf16-not-as-bits", "pallas", "pallas-bf16"])
def test_generate_under_a_knob_samples_the_default(knob, value, cache, weights,  # noqa: F811
                                                   monkeypatch):
    """16 greedy rows, 24 new tokens, under the default and under the knob."""
    greedy = SamplingConfig(max_new_tokens=24, temperature=0.0)
    runs, programs = {}, {}
    default = getattr(attention, knob)
    for setting in (default, value):
        monkeypatch.setattr(attention, knob, setting)
        jax.clear_caches()  # the programs are traced anew under each setting
        eng = Engine(MODEL, **({"cache_dtype": cache} if cache else {}))
        runs[setting] = _rollout(eng, weights, greedy)
        programs[setting] = _decode_step_program(weights, "bfloat16" if cache else "float32")
    jax.clear_caches()
    assert programs[value] != programs[default], knob  # the knob reached the program
    (prompts, ref), (_, got) = runs[default], runs[value]
    _, logits = _trainer_logprobs(weights, prompts, ref, 2, 1.0)
    m = np.asarray(ref.mask)
    assert_decisive_argmax(logits[m])
    for f in ("tokens", "lengths"):
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)),
                                      err_msg=f)
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(ref.logprobs), rtol=0,
                               atol=logprob_tol("float32", logits))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(8, 128), (3, 64)], ids=["qwen3-like", "smollm2-like"])
def test_the_pallas_kernel_lowers_for_a_v5e(shape, dtype, monkeypatch):
    """The kernel through Pallas' TPU lowering to a Mosaic custom call, on this CPU (jax's
    export for platform tpu; Pallas is told the chip is a v5e, since it asks the device):
    what Pallas checks before the chip's compiler (block shapes, ops it can lower) is checked
    here at Qwen3-0.6B's and SmolLM2's KV heads and head dims, 64 rows, 256 slots. Mosaic's
    own passes run only on a TPU (benchmarks/tpu/decode_profile.py)."""
    from jax import export
    from jax._src.pallas.mosaic import tpu_info  # private: the one way to name a chip here

    monkeypatch.setitem(tpu_info.registry, jax.devices()[0].device_kind,
                        lambda: tpu_info._get_tpu_info_impl(tpu_info.ChipVersion.TPU_V5E, 1))
    monkeypatch.setattr(decode_kernel, "interpreted", lambda: False)
    monkeypatch.setattr(attention, "DECODE_KERNEL", "pallas")
    heads, h = shape
    cfg = dataclasses.replace(MODEL, num_attention_heads=2 * heads, num_key_value_heads=heads,
                              head_dim=h)
    cache = decoder.KVCache.empty(cfg, 64, 256, dtype)
    q = jnp.zeros((64, heads, 2, h), dtype)
    read = jax.jit(lambda q, c: decode_kernel.read_cache(q, c, jnp.int32(1), 64, jnp.int32(0),
                                                         h ** -0.5))
    module = export.export(read, platforms=["tpu"])(q, cache).mlir_module()
    assert "tpu_custom_call" in module  # the kernel, not its interpretation in HLO


def test_the_environment_sets_the_knobs_for_a_run_and_refuses_an_unknown_one():
    """`LOCOJAX_DECODE` reaches a process's knobs at import (what a run and its children do);
    a misspelt knob stops the process at once with the known names, not a silent default."""
    assert attention.decode_settings(" pallas, bits-off ") == {"DECODE_KERNEL": "pallas",
                                                               "HALF_AS_BITS": False}
    assert attention.decode_settings("") == {}
    code = ("from locojax.model import attention as a; "
            "print(a.DECODE_KERNEL, a.DECODE_AS_DOTS, a.HALF_AS_BITS)")
    run = lambda spec: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "LOCOJAX_DECODE": spec, "JAX_PLATFORMS": "cpu"})
    assert run("dots,pallas").stdout.split() == ["pallas", "True", "None"]  # None: by backend
    bad = run("palas")
    assert bad.returncode != 0 and "no decode knob 'palas'" in bad.stderr
    assert "dots, no-dots, bits, bits-off, pallas" in bad.stderr
