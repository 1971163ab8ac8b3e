"""The checksum a worker reports is computed from the bytes it generated with (issue 38).

The dispatcher compares that checksum with its lease's (`dispatcher.check_generated_with`).
It used to get back the lease's own label (`self.digest = lease.digest`), so it compared the
label with itself and could never fire. Here a transport hands over other bytes than the
lease names without noticing (a stale cache, a bug in a transport): the checksum the worker
reports is that of those bytes, and the dispatcher's check fires.
"""

import numpy as np
import pytest

pytest.importorskip("ray")

from locojax.fleet.dispatcher import check_generated_with
from locojax.fleet.leases import Lease
from locojax.fleet.rollout_worker import pull_for
from locojax.fleet.versions import SyncStats, WeightMismatch, checksum

NAMED = {"w": np.arange(4, dtype=np.float32)}
OTHER = {"w": np.arange(4, dtype=np.float32) + 1}


class _Transport:
    """Delivers `tree` whatever was asked, checking nothing (the stale copy's route)."""

    def __init__(self, tree, digest=""):
        self.tree, self.digest = tree, digest

    def pull(self, version, digest=None):
        return self.tree, SyncStats(version, 16, 0.0, self.digest)


def _lease():
    return Lease(id=7, step=3, unit=1, start=0, stop=4, version=2, worker=0, deadline=0.0,
                 attempt=0, digest=checksum(NAMED))


@pytest.mark.parametrize("reported", ["computed here", "by the transport"])
def test_a_worker_that_got_other_bytes_is_caught(reported):
    lease = _lease()
    transport = _Transport(OTHER, checksum(OTHER) if reported == "by the transport" else "")
    tree, _, digest = pull_for(transport, lease)
    assert digest == checksum(tree) != lease.digest
    with pytest.raises(WeightMismatch, match="worker 0 generated lease 7 .* checksum"):
        check_generated_with(0, lease, digest)


def test_the_named_bytes_pass():
    lease = _lease()
    _, _, digest = pull_for(_Transport(NAMED), lease)
    check_generated_with(0, lease, digest)
