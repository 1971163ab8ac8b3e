"""The GRPO update a calibration times: one builder for `calibrate.py`'s overheads and
rates and for `calibrate_oversub.py`'s processes, so that both time the same program."""

from __future__ import annotations


def micro(layers: int):
    """A decoder of `layers` layers too narrow for its FLOPs to matter (d 16, vocab 64)."""
    from locojax.model import config

    return config.tiny(num_hidden_layers=layers, hidden_size=16, intermediate_size=32,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                       vocab_size=64)


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


def compiled_update(cfg, prompts_n: int, group: int, p: int, n: int):
    """The compiled program of `update`'s step (its kernels, its cost analysis)."""
    from locojax.rl.train_step import train_step

    lcfg, state, batch = inputs(cfg, prompts_n, group, p, n)
    return train_step.lower(state, batch, None, model_cfg=cfg, cfg=lcfg).compile()


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


def _engine_call(cfg, prompts_n: int, group: int, p: int, n: int):
    """(the engine, its prefill's kernels, its decode's kernels: the part outside the loop
    and the loop's, `n - 1` times, and the arguments of its `prefill`) for prompts_n x group
    rows of n new tokens after p prompt tokens, every row to n."""
    import dataclasses

    import jax
    import numpy as np

    from locojax.engine.engine import Engine
    from locojax.engine.sampling import SamplingConfig
    from locojax.model import params
    from locojax.predict.hlo_kernels import kernels

    engine = Engine(cfg)
    sampling = SamplingConfig(max_new_tokens=n, temperature=1.0, ignore_eos=True)
    prefill, decode = engine.compile(prompts_n, p, sampling, group)
    once, loop = kernels(decode.as_text()).split()
    decoding = once + [dataclasses.replace(k, count=k.count * (n - 1)) for k in loop]
    weights = params.init(cfg, jax.random.key(0))
    prompts = np.asarray(jax.random.randint(jax.random.key(1), (prompts_n, p), 0,
                                            cfg.vocab_size), np.int32)
    args = (weights, prompts, jax.random.key(0), sampling, group,
            np.ones((prompts_n, p), bool), 0, np.full((prompts_n * group,), n, np.int32))
    return engine, kernels(prefill.as_text()).kernels, decoding, args


def generate(cfg, prompts_n: int, group: int, p: int, n: int):
    """(a function running the engine's generate of prompts_n x group rows of n new tokens
    after p prompt tokens, every row to n, and returning when it is done; the kernels one
    call runs: the prefill's, then the decode's, `_engine_call`). The engine keeps its cache
    buffer between calls; `priced.py` prices a run's apart."""
    import jax

    engine, prefilling, decoding, args = _engine_call(cfg, prompts_n, group, p, n)

    def call():
        jax.block_until_ready(engine.generate(*args).tokens)
    return call, prefilling + decoding


def generate_parts(cfg, prompts_n: int, group: int, p: int, n: int):
    """(a function running one generate as `generate` does and returning the seconds of its
    prefill (to token 0) and of its decode, the prefill's kernels, the decode's kernels): the
    calibration fits the two apart, a prefill's kernels being few and wide, a decode
    iteration's many and narrow."""
    import time

    import jax

    engine, prefilling, decoding, args = _engine_call(cfg, prompts_n, group, p, n)

    def call() -> tuple[float, float]:
        start = time.perf_counter()
        pending = engine.prefill(*args)
        jax.block_until_ready(pending.prefilled)
        mid = time.perf_counter()
        jax.block_until_ready(engine.decode(pending).tokens)
        return mid - start, time.perf_counter() - mid
    return call, prefilling, decoding
