"""The analytic memory plan: its activation term against what `jax.vjp` keeps of one
decoder layer (the memory plan's traced `layer_residual_bytes`), and its planner's choices.

The activation formula is an estimate written from the layer's ops; the memory plan counts
them exactly by tracing. Agreement within [0.8, 1.4]x at TINY and SMALL, f32, over rows and
lengths: a planner's figure, not an exact count (the doc says so).
"""

import pytest

from locojax.model import config
from locojax.predict import hardware, memory, spec
from locojax.predict.phases import Ctx
from locojax.predict.workload import Lengths, Workload


@pytest.mark.parametrize("cfg", [config.tiny(), config.small()], ids=["tiny", "small"])
@pytest.mark.parametrize("rows,t", [(8, 47), (32, 95)])
def test_activation_estimate_tracks_the_traced_residuals(cfg, rows, t):
    from locojax.train.memory_plan import layer_residual_bytes

    traced = layer_residual_bytes(cfg, rows, t, "cpu")
    est = rows * t * memory.activation_bytes_per_token_layer(cfg, 4, t)
    assert 0.8 * traced <= est <= 1.4 * traced, (est, traced)


def _ctx(model, cluster, rows=(128, 16)):
    cfg, _ = spec.load(model)
    wl = Workload("w", rows[0], rows[1], 256, 1024, Lengths.fixed(512, "test"))
    return Ctx(cfg, model, wl, hardware.parse_cluster(cluster))


def test_small_model_fits_unsharded_and_405b_needs_sharding():
    small = memory.fit(_ctx("qwen3-0.6b", "v7x-8"))
    assert small.fits and small.settings["fsdp"] == 1
    big = memory.fit(_ctx("llama-3.1-405b", "v7x-256"))
    # 18 bytes of train state a parameter (7.3 TB) cannot sit on one 192 GiB chip.
    assert big.settings["fsdp"] >= 64 and big.settings["mp"] > 1
    assert big.parts["params"] + big.parts["optimizer"] < 192 * 2 ** 30


def test_the_cache_and_the_train_step_are_never_counted_together():
    """The trainer frees the engine's cache before the train step (`Engine.release_cache`):
    the peak is the held state plus the larger of the two phases, not their sum."""
    p = memory.plan_for(_ctx("qwen3-4b", "v5e-8"), fsdp=8, mp=8, grad_accum=32, remat=True)
    rollout = p.parts["KV cache"]
    train = p.parts["gradients"] + p.parts["activations"] + p.parts["logits"]
    held = sum(p.parts.values()) - rollout - train
    assert rollout > 0 and train > 0
    assert p.peak == pytest.approx(held + max(rollout, train), rel=1e-12)
    assert p.peak < sum(p.parts.values())
