"""In-flight weight updates (async): a rollout worker takes a newer version between decode
chunks, and every token records the version that sampled it.

A unit starts with the version its lease names (checked by checksum, as before). With
`--inflight-chunk K`, the worker's engine decodes K iterations at a time (`engine.Decoding`,
the controller mode's chunked decode, bitwise the whole loop's) and, between chunks, asks
its `VersionSource` for the newest published version; `swap_to` decides, and a newer one is
pulled whole, its checksum verified on arrival, and sampled with from the next iteration
on. The rows, their KV cache and their draws stay where they are: only the weights change.

What a token's version means: the weights that computed the logits it was sampled from.
Decode runs the rows of a batch in lock step, so response column j of every row is sampled
at decode iteration j (column 0 by the prefill): one `VersionSchedule` of (first column,
version, checksum) describes the whole unit, and `token_versions` spreads it over the rows.
The KV cache of the earlier tokens was written by the older version and is kept (as
PipelineRL does): the behaviour policy of a token after a swap is "new weights over that
cache", and its logprob, which the sampler computes as it samples, is that policy's. The
truncated importance weight min(π_old / π_behav, C) uses those per-token behaviour
logprobs, so it corrects for exactly the policy that sampled each token.

Versions within a row only increase, so a row's staleness (the learner's version minus its
oldest token's) bounds every token's; the buffer checks every token anyway
(`buffer.check_token_versions`) and counts them (`rollout/token_staleness/*`).

Plain Python around the engine (no Ray): the worker gives a `VersionSource` that asks the
parameter server; tests give a fake one. Reference: PipelineRL (Piché et al. 2025,
in-flight weight updates), AReaL (interruptible generation).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from locojax.engine import refill as refill_lib
from locojax.engine.engine import Decoding, Generation
from locojax.fleet.versions import VersionUnavailable


def swap_to(held: int, newest: int | None) -> int | None:
    """The version to take between two decode chunks, holding `held`: the newest published,
    if newer (None: keep). Never an older one: a row's versions only go up, which is what
    makes a row's oldest token its stalest."""
    return newest if newest is not None and newest > held else None


class VersionSource(Protocol):
    """Where a worker finds newer versions between chunks."""

    def newest(self) -> int | None:
        """The newest version published (None: unknown; keep what is held)."""

    def take(self, version: int):
        """(The engine's weights of `version`, placed; the checksum computed from the bytes
        that arrived). `WeightMismatch` if they are not the published bytes;
        `VersionUnavailable` if the server cannot give it now (the unit keeps its version)."""


@dataclasses.dataclass
class VersionSchedule:
    """Which version sampled which response columns of one generate: `spans[i]` =
    (first column, version, checksum), first columns increasing, the first at 0."""

    spans: list[tuple[int, int, str]]

    def versions(self) -> dict[int, str]:
        return {v: d for _, v, d in self.spans}

    def columns(self, n: int) -> np.ndarray:
        """[n] int32: the version of each response column 0..n-1."""
        out = np.empty(n, np.int32)
        for first, version, _ in self.spans:
            out[first:] = version
        return out


def token_versions(loss_mask: np.ndarray, response_columns: int,
                   schedule: VersionSchedule) -> np.ndarray:
    """[B, T] int32 aligned with a `TrainBatch` (prompt columns, then `response_columns`):
    each target token's version, -1 where there is no target (prompt, padding)."""
    loss_mask = np.asarray(loss_mask, bool)
    cols = np.full(loss_mask.shape[1], -1, np.int32)
    cols[loss_mask.shape[1] - response_columns:] = schedule.columns(response_columns)
    return np.where(loss_mask, cols[None, :], -1).astype(np.int32)


class InFlightEngine:
    """An `Engine` whose `decode` checks for a newer version every `chunk` iterations.

    Everything else is the wrapped engine's. Every generate of a unit prefills with the
    unit's own version (`begin`: the one its lease names, which the producer was handed)
    and may swap during its decode; `schedules` holds each generate's `VersionSchedule`,
    `latest` the newest version taken (version, weights, checksum): at most two versions
    are on the devices, the unit's and the newest."""

    def __init__(self, engine, chunk: int, source: VersionSource):
        if chunk < 1:
            raise ValueError(f"--inflight-chunk must be >= 1 to swap versions, got {chunk}")
        self.engine, self.chunk, self.source = engine, chunk, source
        self.start: tuple[int, str] | None = None
        self.swap = True
        self.latest: tuple[int, object, str] | None = None
        self.schedules: list[VersionSchedule] = []

    def __getattr__(self, name):  # only what this class does not define
        return getattr(self.engine, name)

    def begin(self, version: int, digest: str, swap: bool = True) -> None:
        """Start a unit with the version its lease names (the weights the producer gets);
        `swap=False`: keep it throughout (a warm-up, whose weights are no version)."""
        self.start, self.schedules, self.swap = (version, digest), [], swap
        if self.latest is not None and self.latest[0] <= version:
            self.latest = None  # not newer than the unit's own: never swapped to

    def decode(self, pending) -> Generation:
        if self.start is None:
            raise RuntimeError("InFlightEngine.decode before begin(): which version is held?")
        spans = [(0, *self.start)]  # the prefill sampled column 0 with the unit's version
        if isinstance(pending, refill_lib.Queued) or not self.swap:  # decoded whole
            self.schedules.append(VersionSchedule(spans))
            return self.engine.decode(pending)
        decoding, held = Decoding(self.engine, pending), self.start[0]
        while not decoding.advance(self.chunk):
            version = swap_to(held, self.source.newest())
            if version is None:
                continue
            if self.latest is None or self.latest[0] != version:
                self.latest = None  # the older newest goes before the next arrives
                try:
                    self.latest = (version, *self.source.take(version))
                except VersionUnavailable:  # the server is restarting: try at the next chunk
                    continue
            _, decoding.weights, digest = self.latest
            held = version
            spans.append((decoding.step, version, digest))
        self.schedules.append(VersionSchedule(spans))
        return decoding.result()
