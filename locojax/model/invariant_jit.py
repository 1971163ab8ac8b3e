"""Programs that trace the model compile with the options its config needs (issue 59).

Under `ModelConfig.batch_invariant` the kernels of `invariant.py` fix every reduction's order,
but the compiler may still round one program otherwise than another, by the arrays' shapes
or by what it fuses, so each program that traces the model under such a config is compiled
with the options of its backend (`backend_options`), per program (`compiler_options`), never
through the process-wide `XLA_FLAGS`: the process may hold other programs, and the default
kernels keep XLA's defaults, which are faster.
- Off XLA:CPU, excess precision off. XLA keeps a bf16 intermediate in f32 inside a fusion and
  picks the fusions by the arrays' shapes: on one TPU v5e the bf16 learner and engine
  logprobs then differed with the batch's layout, and were bitwise the same with
  `xla_allow_excess_precision=false` (2026-12-07; with this per-program option alone,
  2026-12-08). Not on XLA:CPU: there it moved the bf16 train step's logprobs off the
  engine's (2.9e-4 in tests/test_logprob_gap.py's stale-weights test).
- On XLA:CPU, LLVM at -O0 (`xla_backend_optimization_level=0`). At XLA's default -O2, LLVM
  contracted a product and the sum it feeds into one fused multiply-add in one program's
  fusion and not in another's: 40 of 160 f32 engine tokens left the learner's on a Zen 5,
  none with the option. (`xla_cpu_max_isa=AVX`, which has no FMA, did as well process-wide,
  but XLA:CPU reads the ISA once per client, not per program.)
`tests/test_invariant_jit.py` checks that the options reach XLA for every such program; the
bitwise tests check the bits.

`model_jit` is `jax.jit` for a function with the model config among its static arguments: a
default jit and, per option set, a batch-invariant one, picked per call by the config. A
default-kernel program is the very `jax.jit(fn, ...)` program it was (the same compile
options, so the persistent compile cache still hits for it).
"""

from __future__ import annotations

import functools
import inspect

import jax

NO_EXCESS_PRECISION = (("xla_allow_excess_precision", False),)
"""Off XLA:CPU: rounds every bf16 value to bf16 where the program says so, whichever fusion
holds it."""
NO_CONTRACTION = (("xla_backend_optimization_level", 0),)
"""On XLA:CPU: LLVM at -O0, which contracts no product into the sum it feeds (one fused
multiply-add in one program's fusion and not another's)."""


def backend_options() -> dict:
    """The XLA options a batch-invariant program needs on this backend (read at each call, as
    the decode knobs are: `attention`)."""
    return dict(NO_EXCESS_PRECISION if jax.default_backend() != "cpu" else NO_CONTRACTION)


def compiler_options(cfg) -> dict:
    """XLA compiler options for a program that traces the model under `cfg` (a `ModelConfig`):
    its backend's (`backend_options`) where its kernels are batch-invariant, else none (XLA's
    defaults)."""
    return backend_options() if cfg.batch_invariant else {}


class ModelJit:
    """`jax.jit(fn, **jit_kwargs)`, compiled with `compiler_options(cfg)`, cfg the static
    argument `cfg_arg` of each call. Called inside another jit (a traced argument), it traces
    as the default jit: `compiler_options` may be set on the outermost jit only, which then
    is a `model_jit` of its own and carries them."""

    def __init__(self, fn, cfg_arg: str, **jit_kwargs):
        self.fn, self.jit_kwargs = fn, jit_kwargs
        self.default = jax.jit(fn, **jit_kwargs)
        self.invariant: dict[tuple, object] = {}  # the options' items -> their jit
        self.cfg_arg, self.signature = cfg_arg, inspect.signature(fn)
        functools.update_wrapper(self, fn)

    def pick(self, args, kwargs):
        """The jit this call runs under: the default one unless the config is batch-invariant
        on a backend that needs options and the call is the outermost jit."""
        cfg = kwargs.get(self.cfg_arg)
        if cfg is None and self.cfg_arg not in kwargs:  # given by position
            cfg = self.signature.bind_partial(*args, **kwargs).arguments.get(self.cfg_arg)
        options = compiler_options(cfg) if cfg is not None else {}
        if not options or any(isinstance(x, jax.core.Tracer)
                              for x in jax.tree.leaves((args, kwargs))):
            return self.default
        key = tuple(sorted(options.items()))
        if key not in self.invariant:
            self.invariant[key] = jax.jit(self.fn, compiler_options=options, **self.jit_kwargs)
        return self.invariant[key]

    def __call__(self, *args, **kwargs):
        return self.pick(args, kwargs)(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self.pick(args, kwargs).lower(*args, **kwargs)

    def _cache_size(self) -> int:  # as jax.jit's, which tests/test_engine.py reads
        return self.default._cache_size() + sum(j._cache_size() for j in self.invariant.values())


def model_jit(fn=None, *, cfg_arg: str = "model_cfg", **jit_kwargs):
    """`jax.jit` for `fn`, whose static argument `cfg_arg` is the `ModelConfig` it traces the
    model under: see `ModelJit`. Usable as a decorator, `@model_jit(static_argnames=...)`."""
    if fn is None:
        return functools.partial(model_jit, cfg_arg=cfg_arg, **jit_kwargs)
    return ModelJit(fn, cfg_arg, **jit_kwargs)
