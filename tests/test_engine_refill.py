"""Finished rows refilled (`locojax/engine/refill.py`, issue 40 item 3).

Checked: a generate decoding R slots, fewer than its rows, returns the plain generate's
tokens, masks and lengths in the original row order, greedy and sampled (a row keeps its
global row id, so its draws are the plain run's), with logprobs equal to the trainer's
recomputation within `logprob_tol`; it refilled (more than once), shifted its cache when
a refilled row could outgrow it, and compacted the rows left once the queue was empty;
bad configurations are refused by name.
"""

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from locojax.engine import engine as engine_lib
from locojax.engine import refill as refill_lib
from locojax.engine.engine import Engine
from locojax.engine.refill import Refill
from locojax.engine.sampling import SamplingConfig
from locojax.model import config, params
from locojax.model.sharding import make_mesh
from locojax.train import build
from locojax.train.config import RolloutConfig, RunConfig
from tests.hf_reference import logprob_tol
from tests.test_long_decode import MODEL, N, SAMPLING, _rollout, _trainer_logprobs

GREEDY = SamplingConfig(max_new_tokens=N, temperature=0.0, stop_token_ids=tuple(range(100, 132)))


@pytest.fixture(scope="module")
def weights():
    return params.init(config.tiny(), jax.random.key(2))


def _counted(monkeypatch, name):
    """Calls of `refill_lib.<name>` during the test."""
    calls, real = [], getattr(refill_lib, name)

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(refill_lib, name, counted)
    return calls


@pytest.mark.parametrize("sampling", [SAMPLING, GREEDY], ids=["sampled", "greedy"])
@pytest.mark.parametrize("refill", [Refill(slots=4), Refill(slots=6, at=4), Refill(slots=2)],
                         ids=["4", "6-at-4", "2"])
def test_refill_returns_the_plain_generate(weights, monkeypatch, sampling, refill):
    """8 prompts x G 2 = 16 rows, through R = 2, 4 or 6 slots: every row's tokens, mask and
    length are the plain generate's, in the plain order. Equal tokens hold wherever both
    programs' logits round to the same token: a sampled token is the first whose cumulative
    mass reaches the row's draw (the same draw in both), so only a draw within ~1e-7 of a
    boundary could differ, which these 16 x 24 draws are not (and greedy's margins are far
    wider). Logprobs: the trainer's recomputation within `logprob_tol` (derived there)."""
    refills, shifts = _counted(monkeypatch, "refill_jit"), _counted(monkeypatch, "shift_jit")
    compactions = _counted(monkeypatch, "compact_jit")
    _, plain = _rollout(Engine(MODEL, block=4), weights, sampling)
    prompts, out = _rollout(Engine(MODEL, block=4, min_rows=1, refill=refill), weights,
                            sampling)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(out.mask), np.asarray(plain.mask))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(plain.lengths))
    assert len(refills) >= 2  # it refilled, more than once
    if refill.slots == 2:  # 8 refills of up to 24 steps each: past the P + 2N + 4 slots
        assert shifts
    if sampling is SAMPLING:  # the last rows end at different steps: the tail is compacted
        assert compactions
    ref, logits = _trainer_logprobs(weights, prompts, out, 2, max(sampling.temperature, 1.0))
    m = np.asarray(out.mask)
    lp = np.asarray(out.logprobs)
    np.testing.assert_allclose(lp[m], ref[m], rtol=0, atol=logprob_tol("float32", logits))
    assert (lp[~m] == 0).all()


def test_refill_keeps_per_row_limits(weights):
    """Per-row limits (how the benchmark forces lengths) stop each row where the plain
    generate stops it, refilled rows included."""
    limits = np.arange(16) % 7 + 2
    _, plain = _rollout(Engine(MODEL, block=4), weights, SAMPLING, limits=limits)
    _, out = _rollout(Engine(MODEL, block=4, refill=Refill(4)), weights, SAMPLING, limits=limits)
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(plain.lengths))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(plain.tokens))
    assert (np.asarray(out.lengths) <= limits).all()


@pytest.mark.parametrize("refill, match", [
    (Refill(slots=1), "multiple of the group size G=2"),
    (Refill(slots=3), "multiple of the group size G=2"),
    (Refill(slots=4, at=3), "at=3 must be a multiple of G=2"),
    (Refill(slots=4, at=6), "at most slots=4"),
])
def test_refill_refuses_slots_that_do_not_fit_the_groups(weights, refill, match):
    with pytest.raises(ValueError, match=match):
        _rollout(Engine(MODEL, block=4, refill=refill), weights, SAMPLING)


def test_refill_refuses_bad_counts():
    with pytest.raises(ValueError, match="refill slots=0 must be >= 1"):
        Refill(slots=0)
    with pytest.raises(ValueError, match="at=-2 >= 0"):
        Refill(slots=4, at=-2)


def test_refill_refuses_a_mesh_and_chunked_decoding(weights):
    eng = Engine(MODEL, mesh=make_mesh({"data": 2}, jax.devices()[:2]), refill=Refill(4))
    with pytest.raises(ValueError, match="refill decodes one device's batch"):
        _rollout(eng, weights, SAMPLING)
    eng = Engine(MODEL, block=4, refill=Refill(4))
    pending = eng.prefill(weights, [[5, 6], [7]] * 4, jax.random.key(0), SAMPLING, 2)
    with pytest.raises(ValueError, match="decodes whole, in Engine.decode"):
        engine_lib.Decoding(eng, pending)
    eng.decode(pending)
    with pytest.raises(ValueError, match="already decoded"):
        eng.decode(pending)


def test_rollout_refill_reaches_the_engine():
    """`--rollout.refill-slots R` (and `--rollout.refill-at`) give the run's engine a
    `Refill`, which `single_turn.rollout`'s prefill and decode then take; 0 leaves it off."""
    def engine_of(**rollout):
        parts = SimpleNamespace(cfg=RunConfig(rollout=RolloutConfig(**rollout)), model_cfg=MODEL)
        return build.RunParts.engine(parts, None)

    assert engine_of(refill_slots=8, refill_at=4).refill == Refill(slots=8, at=4)
    assert engine_of().refill is None
    with pytest.raises(ValueError, match="refill_slots and refill_at must be >= 0"):
        RolloutConfig(refill_slots=-8)
