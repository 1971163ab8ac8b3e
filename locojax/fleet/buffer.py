"""The versioned rollout buffer between rollout workers (producers) and the learner (consumer).

Each completed lease leaves one `RolloutRecord` here, tagged with the weight version that
generated it. The learner takes whole steps, oldest first: step s is ready once every unit
of it is in, and learner host p of H gets rows [p·R/H, (p+1)·R/H) of the step, prompt-major
in slot order, so the global batch is the same whichever worker made which unit and in
which order they finished. Every row carries its staleness, the learner's version minus
the version that generated it (`TrainBatch.staleness`, which turns on the truncated
importance weight), and the step's stats gain the staleness histogram.

With in-flight updates (`inflight.py`) a unit's tokens name their own versions
(`RolloutRecord.token_versions`): staleness is counted per token (the learner's version,
i.e. the step, minus the token's), bounded per token (`check_token_versions`), and a row's
is its stalest token's, its first (versions within a row only go up); the step's stats add
the per-token histogram too.

Partial rollouts (`leases.py`): step t is cut once `units_per_step` finished units are fresh
enough for it (`assign`), taken in the order they finished, whichever step's prompts they
hold; each then counts its staleness from t (`take_units`). One too stale for t (its
oldest token more than k versions behind) is removed and handed back for the queue: a unit
that finishes later than the cut it missed only ever trains later, so it would never fit.

The buffer is part of the checkpoint (`state` / `restore`): each record's arrays plus JSON.
Plain Python and numpy, no Ray: the dispatcher owns one, tests drive it directly.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from locojax.fleet.leases import Lease
from locojax.train.record import RolloutRecord, RolloutStats


class RolloutBuffer:
    """Completed units keyed by (step, unit), until the learner takes their step."""

    def __init__(self, units_per_step: int, max_staleness: int, partial: bool = False):
        self.units_per_step, self.max_staleness = units_per_step, max_staleness
        self.partial = partial
        self._records: dict[tuple[int, int], RolloutRecord] = {}
        self._assigned: dict[int, list[tuple[int, int]]] = {}  # partial: step -> its units

    def add(self, lease: Lease, record: RolloutRecord) -> None:
        """Store a lease's result; it must be of the lease's step and version."""
        key = (lease.step, lease.unit)
        if record.step != lease.step or record.version != lease.version:
            raise ValueError(f"lease {lease.id} is step {lease.step} at version "
                             f"{lease.version}, but its record is step {record.step} at "
                             f"version {record.version}")
        if key in self._records:
            raise RuntimeError(f"unit {key} is already in the buffer: it would train twice")
        # partial: the step that trains it is known at the cut (`take_units` checks then)
        check_token_versions(record, self.max_staleness, None if self.partial else -1)
        self._records[key] = record

    def assign(self, step: int) -> tuple[bool, list[tuple[int, int]]]:
        """partial: (whether step `step` is cut: its units chosen, the first `units_per_step`
        finished ones fresh enough for it; the units found too stale for it, removed here,
        for the caller to put back in the queue)."""
        if step in self._assigned:
            return True, []
        order = [k for k in self._records if not any(k in a for a in self._assigned.values())]
        stale = [k for k in order if step - self._records[k].version > self.max_staleness]
        for key in stale:
            del self._records[key]
        fresh = [k for k in order if k not in stale]
        if len(fresh) < self.units_per_step:
            return False, stale
        self._assigned[step] = fresh[:self.units_per_step]
        return True, stale

    def take_units(self, step: int, host: int = 0, num_hosts: int = 1) -> RolloutRecord:
        """partial: host `host`'s share of the units `assign` chose for step `step`, each
        counting its staleness from `step` (the learner's version when it trains them)."""
        units = [dataclasses.replace(self._records[k], step=step) for k in self._assigned[step]]
        for unit in units:
            check_token_versions(unit, self.max_staleness)
        return merge(units, host, num_hosts, self.max_staleness)

    def retire(self, step: int) -> list[tuple[int, int]]:
        """partial: drop the units step `step` trained; returns them."""
        keys = self._assigned.pop(step)
        for key in keys:
            del self._records[key]
        return keys

    def ready(self, step: int) -> bool:
        return all((step, u) in self._records for u in range(self.units_per_step))

    def steps(self) -> list[int]:
        return sorted({s for s, _ in self._records})

    def drop(self, step: int) -> None:
        for u in range(self.units_per_step):
            self._records.pop((step, u), None)

    def take(self, step: int, host: int = 0, num_hosts: int = 1) -> RolloutRecord:
        """Learner host `host`'s share of step `step` (all units must be in)."""
        if not self.ready(step):
            raise RuntimeError(f"step {step} is not complete in the buffer")
        units = [self._records[(step, u)] for u in range(self.units_per_step)]
        return merge(units, host, num_hosts, self.max_staleness)

    # --- checkpoint -------------------------------------------------------------------------

    def state(self) -> tuple[dict, dict]:
        """(arrays, JSON) holding every stored record."""
        arrays, meta = {}, []
        for (step, unit), record in self._records.items():  # in the order they finished
            name = f"s{step}_u{unit}"
            arrays[name], m = record.to_state()
            meta.append({"name": name, "unit": unit, **m})
        return arrays, {"records": meta,
                        "assigned": [[t, [list(k) for k in keys]]
                                     for t, keys in self._assigned.items()]}

    def restore(self, arrays: dict, meta: dict) -> None:
        self._records = {(m["step"], m["unit"]): RolloutRecord.from_state(arrays[m["name"]], m)
                         for m in meta["records"]}
        self._assigned = {int(t): [tuple(k) for k in keys]
                          for t, keys in meta.get("assigned", [])}


def staleness_histogram(staleness: np.ndarray, max_staleness: int) -> tuple[float, ...]:
    """Rows per staleness 0..k (every bucket present, so the field does not vary)."""
    counts = np.bincount(np.asarray(staleness, np.int64), minlength=max_staleness + 1)
    if len(counts) > max_staleness + 1:
        raise RuntimeError(f"a row is {len(counts) - 1} versions stale, more than the bound "
                           f"k={max_staleness}")
    return tuple(float(c) for c in counts)


def check_token_versions(record: RolloutRecord, max_staleness: int,
                         step: int | None = -1) -> None:
    """Raise unless every target token's version v of `record` (unit version u) satisfies
    u <= v <= s and s - v <= k, s the step that trains it (-1: `record.step`; None: not
    known yet, check u <= v only): sampled by the unit's own version or a newer one, never
    by one the learner has not made yet, never more than k versions stale."""
    if record.token_versions is None:
        return
    tv, mask = np.asarray(record.token_versions), np.asarray(record.batch.loss_mask, bool)
    if tv.shape != mask.shape:
        raise ValueError(f"token_versions has shape {tv.shape}, the batch {mask.shape}")
    used = tv[mask]
    if not used.size:
        return
    if step is None:
        s, lo = "?", record.version
        bad = used[used < lo]
    else:
        s = record.step if step == -1 else step
        lo = max(record.version, s - max_staleness)
        bad = used[(used < lo) | (used > s)]
    if bad.size:
        raise RuntimeError(f"a token of step {s} (unit version {record.version}) names weight "
                           f"version {int(bad[0])}: allowed {lo}..{s} (k={max_staleness})")


def token_staleness(record: RolloutRecord) -> tuple[np.ndarray, np.ndarray]:
    """([rows] each row's staleness, its stalest target token's; [n] every target token's),
    for a record of the step the learner trains."""
    rows = len(record.batch.tokens)
    mask = np.asarray(record.batch.loss_mask, bool)
    if record.token_versions is None:
        return (np.full(rows, record.step - record.version, np.int32),
                np.full(int(mask.sum()), record.step - record.version, np.int32))
    tv = np.where(mask, np.asarray(record.token_versions), np.iinfo(np.int32).max)
    oldest = np.where(mask.any(1), tv.min(1), record.version)
    return ((record.step - oldest).astype(np.int32),
            (record.step - np.asarray(record.token_versions)[mask]).astype(np.int32))


def merge(units: list[RolloutRecord], host: int, num_hosts: int,
          max_staleness: int) -> RolloutRecord:
    """Concatenate a step's units in slot order, each row tagged with its staleness, and give
    host `host` of `num_hosts` its share (`RolloutRecord.share`: whole groups; the step's
    stats, with its staleness histogram, on host 0)."""
    first, step = units[0], units[0].step
    prefix = first.batch.shared_prefix
    if any(u.batch.shared_prefix != prefix for u in units):
        raise RuntimeError(f"the units of step {step} disagree on the prompt layout")
    rows, tokens = zip(*(token_staleness(u) for u in units))
    staleness = np.concatenate(rows)
    whole = jax.tree.map(lambda *xs: np.concatenate(xs), *[u.batch for u in units])
    stats = sum((u.stats for u in units[1:]), first.stats) + RolloutStats(
        staleness=staleness_histogram(staleness, max_staleness))
    versions = None
    if any(u.token_versions is not None for u in units):  # in-flight: count tokens too
        stats = stats + RolloutStats(token_staleness=staleness_histogram(
            np.concatenate(tokens), max_staleness))
        versions = np.concatenate([
            u.token_versions if u.token_versions is not None else
            np.where(np.asarray(u.batch.loss_mask, bool), u.version, -1).astype(np.int32)
            for u in units])
    # At k = 0 every row is fresh (the gate admits no other), and the batch carries no
    # staleness: the learner then runs the in-process modes' very train step, so lock-step
    # DA and async equal colocated bitwise by construction. With the staleness input (and
    # the IS weights' histogram it adds in place of the sampler-learner gap) the step was
    # another program, equal only where the code generator fused both alike (Makefile).
    record = RolloutRecord(step, min(u.version for u in units),
                           dataclasses.replace(whole, staleness=staleness if max_staleness
                                               else None), stats, versions)
    return record.share(host, num_hosts)
