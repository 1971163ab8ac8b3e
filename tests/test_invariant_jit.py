"""Every program that runs batch-invariant kernels compiles with its backend's options
(`locojax/model/invariant_jit.py`; docs/design.md, "Batch-invariant logprobs"; issue 59):
excess precision off on an accelerator, LLVM -O0 on XLA:CPU.

Why this checks the options and not only the bits: the bitwise tests see an option only
where its absence changes bits in their shapes and flags (XLA:CPU under the suite's -O0
has the option's effect already; a TPU is not here). So each compile is watched where every
jit's compile passes, jax's `compiler.compile_or_get_cached` (before its persistent cache,
so a cache hit is seen too), with the options as XLA receives them; a program holds a
batch-invariant kernel when its StableHLO carries a source location in
`locojax/model/invariant.py`. Every such program must have this backend's options; the
default kernels' programs must have no option at all (XLA's defaults, and the same
compile-cache key as before). Checked to fail: with `train_step` back on a plain `jax.jit`,
`jit__train_step` is named as compiled without them.

The workload runs every `model_jit` site under a one-layer TINY: the engine's prefill and
decode (with compaction), refill (decode_rows, and refill with its nested prefill), a
conversation's extend with and without compaction, the learner's `compute_logprobs`, the
fused step with its reference program, the split step's pieces on 2 devices (on 1 where the
machine has one: a single TPU chip), and SFT's step.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax._src import compiler

from locojax import sft
from locojax.engine.engine import Engine, pad_prompts
from locojax.engine.refill import Refill
from locojax.engine.sampling import SamplingConfig
from locojax.model import config, params
from locojax.model import invariant_jit
from locojax.model.invariant_jit import NO_CONTRACTION, NO_EXCESS_PRECISION
from locojax.model.sharding import TRAIN_DP, make_mesh, weight_shardings
from locojax.profiler import StepTimer
from locojax.rl import batch as batch_lib
from locojax.rl import logprobs, train_state
from locojax.train import loop
from tests.test_shared_prefix import grouped_batch, learner

MODEL = config.tiny(num_hidden_layers=1, batch_invariant=True)
KERNELS = "locojax/model/invariant.py"
SAMPLING = SamplingConfig(max_new_tokens=6, temperature=1.0, stop_token_ids=(1, 3))
EXPECTED = {"jit_prefill", "jit_decode", "jit_decode_rows", "jit_refill", "jit__extend",
            "jit_sequence_logprobs", "jit__train_step", "jit__reference", "jit__prepare",
            "jit__local", "jit_step"}
"""The programs the workload must compile with batch-invariant kernels (so a renamed or
skipped one cannot pass unseen)."""
SPLIT_ONLY = {"jit__prepare", "jit__local"}
"""Of those, the split step's: on one device there is no all-reduce to split
(`split_step.splits`), so a one-chip machine compiles the fused step in their place."""


@pytest.fixture
def compiles(monkeypatch):
    """[(program, its option overrides, whether it holds a batch-invariant kernel)] of every
    compile from here on; the in-memory caches cleared, so none is skipped."""
    seen, real = [], compiler.compile_or_get_cached

    def watch(backend, computation, devices, compile_options, *args, **kwargs):
        text = computation.operation.get_asm(enable_debug_info=True)
        seen.append((str(computation.operation.attributes["sym_name"]).strip('"'),
                     dict(compile_options.env_option_overrides), KERNELS in text))
        return real(backend, computation, devices, compile_options, *args, **kwargs)

    monkeypatch.setattr(compiler, "compile_or_get_cached", watch)
    jax.clear_caches()
    return seen


def _engine(cfg, w):
    """Generate plainly (prefill, decode, compaction) and with refill (2 slots, 8 rows)."""
    prompts = [[7, 8, 9], [10, 11], [12, 13, 14, 15], [16]]
    Engine(cfg).generate(w, prompts, jax.random.key(0), SAMPLING, num_samples=2)
    Engine(cfg, block=4, min_rows=1, refill=Refill(slots=2)).generate(
        w, prompts, jax.random.key(0), SAMPLING, num_samples=2)


def _conversation(cfg, w):
    """Turn 1, then an extend of every row (no compaction) and of one row (compacted)."""
    conv = Engine(cfg).conversation(SAMPLING, slots=48, max_block=8)
    tokens, mask = pad_prompts([[7, 8, 9], [10, 11]], 0, 4)
    conv.begin(w, tokens, mask, jax.random.key(0), num_samples=2)
    for rows in ([0, 1, 2, 3], [1]):
        out = conv.decode()
        conv.extend(rows, [1] * len(rows), [[20, 21]] * len(rows), [4] * len(rows))
    conv.decode()
    conv.close()
    assert out.tokens.shape[0] == 4


def _learner(cfg, w):
    """compute_logprobs; the fused step (with its reference program) and the split one, at 2
    mini-batches so that its prepare computes pi_old (the step donates its state, so each
    gets weights of its own)."""
    batch, cfg_learner = grouped_batch(), learner()
    cfg_learner = dataclasses.replace(
        cfg_learner, algo=dataclasses.replace(cfg_learner.algo, num_minibatches=2))
    logprobs.compute_logprobs(w, batch.tokens, batch.positions, batch.attn_mask, model_cfg=cfg)
    for split, devices in ((False, 1), (True, min(2, jax.device_count()))):
        mesh = make_mesh({"data": devices}, jax.devices()[:devices])
        put = lambda x: jax.device_put(x, weight_shardings(cfg, mesh, TRAIN_DP))  # noqa: E731
        state = train_state.init(put(params.init(cfg, jax.random.key(0))), cfg_learner.optim, cfg)
        loop.update(state, batch_lib.shard(batch, mesh, TRAIN_DP), cfg, cfg_learner,
                    put(params.init(cfg, jax.random.key(1))), mesh, StepTimer(), split)


def _sft(cfg, w):
    opt = optax.sgd(1e-3)
    tokens = jnp.asarray(np.arange(16, dtype=np.int32).reshape(2, 8) + 5)
    ones = jnp.ones(tokens.shape, bool)
    sft.make_step(cfg, opt)(w, opt.init(w), tokens, ones, ones)


@pytest.mark.slow  # ~50 s of compiling at -O0 on 2 cores
def test_batch_invariant_programs_compile_with_their_backends_options(compiles):
    w = params.init(MODEL, jax.random.key(0))
    for run in (_engine, _conversation, _learner, _sft):
        run(MODEL, w)
    invariant = {name for name, _, kernels in compiles if kernels}
    expected = EXPECTED if jax.device_count() > 1 else EXPECTED - SPLIT_ONLY
    assert expected <= invariant, f"not compiled with invariant kernels: {expected - invariant}"
    want = invariant_jit.backend_options()
    assert want, "no options on this backend: nothing checked"
    lost = sorted({name for name, options, kernels in compiles if kernels and options != want})
    assert not lost, f"compiled without {want}: {lost}"


@pytest.mark.parametrize("backend, want", [("cpu", NO_CONTRACTION), ("tpu", NO_EXCESS_PRECISION),
                                           ("gpu", NO_EXCESS_PRECISION)])
def test_each_backend_gets_its_options(monkeypatch, backend, want):
    """XLA:CPU gets LLVM -O0 (no FMA contraction in one program and not another), an
    accelerator excess precision off: with excess precision off on XLA:CPU the bf16 train
    step's logprobs left the engine's (tests/test_logprob_gap.py). Default kernels: none."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert invariant_jit.compiler_options(MODEL) == dict(want)
    assert invariant_jit.compiler_options(config.tiny()) == {}


def test_default_programs_keep_xlas_defaults(compiles):
    """The default kernels' programs get no option: XLA's defaults, their compile-cache key
    unchanged."""
    cfg = config.tiny(num_hidden_layers=1)
    w = params.init(cfg, jax.random.key(0))
    _engine(cfg, w)
    _sft(cfg, w)
    batch = grouped_batch()
    logprobs.compute_logprobs(w, batch.tokens, batch.positions, batch.attn_mask, model_cfg=cfg)
    assert {"jit_prefill", "jit_decode", "jit_sequence_logprobs"} <= {n for n, _, _ in compiles}
    assert all(options == {} for _, options, _ in compiles), compiles
