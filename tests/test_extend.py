"""Multi-turn generation in the KV cache (`locojax.engine.extend`).

Checked: a trajectory built by begin / decode / extend (turns cut short by the host, rows
ending at different turns, observations of different lengths) has behaviour logprobs equal
to the trainer's one forward over the whole trajectory, so the cache holes, per-row
positions and cut slots are right; compacting finished rows out gives the same tokens as
masking them, and so does splitting the rows over two conversations (two hosts); turn 1
equals `Engine.generate`; the loop's stop rule (stop tokens, stop sequences, per-row
budgets); bad calls raise.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.engine.decode import stopped
from locojax.engine.engine import Engine, pad_prompts
from locojax.engine.extend import Conversation, slots_needed
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import TOOL_CLOSE
from locojax.model import config, params
from locojax.rl.logprobs import sequence_logprobs
from locojax.tokenizer import CharTokenizer

N, T, O, P, G = 6, 3, 5, 8, 2  # new tokens per turn, turns, observation cap, prompt cols, G
# The char tokenizer's stop ids and `</tool>`, as the multi-turn rollout tests: one set of
# compiled programs serves both files.
SAMPLING = SamplingConfig(max_new_tokens=N, temperature=1.0, stop_token_ids=(1, 3))
STOPS = (tuple(CharTokenizer().encode(TOOL_CLOSE)),)
# Logprobs are ≈ ln(1/512) ≈ -6.2 for the random TINY model; the cached and the full forward
# reduce attention (≤ 40 slots) and the 64-wide projections in different orders, so they
# differ by a few f32 ulps of that scale (~1e-6); 1e-5 leaves a margin an off-by-one
# position or a stale slot (a different distribution: errors ~1e-1) could never hide in.
ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    cfg = config.tiny()
    return cfg, params.init(cfg, jax.random.key(1))


def _prompts():
    rng = np.random.default_rng(0)
    return pad_prompts([rng.integers(5, 500, n).tolist() for n in (5, 3, 7, 2)], 0, P)


def _obs(row, turn):
    """4 or 5 tokens: lengths differ between rows, and every extend block has one width
    (1 + 5 = max_block), so the tests compile few shapes."""
    return np.random.default_rng(row * 10 + turn).integers(5, 500, 4 + (row + turn) % 2).tolist()


def converse(cfg, w, prompts, compact, stops=STOPS, sampling=SAMPLING):
    """A scripted multi-turn run over consecutive `prompts` (of the 4, G rows each): every
    third row's turns are cut 2 tokens short, rows finish at different turns.
    Returns {global row: (tokens, is_model, behaviour logprobs)}."""
    pt, pm = _prompts()
    first_row = prompts[0] * G
    pt, pm = pt[prompts], pm[prompts]
    conv = Conversation(Engine(cfg), sampling, slots_needed(P, N, T, 1 + O), stops,
                        max_block=1 + O, compact=compact)
    conv.begin(w, pt, pm, jax.random.key(3), num_samples=G, first_row=first_row)
    glob = [first_row + i for i in range(len(prompts) * G)]
    seqs = {g: ([int(t) for t in pt[i // G][pm[i // G]]], [False] * int(pm[i // G].sum()), [])
            for i, g in enumerate(glob)}
    for g in seqs:
        seqs[g][2].extend([0.0] * len(seqs[g][0]))
    asked = list(range(len(glob)))
    for turn in range(T):
        out = conv.decode()
        keep, nxt = [], []
        for i, x in enumerate(asked):
            g, n = glob[x], int(out.lengths[i])
            k = n if g % 3 else max(1, n - 2)
            tok, mod, lp = seqs[g]
            tok += out.tokens[i, :k].tolist()
            mod += [True] * k
            lp += out.logprobs[i, :k].tolist()
            if turn + 1 < T and (g + turn) % 4:
                nxt.append(x)
                keep.append(k)
        if not nxt:
            break
        obs = [_obs(glob[x], turn) for x in nxt]
        for x, o in zip(nxt, obs):
            tok, mod, lp = seqs[glob[x]]
            tok += o
            mod += [False] * len(o)
            lp += [0.0] * len(o)
        conv.extend(nxt, keep, obs, [N] * len(nxt))
        asked = nxt
    conv.close()
    return seqs


def test_extend_logprobs_equal_one_forward_and_tokens_ignore_the_layout(model):
    """One forward over each finished trajectory reproduces every behaviour logprob; masking
    instead of compacting, or two hosts' conversations, sample the very same tokens."""
    cfg, w = model
    seqs = converse(cfg, w, [0, 1, 2, 3], compact=True)
    rows = sorted(seqs)
    width = max(len(seqs[g][0]) for g in rows)
    tok = np.zeros((8, width), np.int32)
    att, is_model = np.zeros((8, width), bool), np.zeros((8, width), bool)
    behav = np.zeros((8, width), np.float32)
    for i, g in enumerate(rows):
        t, m, lp = seqs[g]
        tok[i, :len(t)], att[i, :len(t)], is_model[i, :len(t)], behav[i, :len(t)] = t, True, m, lp
    assert (~is_model & att).sum() > 10 and is_model.sum() > 40  # both kinds, many turns
    pos = np.maximum(np.cumsum(att, 1) - 1, 0)
    ref, _ = sequence_logprobs(w, jnp.asarray(tok), jnp.asarray(pos), jnp.asarray(att), cfg)
    ref = np.asarray(ref)
    np.testing.assert_allclose(behav[is_model], ref[is_model], atol=ATOL, rtol=0)
    assert (behav[is_model] < 0).all()

    masked = converse(cfg, w, [0, 1, 2, 3], compact=False)
    halves = {**converse(cfg, w, [0, 1], compact=False),
              **converse(cfg, w, [2, 3], compact=False)}  # "host 1" holds rows 4..7
    for g in seqs:
        assert seqs[g][0] == masked[g][0] == halves[g][0], f"row {g}"
        np.testing.assert_allclose(seqs[g][2], masked[g][2], atol=ATOL)


def test_turn_one_equals_generate(model):
    cfg, w = model
    pt, pm = _prompts()
    gen = Engine(cfg).generate(w, pt, jax.random.key(3), SAMPLING, num_samples=G,
                               prompt_mask=pm, first_row=5)
    conv = Conversation(Engine(cfg), SAMPLING, slots_needed(P, N, T, 1 + O), STOPS)
    conv.begin(w, pt, pm, jax.random.key(3), num_samples=G, first_row=5)
    out = conv.decode()
    conv.close()
    np.testing.assert_array_equal(out.tokens, np.asarray(gen.tokens))
    np.testing.assert_array_equal(out.lengths, np.asarray(gen.lengths))
    np.testing.assert_allclose(out.logprobs, np.asarray(gen.logprobs), atol=ATOL, rtol=0)


def test_a_stop_sequence_ends_a_row_at_its_first_occurrence():
    """`stopped`, the loop's stop rule, on hand-made tokens (the engine tests' stop-token
    rule, plus sequences: live rows share one window, so a match must be whole)."""
    s = SamplingConfig(max_new_tokens=8, stop_token_ids=(1,), min_new_tokens=2)
    tokens = jnp.asarray([[7, 8, 9, 0, 0, 0, 0, 0],   # "7 8 9": stop sequence (8, 9)
                          [8, 7, 9, 0, 0, 0, 0, 0],   # no
                          [5, 6, 1, 0, 0, 0, 0, 0],   # stop token at count 3 >= 2
                          [5, 6, 9, 0, 0, 0, 0, 0]])  # its own budget: limit 3
    limit = jnp.asarray([8, 8, 8, 3])
    got = stopped(tokens, tokens[:, 2], jnp.int32(3), limit, s, ((8, 9), (4, 4, 4, 4)))
    assert got.tolist() == [True, False, True, True]
    # At count 1 a two-token sequence cannot have occurred, nor a stop before min_new_tokens.
    one = jnp.asarray([[9] + [0] * 7, [1] + [0] * 7])
    got = stopped(one, one[:, 0], jnp.int32(1), jnp.asarray([8, 8]), s, ((0, 9),))
    assert got.tolist() == [False, False]


def test_bad_calls_raise(model):
    cfg, w = model
    pt, pm = _prompts()
    conv = Conversation(Engine(cfg), SAMPLING, slots_needed(P, N, T, 1 + O), STOPS,
                        max_block=1 + O)
    with pytest.raises(ValueError, match="before begin"):
        conv.extend([0], [1], [[5]], [N])
    conv.begin(w, pt, pm, jax.random.key(0))
    out = conv.decode()
    with pytest.raises(ValueError, match="keep=0"):
        conv.extend([0], [0], [[5]], [N])
    with pytest.raises(ValueError, match="exceed max_block"):
        conv.extend([0], [1], [[5] * (O + 1)], [N])
    with pytest.raises(ValueError, match="not live"):
        conv.extend([9], [1], [[5]], [N])
    assert out.lengths.min() >= 1
    conv.close()
    with pytest.raises(ValueError, match="do not fit"):
        Conversation(Engine(cfg), SAMPLING, slots=P).begin(w, pt, pm, jax.random.key(0))
