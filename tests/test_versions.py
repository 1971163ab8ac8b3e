"""Weight versions (plain Python): checksums, the newest-K store, a transport over it."""

import time

import numpy as np
import pytest

from locojax.fleet.versions import (SyncStats, VersionStore, VersionUnavailable, WeightMismatch,
                                    checksum, nbytes, verify)


class LocalTransport:
    """A `WeightTransport` within one process: a `VersionStore` both ends share (the
    protocol's reference, as the Ray modes' object-store transport keeps it)."""

    def __init__(self, keep: int):
        self.store = VersionStore(keep)

    def push(self, version: int, tree) -> SyncStats:
        t = time.perf_counter()
        self.store.add(version, tree)
        return SyncStats(version, nbytes(tree), time.perf_counter() - t)

    def pull(self, version: int):
        t = time.perf_counter()
        tree, digest = self.store.get(version)
        verify(tree, version, version, digest)
        return tree, SyncStats(version, nbytes(tree), time.perf_counter() - t)


def tree(seed=0):
    rng = np.random.default_rng(seed)
    return {"embed": rng.standard_normal((4, 3)).astype(np.float32),
            "layers": [{"w": rng.standard_normal((3, 3)).astype(np.float32)}]}


def test_checksum_sees_one_flipped_bit_a_dtype_a_shape_and_a_name():
    base = checksum(tree())
    assert checksum(tree()) == base  # a function of the bytes only
    flipped = tree()
    flipped["embed"].view(np.uint32)[2, 1] ^= 1  # the lowest mantissa bit of one value
    assert checksum(flipped) != base
    retyped = tree()
    retyped["embed"] = retyped["embed"].view(np.int32)  # same bytes, another dtype
    assert checksum(retyped) != base
    reshaped = tree()
    reshaped["embed"] = reshaped["embed"].reshape(3, 4)
    assert checksum(reshaped) != base
    renamed = tree()
    renamed["embedding"] = renamed.pop("embed")
    assert checksum(renamed) != base


def test_verify_refuses_another_version_or_other_bytes():
    t = tree()
    verify(t, 3, 3, checksum(t))
    with pytest.raises(WeightMismatch, match="asked for weight version 4, got 3"):
        verify(t, 3, 4, checksum(t))
    with pytest.raises(WeightMismatch, match="corrupted or mixed"):
        verify(t, 3, 3, checksum(tree(1)))


def test_store_keeps_the_newest_k_in_order():
    s = VersionStore(keep=2)
    for v in range(4):
        s.add(v, tree(v))
    assert s.versions() == [2, 3] and s.newest() == 3
    with pytest.raises(VersionUnavailable, match="version 1 is not held"):
        s.get(1)
    s.add(3, tree(3))  # a retried push of the newest: a no-op
    with pytest.raises(WeightMismatch, match="version 3 arrived after version 3"):
        s.add(3, tree(9))
    with pytest.raises(WeightMismatch, match="version 2 arrived after version 3"):
        s.add(2, tree(2))


def test_local_transport_round_trip():
    t = LocalTransport(keep=1)
    sent = tree(5)
    stats = t.push(7, sent)
    assert stats.bytes == 4 * (12 + 9) and stats.version == 7
    got, _ = t.pull(7)
    assert checksum(got) == checksum(sent)
    t.push(8, tree(6))
    with pytest.raises(VersionUnavailable):
        t.pull(7)
