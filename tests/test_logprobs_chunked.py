"""Chunked `decoder.token_logprobs` (rematerialised per chunk) equals the one-piece path, and
its wide-dtype path (the target's own logit minus the normaliser) equals log_softmax + pick.

Compared in float64, values and gradients (w.r.t. the hidden states and the tied embedding,
through a loss over both logprobs and entropy), with a sequence length the chunk does not
divide, so the padded tail is exercised. In f64 the two paths differ only by summation order
(the embedding gradient adds chunk partials, the matmuls may block differently), a relative
error of at most ~(reduction length) * 2^-53 ~ 1e-13 here; the bound 1e-10 is far above that
and far below what a misaligned chunk, a lost pad mask or a dropped chunk gradient gives (O(1)).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.model import config, decoder

pytestmark = pytest.mark.accelerator  # numbers that depend on the backend (docs/tpu.md)

CFG = config.tiny(vocab_size=97)
B, T, D = 3, 13, CFG.hidden_size


def _inputs():
    k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
    embed = jax.random.normal(k1, (CFG.vocab_size, D), jnp.float64)
    hidden = jax.random.normal(k2, (B, T, D), jnp.float64)
    targets = jax.random.randint(k3, (B, T), 0, CFG.vocab_size)
    weights = jax.random.normal(k4, (2, B, T), jnp.float64)  # loss weights: logp and entropy
    return embed, hidden, targets, weights


def _loss(embed, hidden, targets, weights, chunk):
    lp, ent = decoder.token_logprobs({"embed": embed}, hidden, targets, CFG, temperature=0.7,
                                     chunk=chunk)
    return jnp.sum(weights[0] * lp) + jnp.sum(weights[1] * ent), (lp, ent)


@pytest.mark.parametrize("chunk", [1, 4, 5])  # 13 = 13 x 1, 4 x 4 - 3 pad, 3 x 5 - 2 pad
def test_chunked_values_and_gradients_equal_one_piece(chunk):
    with jax.enable_x64(True):
        embed, hidden, targets, weights = _inputs()
        grad = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True),
                       static_argnames="chunk")
        (_, (lp0, ent0)), (ge0, gh0) = grad(embed, hidden, targets, weights, chunk=0)
        (_, (lp1, ent1)), (ge1, gh1) = grad(embed, hidden, targets, weights, chunk=chunk)
        assert lp1.dtype == jnp.float64 and ge1.dtype == jnp.float64
        for a, b in ((lp1, lp0), (ent1, ent0), (ge1, ge0), (gh1, gh0)):
            a, b = np.asarray(a), np.asarray(b)
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10 * np.abs(b).max())
        assert np.abs(np.asarray(ge0)).max() > 1e-3  # the gradients compared are not ~0


@pytest.mark.parametrize("tied", [True, False])
def test_target_logit_path_equals_log_softmax_and_pick(tied):
    """The f32/f64 path (`target_logits` - max - log-normaliser, whose backward reaches the
    logits only through the softmax) against the textbook `take_along_axis(log_softmax)`,
    values and gradients, tied and untied head. Same math in another order, so in f64 the
    module bound above holds; a lost stop-gradient, a wrong head row or a dropped one-hot
    term in the gradient is O(1)."""
    cfg = config.tiny(vocab_size=97, tie_word_embeddings=tied)
    with jax.enable_x64(True):
        embed, hidden, targets, weights = _inputs()
        head = {"embed": embed} if tied else {"lm_head": embed.T}

        def ours(head, hidden):
            lp, ent = decoder.token_logprobs(head, hidden, targets, cfg, temperature=0.7, chunk=0)
            return jnp.sum(weights[0] * lp) + jnp.sum(weights[1] * ent), lp

        def textbook(head, hidden):
            logp = jax.nn.log_softmax(decoder.logits(head, hidden, cfg) / 0.7, axis=-1)
            lp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
            ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
            return jnp.sum(weights[0] * lp) + jnp.sum(weights[1] * ent), lp

        grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))  # noqa: E731
        (_, lp0), (gw0, gh0) = grad(textbook)(head, hidden)
        (_, lp1), (gw1, gh1) = grad(ours)(head, hidden)
        gw0, gw1 = jax.tree.leaves(gw0)[0], jax.tree.leaves(gw1)[0]
        for a, b in ((lp1, lp0), (gw1, gw0), (gh1, gh0)):
            a, b = np.asarray(a), np.asarray(b)
            assert a.dtype == np.float64 and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10 * np.abs(b).max())
        assert np.abs(np.asarray(gw0)).max() > 1e-3  # the gradients compared are not ~0


def test_auto_chunk_size():
    v = 151_936
    per_position = 8 * v * 4  # f32 logits of 8 rows at one position
    # Up to LOGITS_WHOLE_BYTES the logits stay whole: SMALL's 128 rows x 95 x 4096 (199 MB).
    assert decoder.logprob_chunk_size(128, 95, 4096) == 0
    # 8 rows x 191 positions at V = 151,936 is 930 MB: equal chunks under the budget.
    c = decoder.logprob_chunk_size(8, 191, v)
    assert 0 < c * per_position <= decoder.LOGITS_CHUNK_BYTES
    n = -(-191 // c)  # chunks used: the fewest that fit
    assert n == -(-191 // (decoder.LOGITS_CHUNK_BYTES // per_position))
    # When even one position is over budget, chunks are single positions.
    assert decoder.logprob_chunk_size(256, 767, v) == 1
    # An explicit chunk is kept; 0 or a chunk >= T means one piece.
    assert decoder.logprob_chunk_size(8, 191, v, chunk=16) == 16
    assert decoder.logprob_chunk_size(8, 191, v, chunk=0) == 0
    assert decoder.logprob_chunk_size(8, 191, v, chunk=500) == 0
    with pytest.raises(ValueError, match="logprob chunk"):
        decoder.logprob_chunk_size(8, 191, v, chunk=-2)
