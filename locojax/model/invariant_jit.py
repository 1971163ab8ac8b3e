"""Programs that trace the model compile with the options its config needs (issue 59).

Under `ModelConfig.batch_invariant` the kernels of `invariant.py` fix every reduction's order,
but XLA may still keep a bf16 intermediate in f32 inside a fusion ("excess precision"), and it
picks the fusions by the arrays' shapes: on one TPU v5e the bf16 learner and engine logprobs
then differed with the batch's layout, and were bitwise the same with
`--xla_allow_excess_precision=false` (docs/design.md, "Batch-invariant logprobs"). So each
program that traces the model under such a config is compiled with that option off, per
program (`compiler_options`), never through the process-wide `XLA_FLAGS`: the process may hold
other programs, and the default kernels keep XLA's defaults, which are faster. Not on XLA:CPU:
there the contract was measured without the option, and with it the bf16 train step's
logprobs moved off the engine's (2.9e-4 in tests/test_logprob_gap.py's stale-weights test,
bitwise without it). So `tests/test_invariant_jit.py` checks, as if on an accelerator, that
the option reaches XLA; the chip's bf16 tests check the bits.

`model_jit` is `jax.jit` for a function with the model config among its static arguments: two
jits of one function, the default one and the batch-invariant one, picked per call by the
config. A default-kernel program is the very `jax.jit(fn, ...)` program it was (the same
compile options, so the persistent compile cache still hits for it).
"""

from __future__ import annotations

import functools
import inspect

import jax

NO_EXCESS_PRECISION = (("xla_allow_excess_precision", False),)
"""The XLA option a batch-invariant program compiles with: rounds every bf16 value to bf16
where the program says so, whichever fusion holds it."""


def excess_precision_breaks_invariance() -> bool:
    """Whether this backend's batch-invariant programs need excess precision off: every
    backend but XLA:CPU (read at each call, as the decode knobs are: `attention`)."""
    return jax.default_backend() != "cpu"


def compiler_options(cfg) -> dict:
    """XLA compiler options for a program that traces the model under `cfg` (a `ModelConfig`):
    excess precision off where its kernels are batch-invariant on a backend that needs it,
    else none (XLA's defaults)."""
    return (dict(NO_EXCESS_PRECISION)
            if cfg.batch_invariant and excess_precision_breaks_invariance() else {})


class ModelJit:
    """`jax.jit(fn, **jit_kwargs)`, compiled with `compiler_options(cfg)`, cfg the static
    argument `cfg_arg` of each call. Called inside another jit (a traced argument), it traces
    as the default jit: `compiler_options` may be set on the outermost jit only, which then
    is a `model_jit` of its own and carries them."""

    def __init__(self, fn, cfg_arg: str, **jit_kwargs):
        self.default = jax.jit(fn, **jit_kwargs)
        self.invariant = jax.jit(fn, compiler_options=dict(NO_EXCESS_PRECISION), **jit_kwargs)
        self.cfg_arg, self.signature = cfg_arg, inspect.signature(fn)
        functools.update_wrapper(self, fn)

    def pick(self, args, kwargs):
        """The jit this call runs under: the default one unless the config is batch-invariant
        and the call is the outermost jit."""
        cfg = kwargs.get(self.cfg_arg)
        if cfg is None and self.cfg_arg not in kwargs:  # given by position
            cfg = self.signature.bind_partial(*args, **kwargs).arguments.get(self.cfg_arg)
        if cfg is None or not compiler_options(cfg):
            return self.default
        traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs)))
        return self.default if traced else self.invariant

    def __call__(self, *args, **kwargs):
        return self.pick(args, kwargs)(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self.pick(args, kwargs).lower(*args, **kwargs)

    def _cache_size(self) -> int:  # as jax.jit's, which tests/test_engine.py reads
        return self.default._cache_size() + self.invariant._cache_size()


def model_jit(fn=None, *, cfg_arg: str = "model_cfg", **jit_kwargs):
    """`jax.jit` for `fn`, whose static argument `cfg_arg` is the `ModelConfig` it traces the
    model under: see `ModelJit`. Usable as a decorator, `@model_jit(static_argnames=...)`."""
    if fn is None:
        return functools.partial(model_jit, cfg_arg=cfg_arg, **jit_kwargs)
    return ModelJit(fn, cfg_arg, **jit_kwargs)
