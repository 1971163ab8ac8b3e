"""Decode at real lengths (issue 27): attention over the written slots only, block by block
with an online softmax; finished rows compacted out of a single-turn batch; a bf16 cache.

Checked: the blocked attention equals one softmax over the same slots within a bound derived
below (float64, where only a bug could be close, and float32); it never reads a block past
the written prefix (those slots hold NaN here); the engine's logprobs over many blocks equal
the trainer's recomputation; compacting finished rows changes no token and no logprob
(bitwise) on one device and over a mesh; a bf16 cache holds bf16, accumulates in f32 (its
attention equals f64 over the same rounded values), and its logprobs stay within bf16's
bound of the trainer's.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.engine import decode as decode_lib
from locojax.engine import engine as engine_lib
from locojax.engine.engine import Engine, pad_prompts
from locojax.engine.sampling import SamplingConfig
from locojax.model import attention, config, decoder, params
from locojax.model.sharding import make_mesh
from tests import backend
from tests.hf_reference import assert_decisive_argmax, logprob_tol
from tests.tolerance import unit_roundoff, worst_case, x64

pytestmark = pytest.mark.accelerator  # numbers that depend on the backend (docs/tpu.md)

MODEL = config.tiny()
N = 24  # new tokens: with 4-slot blocks a row's cache spans up to 8 blocks


def _attention_case(dtype, t, rows=6, cache_rows=8, shards=2, block=4, slots=19, index=13):
    """A cache of `cache_rows` rows in `shards` row ranges, `rows` of them used (the first
    rows/shards of each range), 5 blocks of 4 slots, written up to `index` with holes, and
    NaN in every block past the written ones. Returns (q, new part, prefix, dense parts)."""
    rng = np.random.default_rng(t)
    kv, g, h = 2, 2, 16
    cache = decoder.KVCache.empty(config.tiny(), cache_rows, slots, dtype, block, shards)
    s = cache.v.shape[3]
    k = rng.normal(size=cache.k.shape[1:]).astype(dtype)  # one layer's [B, K, H, S]
    v = rng.normal(size=cache.v.shape[1:]).astype(dtype)
    written = -(-index // cache.block) * cache.block
    k[..., written:], v[..., written:, :] = np.nan, np.nan  # never read
    valid = rng.random((cache_rows, s)) < 0.8
    valid[:, 0] = True
    cache = decoder.KVCache(jnp.asarray(np.stack([k, k])), jnp.asarray(np.stack([v, v])),
                            jnp.asarray(valid), jnp.asarray(index, jnp.int32), cache.block,
                            shards)
    used = np.concatenate([np.arange(r * cache_rows // shards, r * cache_rows // shards
                                     + rows // shards) for r in range(shards)])
    q = jnp.asarray(rng.normal(size=(rows, t, kv * g, h)).astype(dtype))
    new_k = jnp.asarray(rng.normal(size=(rows, kv, h, t)).astype(dtype))
    new_v = jnp.asarray(rng.normal(size=(rows, kv, t, h)).astype(dtype))
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (rows, t, t))
    before = valid[used] & (np.arange(s) < index)[None]
    dense = [(jnp.asarray(np.nan_to_num(k[used])), jnp.asarray(np.nan_to_num(v[used])),
              jnp.broadcast_to(jnp.asarray(before)[:, None], (rows, t, s))),
             (new_k, new_v, causal)]
    return q, (new_k, new_v, causal), decoder.CacheBlocks(cache, jnp.int32(1), rows), dense


def _attention_bound(q, dense, dtype, blocks):
    """|blocked - one softmax| ≤ 2·(2δ + (2S + 1)u)·max|v|, δ = (n + 1)(2 max|s| + 4)u + n·u.

    Each output is Σ_j w_j v_j / Σ_j w_j with weights w_j = exp(s_j - m). A weight's relative
    error: the subtraction rounds by ≤ u|s_j - m| ≤ 2u·max|s|, exp by ≤ 2u, and the online
    softmax multiplies it by one rescale exp(m_old - m_new) per block after its own (n
    blocks, each as inexact as a weight, and a product rounding u each). A relative error δ
    in every weight moves a convex combination by ≤ 2δ·max|v|; the sums of S + T terms, in
    any order, add ≤ (S + T)u each relatively (γ_n, tolerance.worst_case), the division u.
    Two computations: twice that."""
    k, v, _ = dense[0]
    h = q.shape[-1]
    qk = np.einsum("btkgh,bkhs->bkgts", np.asarray(q, np.float64).reshape(*q.shape[:2], 2, 2, h),
                   np.asarray(k, np.float64)) * h ** -0.5
    smax = float(np.abs(qk).max())
    u = unit_roundoff(dtype)
    depth = k.shape[-1] + q.shape[1]
    delta = (blocks + 1) * (2 * smax + 4) * u + blocks * u
    vmax = max(float(np.abs(v).max()), float(np.abs(dense[1][1]).max()))
    return 2 * (2 * delta + 2 * worst_case(depth, dtype) + u) * vmax


# The attention cases as one compiled program each: run op by op, each of their ~80 ops was
# a program of its own to compile (the chip compiles every program; its compiles are most of
# the accelerator run's time).
@functools.partial(jax.jit, static_argnames="rows")
def _attention_jit(q, parts, cache, layer, rows):
    blocks = None if cache is None else decoder.CacheBlocks(cache, layer, rows)
    return decoder.attention(q, parts, blocks)


def _attention(q, parts, blocks=None):
    """`decoder.attention(q, parts, blocks)`, compiled (a `CacheBlocks` is no pytree)."""
    if blocks is None:
        return _attention_jit(q, parts, None, None, 0)
    return _attention_jit(q, parts, blocks.cache, blocks.layer, blocks.rows)


@pytest.fixture
def block_loop(monkeypatch):
    """Attention reads every cache block by block (`attention.WHOLE_BLOCKS` 1), even one of
    the 5 blocks these cases have, which it would otherwise read whole; `_attention`'s
    programs, the only ones traced under it (the rest of the path runs op by op), are dropped
    either side, so no program traced under the other setting is reused."""
    monkeypatch.setattr(attention, "WHOLE_BLOCKS", 1)
    _attention_jit.clear_cache()
    yield
    _attention_jit.clear_cache()


@pytest.mark.usefixtures("block_loop")
@pytest.mark.parametrize("t", [1, 3], ids=["decode", "extend"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_blocked_attention_equals_one_softmax_and_reads_only_written_blocks(dtype, t):
    backend.f64_or_skip(dtype)
    with x64():
        q, new, prefix, dense = _attention_case(dtype, t)
        blocked = _attention(q, [new], prefix)
        ref = _attention(q, dense)
        assert int(prefix.count) == 4 and prefix.cache.v.shape[3] == 20  # 4 of 5 blocks read
        assert np.isfinite(np.asarray(blocked)).all()  # no NaN slot was read
        bound = _attention_bound(q, dense, dtype, int(prefix.count))
        err = float(np.abs(np.asarray(blocked, np.float64) - np.asarray(ref, np.float64)).max())
        assert err <= bound, (err, bound)


def _bf16_case(t=1):
    """The f32 case with the cache's keys and values rounded to bf16 (NaN blocks kept)."""
    q, new, prefix, dense = _attention_case(np.float32, t)
    c = prefix.cache
    cache = decoder.KVCache(c.k.astype(jnp.bfloat16), c.v.astype(jnp.bfloat16), c.valid, c.index,
                            c.block, c.shards)
    k16, v16, vis = dense[0]
    rounded = (k16.astype(jnp.bfloat16).astype(jnp.float32),
               v16.astype(jnp.bfloat16).astype(jnp.float32), vis)
    return q, new, decoder.CacheBlocks(cache, prefix.layer, prefix.rows), [rounded, dense[1]]


@pytest.mark.usefixtures("block_loop")
def test_bf16_cache_attention_accumulates_in_f32():
    """A bf16 cache's blocks are read into f32 and accumulated there: the blocked attention
    equals float64 arithmetic on the same bf16 values within the f32 bound above. Had it
    accumulated in bf16, each weight would carry bf16's u = 2^-8 (~500x f32's bound)."""
    q, new, prefix, dense = _bf16_case()
    assert prefix.cache.k.dtype == jnp.bfloat16
    blocked = np.asarray(_attention(q, [new], prefix), np.float64)
    with x64():
        f64 = [tuple(jnp.asarray(np.asarray(a, np.float64)) if a.dtype != bool else a
                     for a in part) for part in dense]
        ref = np.asarray(_attention(jnp.asarray(np.asarray(q, np.float64)), f64))
    bound = _attention_bound(q, dense, np.float32, int(prefix.count))
    vmax = float(np.abs(np.asarray(dense[0][1])).max())
    assert np.abs(blocked - ref).max() <= bound < 0.01 * unit_roundoff(jnp.bfloat16) * vmax


def _rollout(eng, w, sampling, seed=0, g=2, limits=None):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(5, MODEL.vocab_size, n).tolist() for n in (3, 9, 5, 1, 7, 2, 4, 6)]
    out = eng.generate(w, prompts, jax.random.key(seed), sampling, num_samples=g, limits=limits)
    return prompts, out


@functools.partial(jax.jit, static_argnames=("p", "temperature"))
def _trainer_forward(w, tok, pos, att, targets, p, temperature):
    """One compiled program (op by op, each op compiled apart): the trainer's completion
    logprobs, its logits there, and the hidden states of every position."""
    hidden, _ = decoder.forward(w, tok, pos, MODEL, mask=att)
    completion = hidden[:, p - 1:-1]
    lp, _ = decoder.token_logprobs(w, completion, targets, MODEL, temperature=temperature)
    return lp, decoder.logits(w, completion, MODEL), hidden


def _trainer_logprobs(w, prompts, out, g, temperature):
    """The trainer's logprobs of the completion tokens ([R, N]) and its logits there (shared
    with the other engine test files, which unpack these two)."""
    return _trainer_logprobs_and_hidden(w, prompts, out, g, temperature)[:2]


def _trainer_logprobs_and_hidden(w, prompts, out, g, temperature):
    """`_trainer_logprobs`, and the trainer's hidden states [R, P + N, D] from the same
    program."""
    pt, pm = pad_prompts(prompts)
    pt, pm = np.repeat(pt, g, 0), np.repeat(pm, g, 0)
    tok = np.concatenate([pt, np.asarray(out.tokens)], 1)
    att = np.concatenate([pm, np.asarray(out.mask)], 1)
    pos = np.maximum(np.cumsum(att, 1) - 1, 0)
    lp, logits, hidden = _trainer_forward(w, jnp.asarray(tok), jnp.asarray(pos), jnp.asarray(att),
                                          out.tokens, pt.shape[1], temperature)
    return np.asarray(lp), np.asarray(logits), np.asarray(hidden)


@pytest.fixture(scope="module")
def weights():
    return params.init(MODEL, jax.random.key(2))


# 32 of the 512 ids stop a row: the random model draws one ~6% of steps, so rows end all
# through the N = 24 steps (a quarter run to the end).
SAMPLING = SamplingConfig(max_new_tokens=N, temperature=1.0,
                          stop_token_ids=tuple(range(100, 132)))


def _compactions(monkeypatch):
    """The batch sizes the engine compacts to, call by call."""
    sizes, real = [], engine_lib.compact_jit

    def counted(*a, **k):
        sizes.append(k["size"])
        return real(*a, **k)

    monkeypatch.setattr(engine_lib, "compact_jit", counted)
    return sizes


def test_many_blocks_and_compaction_sample_as_the_trainer_scores(weights, monkeypatch):
    """4-slot blocks (a row reads up to 8, the loop's online softmax runs) and compaction down
    to 1 row: every token is its row's inverse-CDF draw (`row_draws`, the uniform of its row
    and position, wherever compaction moved the row) under the policy the trainer's one
    forward recomputes, and every logprob equals the trainer's, to `logprob_tol` (derived
    there; how far a running mass moves is the same bound, as in tests/test_engine.py)."""
    sizes = _compactions(monkeypatch)
    eng = Engine(MODEL, block=4, min_rows=1)
    prompts, out = _rollout(eng, weights, SAMPLING)
    assert eng._cache.block == 4 and eng._cache.v.shape[3] >= 8 * 4
    assert len(sizes) >= 2  # it compacted, more than once
    ref, logits = _trainer_logprobs(weights, prompts, out, 2, 1.0)
    m = np.asarray(out.mask)
    assert m.sum(1).max() > 16 and m.sum(1).min() < 8  # rows end in different blocks
    tol = logprob_tol("float32", logits)
    np.testing.assert_allclose(np.asarray(out.logprobs)[m], ref[m], rtol=0, atol=tol)
    r = m.shape[0]
    draws = np.asarray(decode_lib.row_draws(jax.random.key(0), jnp.arange(r),
                                            jnp.zeros(r, jnp.int32), SAMPLING)).T  # [R, N]
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    tok = np.asarray(out.tokens)[..., None]
    hi = np.take_along_axis(np.cumsum(p, -1), tok, -1)[..., 0]  # mass up to the token
    lo = hi - np.take_along_axis(p, tok, -1)[..., 0]
    target = 1.0 - draws  # `_inverse_cdf`'s rule: the first token whose mass reaches it
    assert ((lo - tol < target) & (target <= hi + tol))[m].all()


def test_compacting_finished_rows_changes_no_token(weights, monkeypatch):
    """Greedy rows with their own budgets (1..N tokens) finish at different steps; the engine
    compacts the live ones into batches of 8, 4, 2 and 1 as they go. Every token (decisive:
    the same in any program), length and the step count equal the uncompacted batch's, and
    the logprobs agree to the bound of two programs (`logprob_tol`): a smaller batch is
    another XLA program, whose dot kernels may round differently (here: bitwise equal down
    to 8 rows, one last-bit difference in 384 below)."""
    sizes = _compactions(monkeypatch)
    greedy = SamplingConfig(max_new_tokens=N, temperature=0.0)
    limits = np.random.default_rng(1).integers(1, N + 1, 16)
    prompts, full = _rollout(Engine(MODEL, block=8, min_rows=None), weights, greedy,
                             limits=limits)
    assert not sizes
    _, compacted = _rollout(Engine(MODEL, block=8, min_rows=1), weights, greedy, limits=limits)
    assert sizes == [8, 4, 2, 1][:len(sizes)] and len(sizes) >= 3, sizes
    _, logits = _trainer_logprobs(weights, prompts, full, 2, 1.0)
    assert_decisive_argmax(logits[np.asarray(full.mask)])
    np.testing.assert_array_equal(np.asarray(full.lengths), limits)
    for f in ("tokens", "lengths", "mask", "steps"):
        np.testing.assert_array_equal(np.asarray(getattr(compacted, f)),
                                      np.asarray(getattr(full, f)), err_msg=f)
    np.testing.assert_allclose(np.asarray(compacted.logprobs), np.asarray(full.logprobs),
                               rtol=0, atol=logprob_tol("float32", logits))


@pytest.mark.slow
def test_compaction_over_a_mesh_keeps_each_devices_rows(weights, monkeypatch):
    """Over 2 devices each compacts its own rows (no row crosses devices); the tokens equal
    the one-device uncompacted run's (decisive greedy), rows stay sharded."""
    sizes = _compactions(monkeypatch)
    greedy = SamplingConfig(max_new_tokens=N, temperature=0.0)
    limits = np.random.default_rng(1).integers(1, N + 1, 16)
    prompts, single = _rollout(Engine(MODEL, block=8, min_rows=None), weights, greedy,
                               limits=limits)
    eng = Engine(MODEL, mesh=make_mesh({"data": 2}, backend.devices(2)), block=8, min_rows=1)
    _, multi = _rollout(eng, weights, greedy, limits=limits)
    assert len(sizes) >= 2 and eng._cache.k.sharding.spec[1] == "data"
    _, logits = _trainer_logprobs(weights, prompts, single, 2, 1.0)
    assert_decisive_argmax(logits[np.asarray(single.mask)])
    for f in ("tokens", "lengths", "steps"):
        np.testing.assert_array_equal(np.asarray(getattr(multi, f)),
                                      np.asarray(getattr(single, f)), err_msg=f)
    np.testing.assert_allclose(np.asarray(multi.logprobs), np.asarray(single.logprobs),
                               rtol=0, atol=logprob_tol("float32", logits))


def test_bf16_cache_logprobs_stay_within_bf16_rounding_of_the_trainers(weights, caplog):
    """The cache holds bf16 (half the bytes); the engine's logprobs then differ from the f32
    trainer's by bf16 roundings of each layer's keys and values: within the bound that
    tests/test_precision.py derives for bf16 compute, which rounds those and every other
    activation (2 stages per layer plus 2), and far above f32's agreement (~1e-6)."""
    eng = Engine(MODEL, cache_dtype="bf16", block=8)
    prompts, out = _rollout(eng, weights, SAMPLING)
    assert eng._cache.k.dtype == eng._cache.v.dtype == jnp.bfloat16
    ref, _, hidden = _trainer_logprobs_and_hidden(weights, prompts, out, 2, 1.0)
    m = np.asarray(out.mask)
    gap = np.abs(np.asarray(out.logprobs) - ref)[m]
    u = unit_roundoff(jnp.bfloat16)
    # max Σ_d |h_d e_vd| over every position (in f64: a sum of positive terms, exact enough)
    a = float(np.max(np.abs(hidden.astype(np.float64)).reshape(-1, MODEL.hidden_size)
                     @ np.abs(np.asarray(weights["embed"], np.float64)).T))
    bound = 2 * (2 * MODEL.num_hidden_layers + 2) * 2 * u * a
    assert gap.max() <= bound, (gap.max(), bound)
    assert gap.mean() > 1e-5  # bf16 really in use


def test_the_memory_plan_counts_the_cache_in_its_dtype():
    """The plan takes the cache's bytes from the compiled prefill's cache argument, so a bf16
    cache counts half an f32 one; its hints offer bf16 while the cache is f32."""
    from locojax.train.program_cost import argument_bytes

    sampling = SamplingConfig(max_new_tokens=40)
    sizes = {}
    for dtype in ("f32", "bf16"):
        prefill, _ = Engine(MODEL, cache_dtype=dtype).compile(4, 8, sampling, num_samples=2)
        sizes[dtype] = argument_bytes(prefill, 5)
    n, blk = decoder.KVCache.blocks(8 + 40 - 1)
    kv = 2 * MODEL.num_hidden_layers * 8 * MODEL.num_key_value_heads * MODEL.head_dim * n * blk
    assert sizes["f32"] - 4 * kv == sizes["bf16"] - 2 * kv == 8 * n * blk + 4  # valid, index
