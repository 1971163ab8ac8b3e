"""`--precision bf16`: bf16 compute over f32 master weights, f32 optimizer state and f32
gradient accumulation; sampler and trainer logprobs agree to bf16 rounding.

Bounds use bf16's unit roundoff u = 2^-8 (8 significant bits).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.engine.engine import Engine, pad_prompts
from locojax.engine.sampling import SamplingConfig
from locojax.model import config, decoder, params
from locojax.rl import batch as batch_lib
from locojax.rl import logprobs, train_state, train_step
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig

U_BF16 = 2.0 ** -8
F32 = config.tiny()
BF16 = config.tiny(compute_dtype="bfloat16")
LEARNER = LearnerConfig(algo=AlgoConfig(name="grpo"), optim=OptimConfig(lr=1e-3))


def _rollout(cfg, w, seed=0):
    """Sampled completions of the engine in `cfg`'s precision, as a training batch."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, cfg.vocab_size, rng.integers(3, 9)).tolist() for _ in range(4)]
    out = Engine(cfg).generate(w, prompts, jax.random.key(1),
                               SamplingConfig(max_new_tokens=16), num_samples=2)
    pt, pm = pad_prompts(prompts)
    adv = rng.normal(size=8).astype(np.float32)
    return batch_lib.from_rollout(np.repeat(pt, 2, 0), np.repeat(pm, 2, 0), out.tokens,
                                  out.mask, out.logprobs, adv, np.arange(8) // 2)


@pytest.fixture(scope="module")
def rollout():
    """f32 master weights (as in training), a bf16 rollout, and |sampler - trainer| logprobs
    of its response tokens, the trainer's computed by its bf16 forward."""
    w = params.init(F32, jax.random.key(0))
    b = _rollout(BF16, w)
    lp, _ = logprobs.compute_logprobs(w, jnp.asarray(b.tokens), jnp.asarray(b.positions),
                                        jnp.asarray(b.attn_mask), model_cfg=BF16)
    return w, b, np.abs(np.asarray(lp) - b.old_logprobs)[b.loss_mask]


def test_bf16_sampler_logprobs_match_the_trainers_to_bf16_rounding(rollout):
    w, b, gap = rollout
    # Sampler (cached decode) and trainer (one forward) run the same bf16 math with f32
    # accumulations in different orders, so a bf16 rounding of the residual stream can land
    # on neighbouring values: one ulp (2u relative) per rounding stage, 2 per layer plus the
    # embedding and the final norm. Layers at init are near-identity, so these add: hidden
    # states differ by <= (2L + 2) 2u relative, a logit by that times A = max_v sum_d |h_d
    # W_vd|, and a log-softmax by twice the largest logit difference.
    hidden, _ = jax.jit(decoder.forward, static_argnums=3)(
        w, jnp.asarray(b.tokens), jnp.asarray(b.positions), F32, jnp.asarray(b.attn_mask))
    a = float(jnp.max(jnp.abs(hidden).reshape(-1, F32.hidden_size) @ jnp.abs(w["embed"]).T))
    bound = 2 * (2 * F32.num_hidden_layers + 2) * 2 * U_BF16 * a
    assert gap.max() <= bound, (gap.max(), bound)
    # ...and bf16 is really in use: f32 agrees to ~1e-7 (tests/test_engine.py, 1e-5 bound),
    # bf16 roundings of O(1) activations move logprobs by ~u times the logit scale.
    assert gap.mean() > 1e-5


def test_bf16_training_keeps_f32_state_and_gradients_close_to_f32(rollout):
    w, b, gap = rollout
    grads = {}
    for cfg in (F32, BF16):
        state = train_state.init(jax.tree.map(jnp.copy, w), LEARNER.optim, cfg)  # donated
        state, m, g = train_step.train_step(state, b, model_cfg=cfg, cfg=LEARNER,
                                            return_grads=True)
        if cfg is BF16:  # the step logs the gap above (mean over response tokens)
            assert abs(float(m["rollout/logprob_mismatch"]) - gap.mean()) <= 1e-3 * gap.mean()
        dtypes = {x.dtype for x in jax.tree.leaves((state.params, g))}
        moments = {x.dtype for x in jax.tree.leaves(state.opt_state) if x.ndim}
        assert dtypes == moments == {jnp.dtype(jnp.float32)}, cfg.compute_dtype
        grads[cfg.compute_dtype] = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
    g32, g16 = grads["float32"], grads["bfloat16"]
    # Every activation of the bf16 pass is within u relative of the f32 one and a gradient
    # entry is a product of a dozen such factors (2 layers x norm, projections, attention,
    # SwiGLU, logits), so the gradient moves by ~10u ~ 4% relative, more where terms
    # cancel: a 10% bound on the whole vector's norm. A gradient of the wrong weights, or
    # an unscaled loss, is off by O(1).
    assert np.linalg.norm(g16 - g32) <= 0.1 * np.linalg.norm(g32)
    assert np.linalg.norm(g16 - g32) > 1e-4 * np.linalg.norm(g32)  # bf16 really ran
