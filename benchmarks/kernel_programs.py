"""The calibration decoders' programs with their kernels: the GRPO update compiled, and the
engine's generate with the kernels its prefill and decode run (read from the optimized HLO,
`hlo_kernels.py`). What `calibrate_kernels.py` fits the program model to and
`kernel_traces.py` traces; the update itself is `locojax/predict/calibration_step.py`'s, so
the program priced is the one `locojax predict calibrate` times."""

from __future__ import annotations


def compiled_update(cfg, prompts_n: int, group: int, p: int, n: int):
    """The compiled program of `update`'s step (its kernels, its cost analysis)."""
    from locojax.rl.train_step import train_step

    from locojax.predict.calibration_step import inputs

    lcfg, state, batch = inputs(cfg, prompts_n, group, p, n)
    return train_step.lower(state, batch, None, model_cfg=cfg, cfg=lcfg).compile()


def engine_call(cfg, prompts_n: int, group: int, p: int, n: int):
    """(the engine, its prefill's kernels, its decode's kernels: the part outside the loop
    and the loop's, `n - 1` times, and the arguments of its `prefill`) for prompts_n x group
    rows of n new tokens after p prompt tokens, every row to n."""
    import dataclasses

    import jax
    import numpy as np

    from locojax.engine.engine import Engine
    from locojax.engine.sampling import SamplingConfig
    from locojax.model import params
    from benchmarks.hlo_kernels import kernels

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
    call runs: the prefill's, then the decode's, `engine_call`). The engine keeps its cache
    buffer between calls; `priced.py` prices a run's apart."""
    import jax

    engine, prefilling, decoding, args = engine_call(cfg, prompts_n, group, p, n)

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

    engine, prefilling, decoding, args = engine_call(cfg, prompts_n, group, p, n)

    def call() -> tuple[float, float]:
        start = time.perf_counter()
        pending = engine.prefill(*args)
        jax.block_until_ready(pending.prefilled)
        mid = time.perf_counter()
        jax.block_until_ready(engine.decode(pending).tokens)
        return mid - start, time.perf_counter() - mid
    return call, prefilling, decoding
