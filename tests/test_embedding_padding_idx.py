"""`ModelConfig.embedding_padding_idx` / `--optim.hf-padding-idx`: the pad row of the input
embedding gets no gradient from its lookups, as transformers' `nn.Embedding(padding_idx=...)`
(TRL's model) gives it; the forward and every other row are unchanged."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.model import decoder, params
from locojax.model.config import ModelConfig
from tests.tolerance import x64

PAD = 5


def _grads(cfg):
    weights = params.init(cfg, jax.random.key(0))
    tokens = jnp.array([[3, PAD, 7, PAD, 9]], jnp.int32)
    positions = jnp.arange(5, dtype=jnp.int32)[None]

    def loss(w):
        hidden, _ = decoder.forward(w, tokens, positions, cfg)
        return jnp.sum(decoder.logits(w, hidden, cfg)[..., :3] ** 2), hidden

    (_, hidden), g = jax.value_and_grad(loss, has_aux=True)(weights)
    return hidden, g["embed"]


@pytest.mark.parametrize("tied", [False, True])
def test_pad_row_gets_no_lookup_gradient(tied):
    # Equalities below are exact: the two programs differ only in the pad positions'
    # cotangent, zeroed before it reaches the table (f64, so no fusion choice can round).
    with x64():
        base = ModelConfig(tie_word_embeddings=tied, param_dtype="float64",
                           compute_dtype="float64")
        hidden, g = _grads(base)
        hidden_hf, g_hf = _grads(dataclasses.replace(base, embedding_padding_idx=PAD))
    np.testing.assert_array_equal(hidden_hf, hidden)  # the forward is unchanged
    assert float(jnp.abs(g[PAD]).max()) > 0  # the row trains without the option
    others = np.arange(g.shape[0]) != PAD
    np.testing.assert_array_equal(g_hf[others], g[others])  # only the pad row's differs
    # Tied, only the head could still train the row, and the loss reads no logit past 2.
    np.testing.assert_array_equal(g_hf[PAD], np.zeros_like(g_hf[PAD]))


def test_out_of_vocabulary_padding_idx_is_refused():
    with pytest.raises(ValueError, match="embedding_padding_idx=512"):
        ModelConfig(embedding_padding_idx=512)


def test_the_train_flag_sets_the_tokenizers_pad():
    from locojax.train import config as train_config
    from locojax.train.build import RunParts

    cfg = train_config.demo()
    assert RunParts.of(cfg).model_cfg.embedding_padding_idx is None  # off by default
    on = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, hf_padding_idx=True))
    parts = RunParts.of(on)
    assert parts.model_cfg.embedding_padding_idx == parts.tokenizer.pad_id
