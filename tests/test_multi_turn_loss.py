"""Environment tokens are context: the loss of a multi-turn batch is the single-turn loss
over its model tokens alone.

The batch is the layout harness's fixed problem (`layout_worker.make_batch`: TINY, 16 rows,
stale rows, β = 0.04 with reference logprobs) with observations cut into its responses
(`multi_turn_batch.to_multi_turn`). The reference takes the trainer's logprobs of the same
rows, keeps each row's model tokens only, packed left, and applies the policy objective
(`losses.objective`) with counts of those tokens only. One `train_step` on the multi-turn
batch must give the same policy loss, KL and gradients; counting environment tokens in the
normaliser (the bug this guards against) must not.
"""

import dataclasses

import jax
import jax.numpy as jnp
import layout_worker as lw
import numpy as np
import pytest
from multi_turn_batch import compact_rows, to_multi_turn

from locojax.model import config, decoder, params
from locojax.rl import train_state
from locojax.rl.aggregation import global_counts
from locojax.rl.algorithms import resolve
from locojax.rl.losses import objective
from locojax.rl.logprobs import sequence_logprobs
from locojax.rl.train_step import train_step

# Both sides run the same forward on the same rows and differ only in how the per-token
# terms are summed (≤ 160 model tokens) and in XLA's fusion of two different programs: f32
# rounding of O(1) terms over that depth is ~1e-6 relative. Counting the ~50 environment
# tokens changes a normaliser by ~30% (the negative control below), so 1e-5 separates them.
RTOL = 1e-5


@jax.jit(static_argnames=("model_cfg", "settings", "temperature"))
def _objective_grads(params_, batch, cols, model_c, mask_c, *, model_cfg, settings, temperature):
    """The objective and its gradients on the packed tokens `cols` [B, W] of each row."""
    pick = lambda x: jnp.take_along_axis(x, cols, axis=1)  # noqa: E731
    stale = batch.staleness > 0
    adv = jnp.where(model_c, batch.advantages[:, None], 0.0)  # [B, W]

    def loss_fn(p):
        logp, ent = sequence_logprobs(p, batch.tokens, batch.positions, batch.attn_mask,
                                      model_cfg, temperature,
                                      unroll=decoder.unroll_for_grad(model_cfg))
        logp_c, ent_c = pick(logp), pick(ent)
        old = jax.lax.stop_gradient(logp_c)  # the step's first update: π_old = sg(π_θ)
        behav = jnp.where(model_c, pick(batch.old_logprobs), old)
        ref = jnp.where(model_c, pick(batch.ref_logprobs), old)
        loss, metrics, _ = objective(logp_c, ent_c, old, behav, ref, adv, mask_c, stale,
                                     global_counts(mask_c), settings)
        return loss, metrics

    return jax.value_and_grad(loss_fn, has_aux=True)(params_)


def _reference(params_, batch, cfg, model_cfg, count_env: bool):
    """(loss, metrics, grads) of the objective on each row's model tokens alone, packed left.

    count_env: the bug to guard against instead. Each row also gets one phantom target per
    environment token, whose loss and KL terms are exactly 0 (advantage 0, reference and
    behaviour logprobs equal to π_θ's): only the normalisers see them, the global token
    count (token-mean) and each row's own count (seq-mean-token-mean)."""
    loss_mask = np.asarray(batch.loss_mask, bool)
    env = np.asarray(batch.attn_mask, bool) & ~loss_mask & (np.cumsum(loss_mask, 1) > 0)
    n_model, n_env = loss_mask.sum(1), env.sum(1)
    width = int((n_model + n_env).max())  # one width for both variants: one compile
    cols = compact_rows(np.broadcast_to(np.arange(loss_mask.shape[1]), loss_mask.shape),
                        loss_mask, width)  # phantoms read column 0: any value will do
    k = np.arange(width)[None]
    model_c = k < n_model[:, None]
    mask_c = k < (n_model + (n_env if count_env else 0))[:, None]
    (loss, metrics), grads = _objective_grads(
        params_, batch, jnp.asarray(cols), jnp.asarray(model_c), jnp.asarray(mask_c),
        model_cfg=model_cfg, settings=resolve(cfg.algo)[1], temperature=cfg.temperature)
    return float(loss), {k: float(v) for k, v in metrics.items()}, grads


def _rel(a, b) -> float:
    a, b = np.concatenate([np.ravel(x) for x in a]), np.concatenate([np.ravel(x) for x in b])
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


# token-mean divides by the token count, seq-mean-token-mean by each row's own count: the
# two normalisers that environment tokens could leak into (the other two count sequences).
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_trajectory_loss_is_the_loss_of_its_model_tokens(mode):
    model_cfg = config.tiny()
    cfg = lw.learner_config(mode)
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, max_grad_norm=0.0))
    batch = jax.tree.map(jnp.asarray, to_multi_turn(lw.make_batch()))
    env_tokens = int((np.asarray(batch.attn_mask) & ~np.asarray(batch.loss_mask)).sum())
    assert int(np.asarray(batch.loss_mask).sum()) > 60 and env_tokens > 60  # prompt + env
    w = params.init(model_cfg, jax.random.key(0))
    ref_loss, ref_m, ref_g = _reference(w, batch, cfg, model_cfg, count_env=False)
    bug_loss, _, bug_g = _reference(w, batch, cfg, model_cfg, count_env=True)

    state = train_state.init(jax.tree.map(jnp.copy, w), cfg.optim, model_cfg)
    _, metrics, grads = train_step(state, batch, model_cfg=model_cfg, cfg=cfg,
                                   return_grads=True)
    got = {k: float(v) for k, v in metrics.items() if k != "actor/is_weight_hist"}  # [bins]
    for name in ("actor/pg_loss", "actor/kl", "actor/is_weight_mean", "actor/entropy"):
        assert abs(got[name] - ref_m[name]) <= RTOL * max(abs(ref_m[name]), 1.0), name
    g, rg = jax.tree.leaves(grads), jax.tree.leaves(ref_g)
    assert _rel(g, rg) <= RTOL
    # Negative control: with environment tokens in the normaliser the loss is another one.
    assert abs(bug_loss - ref_loss) > 1e-2 * abs(ref_loss)
    assert _rel(jax.tree.leaves(bug_g), rg) > 1e-2
    assert ref_m["actor/kl"] > 0 and 1.0 < ref_m["actor/is_weight_mean"] < 2.0
