"""One real-size plan compiled in the suite (issue 26 item 4), so that it cannot silently stop
fitting: Qwen3-1.7B's published config, the `gsm8k` preset's shapes, bf16 compute over f32
master weights and Adam state, FSDP over the session's 8 CPU devices and tensor-parallel
rollout over them, against 16 GB per device (a TPU v5e chip). Compiled from abstract shapes
only: nothing is allocated. The settings are those its `--remat auto` plan chose
(docs/results/real_size_plans.md), given explicitly so that only one train step compiles.
The evaluation shape is left out (its 64 rows' cache is a quarter of rollout's 256): one
compile less.
"""

import pytest

from benchmarks.plan_real_size import published, real_size_plan
from locojax.model import hf_config
from locojax.train import train_memory


@pytest.mark.slow  # compiles a real-size train step, prefill and decode
@pytest.mark.timeout(1200)  # 22 s at load ~3, 826 s at load 9-17 (docs/real_size.md)
def test_qwen3_1_7b_with_fsdp_8_fits_16_gb_per_device():
    plan = real_size_plan("qwen3-1.7b", fsdp=8, rollout_tp=8, remat="on", grad_accum=32,
                          device_memory_gb=16, evaluate=False)
    assert plan.fits, plan.format()
    assert plan.settings["fsdp"] == 8 and plan.settings["rollout_tp"] == 8
    assert plan.learner.remat and plan.learner.rules == "train_fsdp"  # kept as given
    # A device holds an eighth of the f32 params (FSDP shards every weight with a model-width
    # axis, d = 2048 = 8 x 256; the few without one, e.g. q/k norms, stay whole: < 0.1%).
    whole = 4 * hf_config.config_from_dict(published("qwen3-1.7b")).num_params()
    assert whole / 8 <= plan.held["params"] < whole / 8 + whole / 1000
    # Gradients are sharded like the params: with remat the layers' gradients are summed in
    # place (model/accumulating_scan.py), so over 32 micro-batches one copy, and beside it
    # one layer's gradient and the embedding's (tied, 311M of 1.7B params), not a second copy.
    cfg = hf_config.config_from_dict(published("qwen3-1.7b"))
    assert plan.expected["gradients"] == train_memory.gradient_bytes(cfg, plan.learner,
                                                                     plan.held["params"])
    assert plan.held["params"] < plan.expected["gradients"] < 1.25 * plan.held["params"]
    assert plan.settings["rollout_copy"] > 0  # rollout's own layout: the plan counts it
    # The reshard, FSDP 8 to tp 8 in one program: rollout's copy, and what XLA stages the
    # shards through, at most a device's share of each side; never the whole params, which
    # the move through a replica gathered on every device (6.88 GB in f32).
    reshard = next(p for p in plan.programs if p.name == "reshard")
    assert reshard.temporaries <= plan.held["params"] + plan.settings["rollout_copy"] < whole / 2
