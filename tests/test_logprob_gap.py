"""The sampler-learner gap (`locojax/rl/logprob_gap.py`; issue 59 item 4): its metrics, its
bound, and the check that stops a step whose sampler ran other weights.

The stale-weights test is the mechanism's: the engine samples with version v while the
learner holds v + 1 (one AdamW update further); in a batch-invariant run the bound is
0, the gap is not, and `update` + `check` raise naming both versions. With the sampler on the
learner's own version the same step passes, its gap exactly 0 (so the check cannot pass
for want of a gap: without the check, or with the bound loosened past the planted gap, the
`raises` fails).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.engine.engine import Engine, pad_prompts
from locojax.engine.sampling import SamplingConfig
from locojax.model import config, params
from locojax.rl import batch as batch_lib
from locojax.rl import logprob_gap, train_state, train_step
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
from tests.test_batch_invariance import ENGINE_PROMPTS, R, TAU

pytestmark = pytest.mark.accelerator  # numbers that depend on the backend (docs/tpu.md)


def test_metrics_and_quantiles_on_planted_gaps():
    mask = np.array([[False, True, True, True], [False, True, True, False]])
    sampler = np.array([[0, -1.0, -2.0, -3.0], [0, -1.0, -0.5, np.nan]], np.float32)
    trainer = np.array([[0, -1.0, -2.001, -3.2], [0, -1.0, -0.5, 7.0]], np.float32)
    m = jax.tree.map(np.asarray, logprob_gap.metrics(mask, sampler, trainer, np.float32(5)))
    gaps = np.array([0, 0.001, 0.2, 0, 0], np.float64)  # |s - t| of the 5 masked tokens
    assert m["rollout/logprob_mismatch"] == pytest.approx(gaps.mean(), rel=1e-4)
    assert m["rollout/logprob_gap_max"] == pytest.approx(0.2, rel=1e-5)  # the NaN is masked
    assert m["rollout/logprob_gap_hist"].sum() == pytest.approx(1.0)
    q = logprob_gap.quantiles(m["rollout/logprob_gap_hist"])
    assert q["rollout/logprob_gap/zero"] == pytest.approx(0.6)
    assert q["rollout/logprob_gap/p50"] == 0.0
    # 0.2 lies in the bin (10^-1, 10^-0.5]; p90 and p99 report its upper edge
    assert q["rollout/logprob_gap/p99"] == pytest.approx(10 ** -0.5)
    assert 0.001 < q["rollout/logprob_gap/p90"] <= 10 ** -0.5


def test_the_bound_is_zero_only_where_both_sides_are_bitwise():
    bf16 = config.tiny(compute_dtype="bfloat16", batch_invariant=True)
    assert logprob_gap.bound(bf16, 2.0, 64, 1.0) == 0.0
    assert logprob_gap.bound(bf16, 2.0, 64, 1.0, ["float32"]) > 0  # an f32 cache: another program
    invariant_f32 = logprob_gap.bound(config.tiny(batch_invariant=True), 2.0, 64, 1.0)
    assert invariant_f32 == logprob_gap.bound(config.tiny(), 2.0, 64, 1.0)  # not bitwise everywhere
    assert 0 < invariant_f32 < 1e-3 < logprob_gap.bound(config.tiny(compute_dtype="bfloat16"),
                                                        2.0, 64, 1.0)  # u: 2^-24 against 2^-8


def test_on_a_tpu_at_default_precision_the_bound_is_bf16s(monkeypatch):
    """XLA:TPU multiplies f32 in one bf16 pass at jax's default matmul precision, so there u
    is bf16's (the real demo with LoRA stopped on a v5e at a gap of 0.76 against the f32
    bound 0.54, docs/results/lora_tpu.md); at `highest` the f32 bound stands."""
    f32, bf16 = config.tiny(), config.tiny(compute_dtype="bfloat16")
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # the same on any machine,
    on_cpu = logprob_gap.bound(f32, 2.0, 64, 1.0)  # a chip's suite (`highest`) included
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with jax.default_matmul_precision("default"):
        assert logprob_gap.bound(f32, 2.0, 64, 1.0) == logprob_gap.bound(bf16, 2.0, 64, 1.0)
    with jax.default_matmul_precision("highest"):
        assert logprob_gap.bound(f32, 2.0, 64, 1.0) == on_cpu


# The engine as tests/test_batch_invariance.py runs it (prompt lengths, sampling, the same
# bf16 batch-invariant model): its prefill and decode programs are compiled once for both.
SAMPLING = SamplingConfig(max_new_tokens=R, temperature=TAU, stop_token_ids=(5,))


def _rollout(w, cfg, seed=0):
    """A GRPO batch the engine sampled from weights `w` (4 prompts x G 2)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, cfg.vocab_size, n).tolist() for n in ENGINE_PROMPTS]
    sampling = SAMPLING
    out = Engine(cfg).generate(w, prompts, jax.random.key(seed), sampling, num_samples=2)
    tokens, mask = (np.repeat(x, 2, 0) for x in pad_prompts(prompts))
    return batch_lib.from_rollout(tokens, mask, np.asarray(out.tokens), np.asarray(out.mask),
                                  np.asarray(out.logprobs), rng.standard_normal(8),
                                  np.arange(8) // 2, group_size=2)


def test_a_step_on_stale_weights_stops_naming_both_versions():
    cfg = config.tiny(compute_dtype="bfloat16", batch_invariant=True)
    learner = LearnerConfig(algo=AlgoConfig(name="grpo"), optim=OptimConfig(lr=1e-2),
                            temperature=TAU)  # the sampler's
    v0 = jax.tree.map(np.asarray, params.init(config.tiny(), jax.random.key(0)))

    def fresh(w):  # a new state on device copies of host weights `w`
        return train_state.init(jax.tree.map(jnp.asarray, w), learner.optim, cfg)

    state, _ = train_step.update(fresh(v0), _rollout(v0, cfg), cfg, learner)  # version 1
    v1 = jax.tree.map(np.asarray, state.params)  # host copies: `update` donates its state

    def step(sampler_weights, state):
        batch = _rollout(sampler_weights, cfg, seed=1)
        _, m = train_step.update(state, batch, cfg, learner)
        limit = logprob_gap.bound(cfg, m["rollout/logit_terms"], batch.tokens.shape[1], TAU)
        return m, limit

    m, limit = step(v1, fresh(v1))  # fresh: version 1 both
    assert limit == 0.0 and m["rollout/logprob_gap_max"] == 0.0
    assert m["rollout/logprob_gap/zero"] == 1.0
    logprob_gap.check(m, limit, sampler_version=1, learner_version=1)
    m, limit = step(v0, fresh(v1))  # the sampler kept version 0
    assert m["rollout/logprob_gap_max"] > 0
    with pytest.raises(logprob_gap.LogprobGapError, match="version 0 .* version 1"):
        logprob_gap.check(m, limit, sampler_version=0, learner_version=1)
