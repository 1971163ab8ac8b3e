"""Fast checks of the forward that need no reference implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.model import config, decoder, params
from tests.hf_reference import logit_tol


def test_param_count_matches_declarations():
    for cfg in (config.tiny(), config.small(), config.tiny(tie_word_embeddings=False)):
        w = params.init(cfg, jax.random.key(0))
        assert sum(x.size for x in jax.tree.leaves(w)) == cfg.num_params()


def test_padding_does_not_change_real_positions():
    """Left padding is invisible: the real tokens' hidden states match the unpadded run."""
    cfg = config.tiny()
    w = params.init(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (1, 6), 0, cfg.vocab_size)
    h, _ = decoder.forward(w, toks, jnp.arange(6)[None], cfg)
    padded = jnp.concatenate([jnp.zeros((1, 3), toks.dtype), toks], axis=1)
    pos = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), jnp.arange(6)[None]], axis=1)
    mask = jnp.arange(9)[None] >= 3
    hp, _ = decoder.forward(w, padded, pos, cfg, mask=mask)
    # Two programs' final hidden states: the logits' chain up to the final norm, at the
    # hidden states' own scale (O(1) after the norm), so the logits' bound covers them.
    np.testing.assert_allclose(np.asarray(hp[:, 3:]), np.asarray(h), rtol=0,
                               atol=logit_tol("float32", h))
    assert np.isfinite(np.asarray(hp)).all()


def test_dtypes_are_checked():
    with pytest.raises(ValueError, match="param_dtype must be float32, bfloat16 or float64"):
        config.tiny(param_dtype="float16")
    f64 = config.tiny(param_dtype="float64", compute_dtype="float64")
    with pytest.raises(ValueError, match="float64 needs jax_enable_x64"):
        params.init(f64, jax.random.key(0))  # would otherwise silently be f32
    with jax.enable_x64(True):
        w = params.init(f64, jax.random.key(0))
        h, _ = decoder.forward(w, jnp.zeros((1, 3), jnp.int32), jnp.arange(3)[None], f64)
    assert h.dtype == jnp.float64 and w["embed"].dtype == jnp.float64
