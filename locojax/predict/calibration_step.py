"""The GRPO update a calibration times: one builder for `calibrate.py`'s overheads and
rates and for the laboratory's kernel calibrations (benchmarks/calibrate_kernels.py, ...),
so that all time the same program."""

from __future__ import annotations


MICRO = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2,
             num_key_value_heads=1, head_dim=8, vocab_size=64)
"""A decoder too narrow for its FLOPs to matter (d 16, vocab 64): its time is its calls'."""


def inputs(cfg, prompts_n: int, group: int, p: int, n: int):
    """(learner config, train state, batch) of a synthetic update of decoder `cfg` on
    prompts_n x group rows of p + n tokens."""
    import jax
    import numpy as np

    from locojax.model import params
    from locojax.rl import batch as batch_lib
    from locojax.rl import train_state
    from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig

    lcfg = LearnerConfig(algo=AlgoConfig(group_size=group), optim=OptimConfig(lr=1e-5))
    state = train_state.init(params.init(cfg, jax.random.key(0)), lcfg.optim, cfg)
    rng = np.random.default_rng(0)
    r = prompts_n * group
    prompts = np.repeat(rng.integers(0, cfg.vocab_size, (prompts_n, p)), group, axis=0)
    batch = jax.device_put(batch_lib.from_rollout(
        prompts, np.ones((r, p), bool), rng.integers(0, cfg.vocab_size, (r, n)),
        np.ones((r, n), bool), -rng.random((r, n)).astype(np.float32),
        rng.standard_normal(r).astype(np.float32), np.repeat(np.arange(prompts_n), group),
        group_size=group))
    return lcfg, state, batch


def update(cfg, prompts_n: int, group: int, p: int, n: int):
    """A function running one GRPO update of decoder `cfg` on a synthetic batch of
    prompts_n x group rows of p + n tokens, its train state carried from call to call, and
    returning when the update is done."""
    import jax

    from locojax.rl.train_step import train_step

    lcfg, state0, batch = inputs(cfg, prompts_n, group, p, n)
    state = [state0]

    def step():
        state[0], _ = train_step(state[0], batch, None, model_cfg=cfg, cfg=lcfg)
        jax.block_until_ready(state[0])
    return step
