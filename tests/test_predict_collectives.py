"""The collective formulas of `locojax.predict.collectives` against hand-derived values.

Every expected number is worked out from the α-β model in the comment beside it; the
comparisons are exact up to float rounding of a few operations (rel 1e-12).
"""

import pytest

from locojax.predict import collectives as coll

A, B = 1e-5, 1e10  # α = 10 µs, β = 10 GB/s
M = 1e9  # 1 GB


def close(x, y):
    return x == pytest.approx(y, rel=1e-12)


def test_ring_allreduce_is_reduce_scatter_plus_allgather():
    # p = 4: 2 (p - 1) = 6 steps of α, and 2 (p - 1)/p = 1.5 times m/β.
    assert close(coll.ring_allreduce(4, M, B, A), 6 * A + 1.5 * M / B)
    assert close(coll.ring_allreduce(4, M, B, A),
                 coll.ring_reduce_scatter(4, M, B, A) + coll.ring_allgather(4, M, B, A))
    assert coll.ring_allreduce(1, M, B, A) == 0.0


def test_ring_bandwidth_term_tends_to_twice_the_message():
    # As p grows, 2 (p - 1)/p m/β → 2 m/β: the ring's bandwidth cost is flat in p.
    big = coll.ring_allreduce(1024, M, B, 0.0)
    assert close(big, 2 * 1023 / 1024 * M / B)


def test_tree_wins_for_small_messages_and_ring_for_large():
    # Tree: 2 ⌈log2 p⌉ (α + m/β); p = 64 → 12 (α + m/β).
    assert close(coll.tree_allreduce(64, 8.0, B, A), 12 * (A + 8.0 / B))
    # 8 bytes: ring pays 126 α, tree 12 α.
    assert coll.best_allreduce(64, 8.0, B, A) == coll.tree_allreduce(64, 8.0, B, A)
    # 1 GB: tree moves the whole message 12 times, ring about twice.
    assert coll.best_allreduce(64, M, B, A) == coll.ring_allreduce(64, M, B, A)


def test_pipelined_broadcast():
    # ⌈log2 8⌉ = 3 latencies plus one message time.
    assert close(coll.broadcast(8, M, B, A), 3 * A + M / B)
    assert coll.broadcast(1, M, B, A) == 0.0


def test_torus_allreduce_latency_is_per_dimension():
    # 64 chips as a 4x4x4 torus: Σ 2 (4 - 1) α over 3 dims = 18 α, against 126 α for one ring.
    assert coll.torus_dims(64, 3) == [4, 4, 4]
    assert coll.torus_dims(256, 2) == [16, 16]
    assert close(coll.ici_allreduce(64, M, B, A, "torus3d"), 18 * A + 2 * 63 / 64 * M / B)


def test_hierarchical_allreduce_crosses_the_dcn_with_one_shard_per_chip():
    # 2 domains of 4 chips, 4 chips per host: ICI reduce-scatter + all-gather over 4 chips
    # (a switch: rings, 2 x (3 α + 3/4 m/β)), then the 1/4 shard of each of the host's 4 chips
    # (= m bytes per host) all-reduced between 2 hosts: ring 2 α' + m/β' (tree: 2 (α' + m/β')).
    ici, dcn = coll.data_parallel_allreduce(8, 4, M, B, A, "switch", 1e9, 1e-4, 4)
    assert close(ici, 2 * (3 * A + 0.75 * M / B))
    assert close(dcn, 2 * 1e-4 + M / 1e9)
    # One domain: no DCN at all.
    assert coll.data_parallel_allreduce(4, 4, M, B, A, "switch", 1e9, 1e-4, 4)[1] == 0.0
