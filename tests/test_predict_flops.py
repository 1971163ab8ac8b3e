"""The cost model's FLOP counts against XLA's `cost_analysis()` of locojax's own compiled
programs (prefill, a decode step, the train step with and without a reference model), at
docs/design.md's TINY and SMALL shapes. Nothing runs: every program is compiled from abstract
shapes.

What XLA counts and the model does not: XLA's HloCostAnalysis adds one FLOP per element of
every elementwise op and reduction (norms, RoPE, SiLU, softmax, the optimizer), while the
model counts matmuls only. So the check is two-sided: XLA's count lies between the model's
matmul FLOPs and those plus `_elementwise_bound`, a per-element operation count of the
program's non-matmul work, derived below from `decoder.py`. The bound is at most a quarter of
the matmul count at these shapes, so a missing layer (1/2 of TINY's body), the backward's
factor 2, a head counted at every prompt position or a reference forward left out would all
fail it.

XLA counts the body of a loop once (HloCostAnalysis does not know trip counts): prefill and
decode scan over layers, so they are compared at one layer (`num_hidden_layers=1`, where the
scan body is the whole body); the train step unrolls its layers (`decoder.unroll_for_grad`,
<= 8 layers) and is compared whole; at β > 0 the reference forward runs as a program of its own
(`train_step.compile_reference`), which scans its layers, so it is compared with one layer's
forward, and the step's own increment over β = 0 with the KL term's elementwise work.
"""

import dataclasses

import jax
import pytest

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config
from locojax.model.sharding import make_mesh
from locojax.predict.flops import ModelCosts
from locojax.rl import batch as batch_lib
from locojax.rl import train_state, train_step
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig

# (model, B, G, P, N): docs/design.md's canonical shapes.
SHAPES = {"tiny": (config.tiny(), 8, 4, 16, 32), "small": (config.small(), 16, 8, 32, 64)}


def _elementwise_bound(cfg, tokens: float, keys: float, logits: float, backward: bool,
                       params: float = 0.0) -> float:
    """Non-matmul FLOPs XLA may count, per element of each op of `decoder._layer` and the head:
    - RMSNorm (square, mean, add eps, rsqrt, multiply twice): 6 per element, on d twice per
      layer (attention and MLP input), on q and k heads ((n + k) h);
    - RoPE (two multiplies, negate, add, cos/sin of the angles): 6 per element of q and k;
    - residual adds: 2 d; SiLU and the gate product: 5 per element of f;
    - attention: scale, mask select, max, subtract, exp, sum, divide: 8 per score (n · keys);
    - per logit: max, subtract, exp, sum, log, the entropy's product and sum: 8;
    - AdamW (moments, bias corrections, sqrt, divide, decay, update): 20 per parameter.
    A backward at most doubles each (one or two ops per element per op). Rounded up 2x."""
    d, f, n, k, h = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                     cfg.num_key_value_heads, cfg.head_dim)
    per_token_layer = 12 * d + 12 * (n + k) * h + 2 * d + 5 * f + 8 * n * keys
    fwd = tokens * cfg.num_hidden_layers * per_token_layer + 8 * logits * cfg.vocab_size
    return 2 * (fwd * (3 if backward else 1) + 20 * params)


def _within(xla: float, model: float, bound: float):
    assert bound < 0.25 * model, "the bound would not catch a missing layer"
    assert model <= xla <= model + bound, (xla, model, bound)


def _check_engine(name):
    cfg, b, g, p, n = SHAPES[name]
    one = dataclasses.replace(cfg, num_hidden_layers=1)  # scanned layers: body counted once
    costs = ModelCosts(one, "float32")
    sampling = SamplingConfig(max_new_tokens=n, ignore_eos=True)
    # One attention block of all S = P + N - 1 slots: the blocked attention loops over
    # blocks and XLA's cost analysis counts a loop body once, so with several blocks it
    # would count one block's reads, not the step's.
    s = p + n - 1
    prefill, decode = Engine(one, block=s).compile(b, p, sampling, g)
    # Prefill: B prompts of P tokens (dense masked attention over P), the head on one position.
    _within(prefill.cost_analysis()["flops"], costs.prefill(b, p).flops,
            _elementwise_bound(one, b * p, p, b, False))
    # One decode step (the while body): every row reads all S cache slots.
    _within(decode.cost_analysis()["flops"], costs.decode_step(b * g, s).flops,
            _elementwise_bound(one, b * g, s, b * g, False))


def _check_train(name):
    _check_train_cfg(*SHAPES[name])


def _check_train_cfg(cfg, b, g, p, n):
    costs = ModelCosts(cfg, "float32")
    mesh = make_mesh({"data": 1}, jax.devices()[:1])
    prefix = batch_lib.SharedPrefix(p, g)
    flops, ref_flops = {}, None
    for beta in (0.0, 0.04):
        learner = LearnerConfig(algo=AlgoConfig(group_size=g, beta=beta, max_response_len=n),
                                optim=OptimConfig(), grad_accum=1)  # one micro-batch: no loop
        state = train_state.abstract(cfg, learner.optim, mesh)
        batch = batch_lib.abstract(b * g, p + n, mesh, shared_prefix=prefix)
        ref_params = state.params if beta else None
        compiled = train_step.compile_update(state, batch, cfg, learner, ref_params, mesh)
        flops[beta] = compiled.cost_analysis()["flops"]
        reference = train_step.compile_reference(batch, ref_params, cfg, learner, mesh)
        assert (reference is None) == (not beta), "a reference program exactly when β > 0"
        if reference is not None:
            ref_flops = reference.cost_analysis()["flops"]
    rows = b * g
    # Forward tokens: the prompt once per group, every row's N - 1 response columns.
    tokens, keys = rows / g * p + rows * (n - 1), p + n - 1
    _within(flops[0.0], costs.train_step(rows, g, p, n).flops,
            _elementwise_bound(cfg, tokens, keys, rows * n, True, cfg.num_params()))
    # β > 0 adds the reference's no-grad forward, a program of its own before the step
    # (`train_step.with_reference`), whose layer scan XLA counts once.
    one = dataclasses.replace(cfg, num_hidden_layers=1,
                              layer_types=cfg.layer_types[:1] if cfg.layer_types else None)
    ref = ModelCosts(one, "float32").train_forward(rows, g, p, n)
    _within(ref_flops, ref, _elementwise_bound(one, tokens, keys, rows * n, False))
    # ... and to the step itself only the KL term's elementwise work, on every entry of the
    # step's [B, P + N] logprobs (masked, not cut): two `clean`s (2 ops each), k3 =
    # e^{-δ} - 1 + δ (4), the loss's and `actor/kl`'s masked sums (2 each) and the β product:
    # <= 16 forward, the backward at most 2 per forward op, so <= 48 per entry; rounded up 2x
    # (measured at TINY: 46 per entry, 2026-12-04). A reference forward left inside the step
    # (at least one layer's forward, `ref` above) would exceed it 20x over.
    kl_bound = 96 * rows * (p + n)
    assert kl_bound < 0.05 * ref, "the bound would not catch the forward left in the step"
    assert 0 <= flops[0.04] - flops[0.0] <= kl_bound, (flops[0.04] - flops[0.0], kl_bound)


def test_tiny_prefill_and_decode_flops_match_xla():
    _check_engine("tiny")


def test_tiny_train_step_flops_match_xla():
    _check_train("tiny")


@pytest.mark.slow
def test_small_prefill_and_decode_flops_match_xla():
    _check_engine("small")


@pytest.mark.slow
def test_small_train_step_flops_match_xla():
    _check_train("small")


def test_model_costs_agree_with_model_config_per_token_count():
    """`ModelConfig.flops_per_token` (what benchmarks count) is the same forward FLOPs."""
    for cfg in (config.tiny(), config.small()):
        for ctx in (0, 7, 100):
            assert ModelCosts(cfg).token_flops(ctx) == cfg.flops_per_token(ctx)
