"""The generation engine against a full forward and against HF transformers `generate`.

Checked: greedy tokens reproduce under a full (uncached) forward at every position; greedy
equals HF `generate(do_sample=False)` token for token on a left-padded batch (tied and
untied); returned logprobs equal the trainer's `token_logprobs` over prompt+completion,
also with temperature and top-k/top-p on and with G samples per prompt; stopping per
row, early loop exit, ignore_eos and min_new_tokens; determinism per key; the donated
cache; SPMD over a 4-device mesh equals one device; bad prompts raise.

Float bounds are `hf_reference.logit_tol` / `logprob_tol` (two programs computing the same
f32 logits). Tokens are compared exactly only between runs of one program, or where every
choice is decisive: greedy tokens where each top logit leads by more than two programs can
disagree (`assert_decisive_argmax`). A sampled token is not decisive (a uniform lands
within the f32 bound of some CDF boundary in most batches of a 512-token vocabulary), so
where two programs sample (another batch, another mesh) the test checks what does not
depend on rounding: the per-row uniforms are bitwise equal (threefry: integer bits), and
each run's tokens are the inverse-CDF draws of those uniforms under the policy a full
forward recomputes, up to the bound (`_assert_draws_explain_tokens`).
"""

import functools
import logging
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from locojax.engine.decode import decode_jit, prefill_jit
from locojax.engine.engine import Engine, pad_prompts
from locojax.engine.sampling import SamplingConfig
from locojax.model import decoder
from locojax.model.sharding import make_mesh
from tests import backend
from tests.hf_reference import FWD_DEPTH, assert_decisive_argmax, logprob_tol, paired, tiny_cfg
from tests.tolerance import probabilistic

pytestmark = pytest.mark.accelerator  # numbers that depend on the backend (docs/tpu.md)

LENGTHS = [7, 3, 5, 1]  # a left-padded batch of different lengths
N = 8


def _prompts(vocab, seed=0, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def tied():
    cfg = tiny_cfg()
    model, w = paired(cfg, seed=1)
    return cfg, model, w


@functools.partial(jax.jit, static_argnames=("cfg", "p"))
def _completion_states(w, seq, positions, seq_mask, cfg, p):
    """(hidden states that predict each completion token, their logits): one compiled
    program per shape, where the forward run op by op compiled each op and the layer scan
    apart (the chip compiles every program, so their count is the accelerator run's time)."""
    hidden, _ = decoder.forward(w, seq, positions, cfg, mask=seq_mask)
    hidden = hidden[:, p - 1:-1]
    return hidden, decoder.logits(w, hidden, cfg)


# The trainer's logprobs of given hidden states, compiled once per shape and τ (op by op,
# each of its ~17 ops compiled apart).
_token_logprobs = jax.jit(decoder.token_logprobs, static_argnames=("cfg", "temperature"))


def _full_forward(w, cfg, prompts, out, num_samples=1):
    """(hidden [R, N, D], logits [R, N, V]) from one uncached forward over prompt +
    completion: what the trainer computes."""
    tokens, mask = pad_prompts(prompts)
    tokens, mask = np.repeat(tokens, num_samples, 0), np.repeat(mask, num_samples, 0)
    seq = np.concatenate([tokens, np.asarray(out.tokens)], axis=1)
    seq_mask = np.concatenate([mask, np.asarray(out.mask)], axis=1)
    positions = np.maximum(np.cumsum(seq_mask, axis=1) - 1, 0)
    return _completion_states(w, jnp.asarray(seq), jnp.asarray(positions),
                              jnp.asarray(seq_mask), cfg, tokens.shape[1])


def _greedy(eng, w, prompts, upto=N):
    """Greedy tokens [R, N], checked decisive (the same in every program on any CPU) at
    the first `upto` steps, the ones the test compares."""
    out = eng.generate(w, prompts, jax.random.key(0),
                       SamplingConfig(max_new_tokens=N, temperature=0.0))
    _, logits = _full_forward(w, eng.model_cfg, prompts, out)
    assert_decisive_argmax(np.asarray(logits)[:, :upto])
    return np.asarray(out.tokens)


def _sample_with_draws(eng, w, prompts, key, sampling, num_samples, first_row=0):
    """(generation, the per-row uniforms it drew [R, N])."""
    pending = eng.prefill(w, prompts, key, sampling, num_samples=num_samples,
                          first_row=first_row)
    draws = np.asarray(pending.prefilled.draws).T
    return eng.decode(pending), draws


def _assert_draws_explain_tokens(w, cfg, prompts, out, draws, sampling, num_samples):
    """Every token is the inverse-CDF draw of its row's uniform u (the first token whose
    running mass reaches 1 - u) under the τ-scaled policy a full forward recomputes, to
    within how far two programs' running masses can disagree: each probability moves by
    ≤ its logprob bound (relative), so a running mass by ≤ that, plus the cumsum's own
    rounding. (No top-k / top-p in the configs checked here.)"""
    _, logits = _full_forward(w, cfg, prompts, out, num_samples)
    x = np.asarray(logits, np.float64) / sampling.temperature  # [R, N, V]
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    tokens, m = np.asarray(out.tokens)[..., None], np.asarray(out.mask)
    hi = np.take_along_axis(np.cumsum(p, -1), tokens, -1)[..., 0]  # mass up to the token
    lo = hi - np.take_along_axis(p, tokens, -1)[..., 0]  # mass before it
    tol = logprob_tol("float32", logits, sampling.temperature) + 2 * probabilistic(FWD_DEPTH)
    target = 1.0 - draws
    assert ((lo - tol < target) & (target <= hi + tol))[m].all()


def test_greedy_reproduces_under_a_full_forward(tied):
    """Incremental (cached) decode equals a full forward at every generated position."""
    cfg, _, w = tied
    prompts = _prompts(cfg.vocab_size)
    out = Engine(cfg).generate(w, prompts, jax.random.key(0),
                               SamplingConfig(max_new_tokens=N, temperature=0.0))
    assert out.tokens.shape == (4, N) and out.mask.all() and (np.asarray(out.lengths) == N).all()
    hidden, logits = _full_forward(w, cfg, prompts, out)
    assert_decisive_argmax(logits)
    np.testing.assert_array_equal(np.argmax(np.asarray(logits), -1), np.asarray(out.tokens))
    ref, _ = _token_logprobs(w, hidden, out.tokens, cfg)
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref),
                               atol=logprob_tol("float32", logits), rtol=0)


def _hf_greedy(model, prompts, n):
    tokens, mask = pad_prompts(prompts)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.as_tensor(tokens, dtype=torch.long),
            attention_mask=torch.as_tensor(mask, dtype=torch.long),
            do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
            pad_token_id=0, top_k=None, top_p=None, temperature=None)
    return out[:, tokens.shape[1]:].numpy()


@pytest.mark.slow
@pytest.mark.parametrize("tie", [True, False])
def test_greedy_equals_hf_generate(tie):
    cfg = tiny_cfg(tie_word_embeddings=tie)
    model, w = paired(cfg, seed=2)
    prompts = _prompts(cfg.vocab_size, seed=4)
    # N tokens of the module's greedy shape: tied, these are the programs the other greedy
    # tests compiled (another seed's weights are arguments, not a new program).
    ours = Engine(cfg).generate(w, prompts, jax.random.key(0),
                                SamplingConfig(max_new_tokens=N, temperature=0.0))
    # Decisive at every step of our sequence: then HF (within logit_tol of us) picks the same
    # token at step 0, so sees the same prefix at step 1, and so on.
    assert_decisive_argmax(_full_forward(w, cfg, prompts, ours)[1])
    ref = _hf_greedy(model, prompts, N)
    assert ref.shape == (4, N)
    np.testing.assert_array_equal(np.asarray(ours.tokens), ref)


@pytest.mark.parametrize("sampling", [
    SamplingConfig(max_new_tokens=N, temperature=1.0, stop_token_ids=(5, 9)),
    pytest.param(SamplingConfig(max_new_tokens=N, temperature=0.7), marks=pytest.mark.slow),
    SamplingConfig(max_new_tokens=N, temperature=1.5, top_k=20, top_p=0.9),
], ids=["t1-stop", "t0.7", "t1.5-topk-topp"])
def test_logprobs_equal_the_trainers_recomputation(tied, sampling):
    cfg, _, w = tied
    prompts = _prompts(cfg.vocab_size, seed=5)
    out = Engine(cfg).generate(w, prompts, jax.random.key(3), sampling, num_samples=3)
    assert out.tokens.shape == (12, N)
    hidden, logits = _full_forward(w, cfg, prompts, out, num_samples=3)
    ref, _ = _token_logprobs(w, hidden, out.tokens, cfg, temperature=sampling.temperature)
    m = np.asarray(out.mask)
    np.testing.assert_allclose(np.asarray(out.logprobs)[m], np.asarray(ref)[m], rtol=0,
                               atol=logprob_tol("float32", logits, sampling.temperature))
    assert (np.asarray(out.logprobs)[~m] == 0).all()
    assert np.asarray(out.logprobs)[m].max() < 0


def test_top_k_1_equals_greedy_and_samples_are_per_key(tied):
    cfg, _, w = tied
    prompts = _prompts(cfg.vocab_size, seed=6)
    eng = Engine(cfg)
    greedy = _greedy(eng, w, prompts)  # decisive: the top-k = 1 program picks the same
    top1 = eng.generate(w, prompts, jax.random.key(1), SamplingConfig(max_new_tokens=N,
                                                                      top_k=1))
    np.testing.assert_array_equal(np.asarray(top1.tokens), greedy)
    cfg_t = SamplingConfig(max_new_tokens=N, temperature=1.0)
    a, b, c = (eng.generate(w, prompts, jax.random.key(k), cfg_t, num_samples=2)
               for k in (7, 7, 8))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.logprobs), np.asarray(b.logprobs))
    assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()
    # The two samples of a prompt share the prefill but draw differently.
    t = np.asarray(a.tokens)
    assert all((t[2 * i] != t[2 * i + 1]).any() for i in range(4))


def test_a_rows_draws_do_not_depend_on_its_batch(tied):
    """Per-row keys: rows generated with the rest of a batch equal the same rows generated
    alone with `first_row` at their global index (what lets hosts split one batch)."""
    cfg, _, w = tied
    prompts = _prompts(cfg.vocab_size, seed=12)
    sampling = SamplingConfig(max_new_tokens=N, temperature=1.0)
    eng = Engine(cfg)
    whole, whole_draws = _sample_with_draws(eng, w, prompts, jax.random.key(9), sampling, 2)
    tail, tail_draws = _sample_with_draws(eng, w, prompts[2:], jax.random.key(9), sampling, 2,
                                          first_row=4)
    np.testing.assert_array_equal(tail_draws, whole_draws[4:])  # exact: integer bits
    assert (whole_draws[:4] != whole_draws[4:8]).all()  # and they really are per row
    # Another batch is another program: each run samples those draws from its own policy.
    _assert_draws_explain_tokens(w, cfg, prompts, whole, whole_draws, sampling, 2)
    _assert_draws_explain_tokens(w, cfg, prompts[2:], tail, tail_draws, sampling, 2)
    # Where both drew the same tokens (all of them, unless a draw landed within rounding of
    # a boundary), the logprobs agree to the bound.
    same = (np.asarray(tail.tokens) == np.asarray(whole.tokens)[4:]).all(1)
    assert same.any()  # else the next check is vacuous (a flip needs a draw at a boundary)
    logits = _full_forward(w, cfg, prompts, whole, num_samples=2)[1]
    np.testing.assert_allclose(np.asarray(tail.logprobs)[same],
                               np.asarray(whole.logprobs)[4:][same],
                               atol=logprob_tol("float32", logits), rtol=0)


def test_num_samples_rows_are_prompt_major(tied):
    cfg, _, w = tied
    prompts = _prompts(cfg.vocab_size, seed=7)
    greedy = SamplingConfig(max_new_tokens=N, temperature=0.0)
    eng = Engine(cfg)
    one = _greedy(eng, w, prompts)  # decisive, so a batch of another shape picks the same
    three = np.asarray(eng.generate(w, prompts, jax.random.key(0), greedy, num_samples=3).tokens)
    np.testing.assert_array_equal(three, np.repeat(one, 3, axis=0))


def test_stop_tokens_end_only_their_row(tied):
    cfg, _, w = tied
    prompts = _prompts(cfg.vocab_size, seed=8)
    eng = Engine(cfg)
    free = _greedy(eng, w, prompts)  # decisive: runs with other stop settings pick the same
    stop = int(free[0, 2])  # row 0 generates it at step ≤ 2; other rows maybe never

    def expected_length(row, min_new=0):
        hits = [i for i in range(N) if row[i] == stop and i + 1 >= min_new]
        return hits[0] + 1 if hits else N

    out = eng.generate(w, prompts, jax.random.key(0), SamplingConfig(
        max_new_tokens=N, temperature=0.0, stop_token_ids=(stop,), pad_token_id=1))
    lengths = np.asarray(out.lengths)
    np.testing.assert_array_equal(lengths, [expected_length(r) for r in free])
    assert lengths[0] <= 3
    assert out.steps == lengths.max() - 1  # the loop ran until the last row stopped
    for r in range(4):
        n = lengths[r]
        np.testing.assert_array_equal(np.asarray(out.tokens)[r, :n], free[r, :n])
        assert (np.asarray(out.tokens)[r, n:] == 1).all()  # pad after the stop
        np.testing.assert_array_equal(np.asarray(out.mask)[r], np.arange(N) < n)

    # min_new_tokens: an early stop token counts as an ordinary token.
    out = eng.generate(w, prompts, jax.random.key(0), SamplingConfig(
        max_new_tokens=N, temperature=0.0, stop_token_ids=(stop,), min_new_tokens=lengths[0] + 1))
    np.testing.assert_array_equal(np.asarray(out.lengths),
                                  [expected_length(r, lengths[0] + 1) for r in free])
    # ignore_eos: exact work, identical tokens.
    out = eng.generate(w, prompts, jax.random.key(0), SamplingConfig(
        max_new_tokens=N, temperature=0.0, stop_token_ids=(stop,), ignore_eos=True))
    np.testing.assert_array_equal(np.asarray(out.tokens), free)
    assert out.steps == N - 1 and np.asarray(out.mask).all()


def test_loop_exits_early_when_every_row_stopped(tied):
    cfg, _, w = tied
    prompts = _prompts(cfg.vocab_size, seed=9)
    eng = Engine(cfg)
    free = _greedy(eng, w, prompts, upto=2)  # decisive where the stopped runs look
    stops = tuple(sorted({int(t) for t in free[:, 1]}))  # every row stops by its 2nd token
    out = eng.generate(w, prompts, jax.random.key(0), SamplingConfig(
        max_new_tokens=N, temperature=0.0, stop_token_ids=stops))
    assert np.asarray(out.lengths).max() <= 2
    assert int(out.steps) == np.asarray(out.lengths).max() - 1 < N - 1
    assert not np.asarray(out.mask)[:, 2:].any()


def test_cache_is_donated_and_reused_and_compiles_once(tied, caplog):
    cfg, _, w = tied
    eng = Engine(cfg)
    sampling = SamplingConfig(max_new_tokens=N, temperature=0.0)  # the greedy tests' programs
    prompts = _prompts(cfg.vocab_size, seed=10)
    with caplog.at_level(logging.INFO, logger="locojax.engine.decode"):
        first = eng.generate(w, prompts, jax.random.key(0), sampling)
        compiled = prefill_jit._cache_size(), decode_jit._cache_size()
        buf = eng._cache
        assert buf.v.shape == (cfg.num_hidden_layers, 4, cfg.num_key_value_heads,
                               max(LENGTHS) + N - 1, cfg.head_dim)
        second = eng.generate(w, prompts, jax.random.key(0), sampling)
    assert buf.k.is_deleted()  # donated into the second call, which handed back a new one
    assert not eng._cache.k.is_deleted()
    np.testing.assert_array_equal(np.asarray(first.tokens), np.asarray(second.tokens))
    compiles = [r for r in caplog.records if "compiling generate" in r.getMessage()]
    assert len(compiles) <= 1  # 0 if an earlier test compiled this exact shape
    # Nor compiled again without a retrace (the handed-back buffer is placed like the first).
    assert (prefill_jit._cache_size(), decode_jit._cache_size()) == compiled


def test_generate_compiles_without_unusable_donations(tied, caplog):
    """Decode donates the KV cache alone: donating all of the prefill's state also gave its
    per-row flags, which no output reuses, and JAX warned at every compile."""
    cfg, _, w = tied
    sampling = SamplingConfig(max_new_tokens=7, temperature=0.0)  # a shape no other test uses
    prompts = _prompts(cfg.vocab_size, seed=11, lengths=[3, 5, 1])
    with caplog.at_level(logging.INFO, logger="locojax.engine.decode"), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Engine(cfg).generate(w, prompts, jax.random.key(0), sampling, num_samples=3)
    assert any("compiling generate" in r.getMessage() for r in caplog.records)  # it compiled
    assert not [c for c in caught if "donated buffers" in str(c.message)]


def test_prefill_then_decode_equals_generate_and_decodes_once(tied):
    cfg, _, w = tied
    eng = Engine(cfg)
    # The programs of the sampling tests above (their prompt shape, sampling and G).
    sampling = SamplingConfig(max_new_tokens=N, temperature=1.0)
    prompts = _prompts(cfg.vocab_size, seed=12)
    whole = eng.generate(w, prompts, jax.random.key(4), sampling, num_samples=2)
    pending = eng.prefill(w, prompts, jax.random.key(4), sampling, num_samples=2)
    jax.block_until_ready(pending.prefilled)  # what a profiler does between the two phases
    split = eng.decode(pending)
    np.testing.assert_array_equal(np.asarray(whole.tokens), np.asarray(split.tokens))
    np.testing.assert_array_equal(np.asarray(whole.logprobs), np.asarray(split.logprobs))
    with pytest.raises(ValueError, match="already decoded"):
        eng.decode(pending)


def _assert_samples_as(reference, engine, w, cfg, prompts, sampling):
    """`engine` (another layout of the same model) samples as `reference` does: the same
    per-row uniforms, bitwise, and tokens each engine's own policy draws from them (another
    layout is another program, whose logits may round differently, so a token may flip at a
    draw on a boundary); rows whose tokens agree have logprobs within `logprob_tol`. Returns
    `engine`'s generation."""
    ref, ref_draws = _sample_with_draws(reference, w, prompts, jax.random.key(4), sampling, 2)
    out, draws = _sample_with_draws(engine, w, prompts, jax.random.key(4), sampling, 2)
    np.testing.assert_array_equal(draws, ref_draws)  # exact: integer bits
    _assert_draws_explain_tokens(w, cfg, prompts, ref, ref_draws, sampling, 2)
    _assert_draws_explain_tokens(w, cfg, prompts, out, draws, sampling, 2)
    same = (np.asarray(out.tokens) == np.asarray(ref.tokens)).all(1)
    assert same.any()  # else the next check is vacuous (a flip needs a draw at a boundary)
    logits = _full_forward(w, cfg, prompts, ref, num_samples=2)[1]
    np.testing.assert_allclose(np.asarray(out.logprobs)[same], np.asarray(ref.logprobs)[same],
                               atol=logprob_tol("float32", logits), rtol=0)
    return out


@pytest.mark.slow
def test_sharded_over_four_devices_equals_one_device(tied):
    """Batch over `data` (ROLLOUT_REPLICATED): same tokens, logprobs; output is sharded."""
    cfg, _, w = tied
    prompts = _prompts(cfg.vocab_size, seed=11)
    sampling = SamplingConfig(max_new_tokens=N, temperature=1.0, stop_token_ids=(5,))
    mesh = make_mesh({"data": 4}, backend.devices(4))
    eng = Engine(cfg, mesh=mesh)
    multi = _assert_samples_as(Engine(cfg), eng, w, cfg, prompts, sampling)
    assert len(multi.tokens.sharding.device_set) == 4
    assert multi.tokens.sharding.spec[0] == "data"
    assert eng._cache.k.sharding.spec[1] == "data"


@pytest.mark.parametrize("tokens, mask, match", [
    ([[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [0, 0, 0]], "row 1 has no real token"),
    ([[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [1, 1, 0]], "row 1 is not left-padded"),
    ([[1, 2, 3], [4, 5, 999]], [[1, 1, 1], [1, 1, 1]], "row 1 has token id 999"),
])
def test_bad_prompts_raise(tied, tokens, mask, match):
    cfg, _, w = tied
    with pytest.raises(ValueError, match=match):
        Engine(cfg).generate(w, np.asarray(tokens), jax.random.key(0),
                             SamplingConfig(max_new_tokens=2), prompt_mask=np.asarray(mask))


def test_bad_call_arguments_raise(tied):
    cfg, _, w = tied
    eng = Engine(cfg)
    with pytest.raises(ValueError, match="num_samples"):
        eng.generate(w, [[1, 2]], jax.random.key(0), SamplingConfig(), num_samples=0)
    with pytest.raises(ValueError, match="stop_token_ids"):
        eng.generate(w, [[1, 2]], jax.random.key(0),
                     SamplingConfig(stop_token_ids=(cfg.vocab_size,)))
    with pytest.raises(ValueError, match="no prompts"):
        eng.generate(w, [], jax.random.key(0), SamplingConfig())
    with pytest.raises(ValueError, match="max_position_embeddings"):
        Engine(tiny_cfg(max_position_embeddings=8)).generate(
            w, [[1, 2, 3]], jax.random.key(0), SamplingConfig(max_new_tokens=6))


@pytest.mark.slow
def test_generate_command_runs_and_reports_throughput(capsys):
    from locojax.commands import generate

    assert generate.main(["--model", "tiny", "--prompt", "1+1=", "--batch", "2",
                          "--max-new-tokens", "4", "--ignore-eos"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- sample") == 2 and "8 tokens generated" in out and "tokens/s" in out
    assert generate.main(["--model", "no/such/dir"]) == 2
    err = capsys.readouterr().err
    assert "no/such/dir" in err and "neither" in err
