"""The parameter server and the object-store weight transport (learner → PS → workers).

`ParameterServer` keeps the newest K versions, each as an object in the Ray object store
that the server itself owns (so a version outlives the learner process that pushed it),
with its checksum. It owns nothing else: if it dies, Ray restarts it empty under a new
`incarnation`, and the learner, which keeps the same K versions host-side for its
checkpoint, restores it (`learner.RemoteSource._restore_ps`).

`ObjectStoreTransport` is the `versions.WeightTransport` the Ray modes use: `push` sends a
whole numpy version to the server (which verifies it before keeping it), `pull` fetches one
by number and checksum and verifies both again at the receiver. A server that is down or
restarting, or that holds other bytes under that number (the learner restarted since the
lease was made, and that lease's result will be dropped), shows up as `VersionUnavailable`,
a transient error the dispatcher retries; bytes that do not match their own checksum are
`WeightMismatch`, which stops the run.

A server that Ray restarted says so when it starts (it holds nothing until learner host 0
restores it from its kept copies, which the learner logs with the versions and checksums).

References: RLAX (trainer pushes to a parameter server, preemptible workers pull), Podracer
Sebulba (whole parameter sets pushed to actors).
"""

from __future__ import annotations

import logging
import time
import uuid

import jax
import numpy as np
import ray

from locojax.fleet.actors import setup_process
from locojax.fleet.faults import Faults, kill_self
from locojax.fleet.versions import (SyncStats, VersionStore, VersionUnavailable, checksum,
                                    nbytes, verify)

log = logging.getLogger(__name__)

TRANSIENT = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
              ray.exceptions.ObjectLostError, ray.exceptions.GetTimeoutError)
"""Errors that mean "the server (or an object it owned) is gone for now", not a bad version."""


@ray.remote
class ParameterServer:
    """The newest `keep` weight versions, checksummed, in the object store."""

    def __init__(self, keep: int, run_dir: str, faults: Faults):
        setup_process()
        self.store = VersionStore(keep)  # values: ObjectRefs owned by this actor
        self.run_dir, self.faults = run_dir, faults
        self._incarnation = uuid.uuid4().hex  # changes when Ray restarts the actor
        if ray.get_runtime_context().was_current_actor_reconstructed:
            log.warning("restarted by Ray (incarnation %s): holding no weight version until "
                        "learner host 0 restores its kept copies", self._incarnation[:8])

    def __repr__(self) -> str:
        return "parameter-server"

    def incarnation(self) -> str:
        return self._incarnation

    def put(self, version: int, tree, digest: str) -> list[int]:
        """Verify and keep `tree` as `version`; returns the versions now held."""
        verify(tree, version, version, digest)
        self.store.add(version, ray.put(tree), digest)
        return self.store.versions()

    def reset(self, versions: list[tuple[int, object, str]]) -> list[int]:
        """Hold exactly these (version, tree, checksum), oldest first (restore / rewind)."""
        self.store.clear()
        for version, tree, digest in versions:
            self.put(version, tree, digest)
        return self.store.versions()

    def get(self, version: int) -> tuple[int, list, str]:
        """(version, [ref to its tree], checksum); the ref is wrapped so it is not resolved
        here. `VersionUnavailable` if not held."""
        at = self.faults.kill_ps_at_version
        if at is not None and self.store.newest() is not None and self.store.newest() >= at \
                and self.faults.fire(self.run_dir, "kill_ps"):
            kill_self(f"parameter server holding versions {self.store.versions()}")
        ref, digest = self.store.get(version)
        if self.faults.corrupt_version == version:
            ref = ray.put(flip_one_bit(ray.get(ref)))
        return version, [ref], digest

    def versions(self) -> list[int]:
        return self.store.versions()


def flip_one_bit(tree):
    """A copy of `tree` with the lowest bit of its first leaf's first byte flipped."""
    leaves, treedef = jax.tree.flatten(tree)
    first = np.array(leaves[0])
    first.reshape(-1).view(np.uint8)[0] ^= 1
    return jax.tree.unflatten(treedef, [first, *leaves[1:]])


class ObjectStoreTransport:
    """`WeightTransport` through the Ray object store, via a `ParameterServer`."""

    def __init__(self, server, timeout_s: float = 120.0):
        self.server, self.timeout_s = server, timeout_s

    def push(self, version: int, tree, digest: str | None = None) -> SyncStats:
        t = time.perf_counter()
        digest = checksum(tree) if digest is None else digest
        ray.get(self.server.put.remote(version, tree, digest), timeout=self.timeout_s)
        return SyncStats(version, nbytes(tree), time.perf_counter() - t)

    def pull(self, version: int, digest: str | None = None) -> tuple[object, SyncStats]:
        """Version `version` (whose checksum must be `digest`, if given), verified."""
        t = time.perf_counter()
        try:
            got, (ref,), held = ray.get(self.server.get.remote(version), timeout=self.timeout_s)
        except TRANSIENT as e:
            raise VersionUnavailable(f"weight version {version}: parameter server unreachable "
                                     f"({type(e).__name__})") from None
        if digest is not None and held != digest:
            raise VersionUnavailable(f"weight version {version} is held with checksum {held}, "
                                     f"not {digest}: superseded by a learner restart")
        try:
            tree = ray.get(ref, timeout=self.timeout_s)
        except TRANSIENT as e:
            raise VersionUnavailable(f"weight version {version}: parameter server unreachable "
                                     f"({type(e).__name__})") from None
        digest = verify(tree, got, version, held)
        return tree, SyncStats(version, nbytes(tree), time.perf_counter() - t, digest)
