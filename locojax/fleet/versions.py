"""Weight versions: whole, checksummed copies of the params, and the transport that moves them.

Version v is the learner's params after v updates. They travel learner → parameter server →
rollout workers whole (never a mix of two versions), each with a checksum of its bytes, and
a receiver that finds a different checksum or version than it asked for raises
`WeightMismatch`: a wrong version is an error, never silently used.

`WeightTransport` is the small interface a mode uses (`push` a version, `pull` one); the
Ray modes move versions through the Ray object store (`parameter_server.py`), and a
device-to-device transport on real hardware would implement the same two methods.

The checksum is CRC-32 over every leaf's bytes, shape and dtype in tree order: it catches
corruption and mix-ups (a wrong or partial version), not tampering. Plain Python + numpy.
"""

from __future__ import annotations

import collections
import dataclasses
import zlib
from typing import Protocol

import jax
import numpy as np


class WeightMismatch(RuntimeError):
    """A version's bytes or number are not the ones asked for."""


class VersionUnavailable(LookupError):
    """The version is not (or no longer) held, e.g. the parameter server just restarted."""


def checksum(tree) -> str:
    crc = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        a = np.ascontiguousarray(leaf)
        head = f"{jax.tree_util.keystr(path)}:{a.dtype.str}:{a.shape};".encode()
        crc = zlib.crc32(a.view(np.uint8).reshape(-1), zlib.crc32(head, crc))
    return f"{crc:08x}"


def nbytes(tree) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree)))


def verify(tree, version: int, expected_version: int, expected_checksum: str) -> str:
    """Raise `WeightMismatch` unless `tree` is version `expected_version`, bytes intact;
    returns the checksum computed from `tree`'s bytes."""
    if version != expected_version:
        raise WeightMismatch(f"asked for weight version {expected_version}, got {version}")
    got = checksum(tree)
    if got != expected_checksum:
        raise WeightMismatch(f"weight version {version} has checksum {got}, expected "
                             f"{expected_checksum}: corrupted or mixed in transit")
    return got


class VersionStore:
    """The newest `keep` versions (numpy trees) with their checksums.

    Versions are added in increasing order; re-adding the newest one with the same bytes is
    a no-op (a retried push), anything else out of order is an error.
    """

    def __init__(self, keep: int):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self._versions: collections.OrderedDict[int, tuple[object, str]] = \
            collections.OrderedDict()

    def add(self, version: int, tree, digest: str | None = None) -> str:
        digest = checksum(tree) if digest is None else digest
        newest = self.newest()
        if newest is not None and version <= newest:
            if version == newest and self._versions[newest][1] == digest:
                return digest
            raise WeightMismatch(f"version {version} arrived after version {newest}")
        self._versions[version] = (tree, digest)
        while len(self._versions) > self.keep:
            self._versions.popitem(last=False)
        return digest

    def get(self, version: int) -> tuple[object, str]:
        if version not in self._versions:
            raise VersionUnavailable(f"weight version {version} is not held (held: "
                                     f"{self.versions()})")
        return self._versions[version]

    def newest(self) -> int | None:
        return next(reversed(self._versions)) if self._versions else None

    def versions(self) -> list[int]:
        return list(self._versions)

    def clear(self) -> None:
        self._versions.clear()


@dataclasses.dataclass(frozen=True)
class SyncStats:
    version: int
    bytes: int
    seconds: float
    digest: str = ""  # a pull's: the checksum computed from the bytes that arrived


class WeightTransport(Protocol):
    """Whole versions from the learner to the workers."""

    def push(self, version: int, tree) -> SyncStats:
        """Publish `tree` as `version` (numpy leaves); returns once receivers can pull it."""

    def pull(self, version: int) -> tuple[object, SyncStats]:
        """Version `version`, verified; `VersionUnavailable` if it is not held."""
