"""In-flight weight updates (issue 59 item 1) without Ray: a fake parameter server hands the
engine newer versions between decode chunks (`fleet/inflight.py`).

- `swap_to` takes only a newer version, so a row's versions only go up;
- a swap to the same bytes changes nothing (the chunked decode is the whole loop's,
  bitwise: tests/test_decode_chunks.py) and the schedule names each column's version;
- a swap to other bytes leaves every column before it bitwise as it was and changes the
  logprobs after it: the new weights really sample from the swap on;
- each token's version lands in the record; the buffer counts staleness per token, a row's
  being its stalest token's, and refuses a token outside [s - k, s];
- the truncated IS weight is per token, from each token's own behaviour logprob.
"""

import jax
import numpy as np
import pytest

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.fleet.buffer import RolloutBuffer, check_token_versions, merge
from locojax.fleet.inflight import InFlightEngine, VersionSchedule, swap_to, token_versions
from locojax.fleet.leases import Lease
from locojax.model import config, params
from locojax.rl.batch import from_rollout
from locojax.rl.losses import truncated_is_weight
from locojax.train.record import RolloutRecord, RolloutStats

MODEL = config.tiny()
N = 16
SAMPLING = SamplingConfig(max_new_tokens=N, temperature=1.0)  # no stop: every row is N long
PROMPTS = [[1 + (5 * i + j) % 90 for j in range(3 + i % 3)] for i in range(4)]
CHUNK = 5


class FakeServer:
    """`VersionSource`: publishes `versions` (version -> weights) one per check."""

    def __init__(self, versions: dict):
        self.versions, self.checks, self.taken = versions, 0, []
        self.order = sorted(versions)

    def newest(self):
        self.checks += 1
        return self.order[min(self.checks, len(self.order)) - 1]

    def take(self, version):
        self.taken.append(version)
        return self.versions[version], f"digest{version}"


@pytest.fixture(scope="module")
def weights():
    return params.init(MODEL, jax.random.key(2))


def _decode(engine, weights):
    pending = engine.prefill(weights, PROMPTS, jax.random.key(5), SAMPLING, num_samples=2)
    return engine.decode(pending)


def test_swap_to_takes_only_newer_versions():
    assert swap_to(3, None) is None
    assert swap_to(3, 3) is None
    assert swap_to(3, 2) is None  # never back: a row's versions only go up
    assert swap_to(3, 5) == 5


def test_a_swap_to_the_same_bytes_changes_nothing(weights):
    eng = Engine(MODEL, block=8)
    whole = _decode(eng, weights)
    copy = jax.tree.map(lambda x: x + 0, weights)
    server = FakeServer({0: weights, 1: copy})
    inflight = InFlightEngine(eng, CHUNK, server)
    inflight.begin(0, "digest0")
    swapped = _decode(inflight, weights)
    for f in ("tokens", "mask", "logprobs", "lengths"):
        np.testing.assert_array_equal(np.asarray(getattr(swapped, f)),
                                      np.asarray(getattr(whole, f)), err_msg=f)
    # Checked after chunk 1 (newest 0: kept), swapped after chunk 2, from column 1 + 2K on.
    (schedule,) = inflight.schedules
    assert schedule.spans == [(0, 0, "digest0"), (1 + 2 * CHUNK, 1, "digest1")]
    assert server.taken == [1]
    np.testing.assert_array_equal(schedule.columns(N), [0] * (1 + 2 * CHUNK)
                                  + [1] * (N - 1 - 2 * CHUNK))


def test_a_swap_samples_with_the_new_weights_from_the_swap_on(weights):
    eng = Engine(MODEL, block=8)
    whole = _decode(eng, weights)
    other = params.init(MODEL, jax.random.key(9))
    inflight = InFlightEngine(eng, CHUNK, FakeServer({0: weights, 1: other}))
    inflight.begin(0, "digest0")
    swapped = _decode(inflight, weights)
    cut = 1 + 2 * CHUNK
    lp, lp0 = np.asarray(swapped.logprobs), np.asarray(whole.logprobs)
    np.testing.assert_array_equal(np.asarray(swapped.tokens)[:, :cut],
                                  np.asarray(whole.tokens)[:, :cut])
    np.testing.assert_array_equal(lp[:, :cut], lp0[:, :cut])
    # Other random weights give other logits: every row's first token after the swap (same
    # draw, same token or not) has another logprob, by far more than f32 rounding.
    assert np.all(np.abs(lp[:, cut] - lp0[:, cut]) > 1e-3)


def test_a_version_the_server_cannot_give_now_is_not_taken(weights):
    """The server restarting mid-unit (`VersionUnavailable` on the pull): the unit goes on
    with the version it holds, bitwise as if no newer one existed."""
    from locojax.fleet.versions import VersionUnavailable

    class Restarting(FakeServer):
        def take(self, version):
            raise VersionUnavailable(f"weight version {version}: parameter server unreachable")

    eng = Engine(MODEL, block=8)
    whole = _decode(eng, weights)
    inflight = InFlightEngine(eng, CHUNK, Restarting({0: weights, 1: weights}))
    inflight.begin(0, "digest0")
    kept = _decode(inflight, weights)
    np.testing.assert_array_equal(np.asarray(kept.logprobs), np.asarray(whole.logprobs))
    assert inflight.schedules[0].spans == [(0, 0, "digest0")] and inflight.latest is None


def _record(step, version, tv_columns=None, rows=4, p=3, n=4):
    mask = np.ones((rows, n), bool)
    mask[1, 2:] = False  # a shorter row: its padding has no version
    batch = from_rollout(np.ones((rows, p), np.int32), np.ones((rows, p), bool),
                         np.ones((rows, n), np.int32), mask, np.zeros((rows, n), np.float32),
                         np.zeros(rows, np.float32), np.repeat(np.arange(rows // 2), 2),
                         group_size=2)
    versions = None
    if tv_columns is not None:
        spans = [(c, v, f"d{v}") for c, v in tv_columns]
        versions = token_versions(batch.loss_mask, n, VersionSchedule(spans))
    stats = RolloutStats(rows=float(rows), groups=float(rows // 2))
    return RolloutRecord(step, version, batch, stats, versions)


def test_token_versions_and_per_token_staleness():
    rec = _record(3, 1, [(0, 1), (2, 3)])
    tv = rec.token_versions
    assert (tv[:, :3] == -1).all()  # prompt columns: no target, no version
    np.testing.assert_array_equal(tv[0, 3:], [1, 1, 3, 3])
    np.testing.assert_array_equal(tv[1, 3:], [1, 1, -1, -1])  # padding: none
    lease = Lease(0, 3, 0, 0, 2, 1, 0, 0.0, 0)
    buf = RolloutBuffer(1, max_staleness=2)
    buf.add(lease, rec)
    out = buf.take(3)
    np.testing.assert_array_equal(out.batch.staleness, [2, 2, 2, 2])  # the stalest token's
    # Tokens: rows 0, 2, 3 hold 2 of version 1 (staleness 2) and 2 of version 3 (0); row 1
    # holds 2 of version 1. Rows: all 4 at staleness 2.
    assert out.stats.token_staleness == (6.0, 0.0, 8.0)
    assert out.stats.staleness == (0.0, 0.0, 4.0)
    m = out.stats.metrics()
    assert m["rollout/token_staleness/mean"] == pytest.approx(16 / 14)
    # A checkpointed record keeps its token versions; a host's share slices them.
    arrays, meta = rec.to_state()
    np.testing.assert_array_equal(RolloutRecord.from_state(arrays, meta).token_versions, tv)
    np.testing.assert_array_equal(rec.share(1, 2).token_versions, tv[2:])


@pytest.mark.parametrize("columns,bad", [([(0, 0)], 0),  # older than s - k = 1
                                         ([(0, 1), (2, 4)], 4),  # not made yet (step 3)
                                         ([(0, 2), (1, 1)], 1)])  # older than the unit's own
def test_the_buffer_refuses_a_token_outside_the_bound(columns, bad):
    rec = _record(3, columns[0][1], columns)
    with pytest.raises(RuntimeError, match=f"names weight version {bad}: allowed"):
        check_token_versions(rec, max_staleness=2)


def test_units_without_token_versions_merge_with_ones_that_have_them():
    a, b = _record(3, 2), _record(3, 2, [(0, 2), (1, 3)])
    out = merge([a, b], 0, 1, max_staleness=1)
    assert out.token_versions.shape == out.batch.tokens.shape
    # 14 target tokens a unit: a's all at staleness 1; b's column 0 (4) at 1, the 10 after at 0
    assert out.stats.token_staleness == (10.0, 18.0)
    np.testing.assert_array_equal(out.batch.staleness, [1] * 8)


def test_the_is_weight_is_per_token_from_each_tokens_behaviour_logprob():
    """A row whose tokens came from two versions: each token's weight is its own
    min(π_old / π_behav, C), from the logprob the sampler recorded as it sampled it."""
    old = np.log(np.array([[0.5, 0.5, 0.5, 0.5]], np.float32))
    behav = np.log(np.array([[0.5, 0.25, 0.5, 0.1]], np.float32))  # 2 versions' logprobs
    mask = np.ones((1, 4), bool)
    w = np.asarray(truncated_is_weight(old, behav, mask, np.array([True]), cap=3.0))
    np.testing.assert_allclose(w, [[1.0, 2.0, 1.0, 3.0]], rtol=1e-6)  # f32 exp of a log


def test_disaggregated_refuses_inflight_updates():
    from locojax.fleet.placement import place
    from locojax.train.placement_config import PlacementConfig

    with pytest.raises(ValueError, match="--inflight-chunk is async only"):
        place("disaggregated", PlacementConfig(inflight_chunk=2), 8, 1)
    assert place("async", PlacementConfig(inflight_chunk=2, hosts=3), 8, 1).workers == 2

