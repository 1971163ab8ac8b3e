"""`locojax predict` counts LoRA as the run compiles it (issue 57).

- memory: predict's params, optimizer and frozen base are the bytes of the LoRA train
  state the run holds (`train_state.abstract`, what the memory plan counts as held);
- FLOPs: the LoRA train step's FLOPs (no base weight gradients, the adapters' own matmuls)
  against XLA's cost analysis of the compiled LoRA step, as tests/test_predict_flops.py
  checks the full step.
"""

from __future__ import annotations

import dataclasses

import jax

from locojax.model import config, lora
from locojax.model.config import LoraConfig
from locojax.model.sharding import make_mesh
from locojax.commands import predict_train
from locojax.predict import memory
from locojax.predict.flops import ModelCosts
from locojax.rl import batch as batch_lib
from locojax.rl import train_state, train_step
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
from locojax.train.program_cost import device_bytes
from test_predict_flops import SHAPES, _elementwise_bound, _within

ARGS = ["demo", "--model", "tiny", "--mode", "single", "--rollout.prompts-per-step", "8",
        "--algo.group-size", "4", "--rollout.max-prompt-tokens", "16",
        "--lora.rank", "8", "--lora.targets", "q", "v", "gate", "--lora.base-dtype",
        "bfloat16"]


def test_predict_holds_what_the_lora_state_holds():
    run = predict_train.parse(ARGS)
    cfg = run.ctx.cfg
    assert cfg.lora == LoraConfig(rank=8, targets=("q", "v", "gate"), base_dtype="bfloat16")
    plan = memory.plan_for(run.ctx, fsdp=1, mp=1, grad_accum=1, remat=False)
    state = train_state.abstract(cfg, OptimConfig(), make_mesh({"data": 1}, jax.devices()[:1]))
    held = {"params": device_bytes(state.params), "optimizer": device_bytes(state.opt_state),
            "frozen base": device_bytes(state.frozen)}
    # Exact but for the optimizer's step counts (two int32 scalars: 8 bytes).
    assert plan.parts["params"] == held["params"]
    assert plan.parts["frozen"] == held["frozen base"]
    assert 0 <= held["optimizer"] - plan.parts["optimizer"] <= 8
    assert not plan.parts.get("reference")  # the base is the reference
    full = memory.plan_for(predict_train.parse(ARGS[:-8]).ctx, 1, 1, 1, False)
    assert plan.parts["optimizer"] < full.parts["optimizer"] / 10


def test_lora_train_step_flops_match_xla():
    base, b, g, p, n = SHAPES["tiny"]
    cfg = dataclasses.replace(base, lora=LoraConfig(rank=8, targets=("q", "o", "up", "down")))
    costs = ModelCosts(cfg, "float32")
    mesh = make_mesh({"data": 1}, jax.devices()[:1])
    learner = LearnerConfig(algo=AlgoConfig(group_size=g, max_response_len=n),
                            optim=OptimConfig(), grad_accum=1)
    state = train_state.abstract(cfg, learner.optim, mesh)
    batch = batch_lib.abstract(b * g, p + n, mesh, shared_prefix=batch_lib.SharedPrefix(p, g))
    xla = train_step.compile_update(state, batch, cfg, learner, None, mesh).cost_analysis()
    rows = b * g
    tokens, keys = rows / g * p + rows * (n - 1), p + n - 1
    # test_predict_flops' elementwise bound, AdamW's share over the adapters alone; a base
    # weight gradient left in the backward (a third of the step) would exceed it.
    bound = _elementwise_bound(cfg, tokens, keys, rows * n, True, lora.num_trainable(cfg))
    _within(xla["flops"], costs.train_step(rows, g, p, n).flops, bound)
