"""The versioned rollout buffer between rollout workers (producers) and the learner (consumer).

Each completed lease leaves one `RolloutRecord` here, tagged with the weight version that
generated it. The learner takes whole steps, oldest first: step s is ready once every unit
of it is in, and learner host p of H gets rows [p·R/H, (p+1)·R/H) of the step, prompt-major
in slot order, so the global batch is the same whichever worker made which unit and in
which order they finished. Every row carries its staleness, the learner's version minus
the version that generated it (`TrainBatch.staleness`, which turns on the truncated
importance weight); the per-step sums behind the logged metrics gain a staleness
histogram (`stale/<s>`: rows generated s versions ago).

The buffer is part of the checkpoint (`state` / `restore`): plain arrays plus JSON.
Plain Python and numpy, no Ray: the mode modules own one, tests drive it directly.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from locojax.envs.base import Example
from locojax.rl.batch import SharedPrefix, TrainBatch
from locojax.rollout.single_turn import Rollouts
from locojax.train.curation import Plan
from locojax.train.leases import Lease
from locojax.train.producer import RolloutRecord

_ROLLOUT_ARRAYS = ("prompt_tokens", "prompt_mask", "tokens", "mask", "logprobs", "rewards",
                   "group_ids")


class RolloutBuffer:
    """Completed units keyed by (step, unit), until the learner takes their step."""

    def __init__(self, units_per_step: int, max_staleness: int):
        self.units_per_step, self.max_staleness = units_per_step, max_staleness
        self._records: dict[tuple[int, int], RolloutRecord] = {}

    def add(self, lease: Lease, record: RolloutRecord) -> None:
        """Store a lease's result; it must be of the lease's step and version."""
        key = (lease.step, lease.unit)
        if record.step != lease.step or record.version != lease.version:
            raise ValueError(f"lease {lease.id} is step {lease.step} at version "
                             f"{lease.version}, but its record is step {record.step} at "
                             f"version {record.version}")
        if key in self._records:
            raise RuntimeError(f"unit {key} is already in the buffer: it would train twice")
        self._records[key] = record

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
        parts = [self._records[(step, u)] for u in range(self.units_per_step)]
        return merge(parts, step, host, num_hosts, self.max_staleness)

    # --- checkpoint -------------------------------------------------------------------------

    def state(self) -> tuple[dict, dict]:
        """(arrays, JSON) holding every stored record."""
        arrays, meta = {}, []
        for (step, unit), r in sorted(self._records.items()):
            name = f"s{step}_u{unit}"
            ro = r.rollouts
            arrays[name] = {
                "batch": {k: v for k, v in _fields(r.batch).items()
                          if v is not None and k != "shared_prefix"},
                "rollouts": {k: getattr(ro, k) for k in _ROLLOUT_ARRAYS},
                "parts": dict(ro.reward_parts),
                "observations": r.observations,
                **({} if ro.env_mask is None else {"env_mask": ro.env_mask}),
            }
            prefix = r.batch.shared_prefix
            meta.append({"name": name, "step": step, "unit": unit, "version": r.version,
                         "sums": r.sums, "texts": ro.texts, "stats": ro.stats,
                         "examples": [dataclasses.asdict(e) for e in ro.examples],
                         "plan": dataclasses.asdict(r.plan),
                         "shared_prefix": None if prefix is None else dataclasses.asdict(prefix)})
        return arrays, {"records": meta}

    def restore(self, arrays: dict, meta: dict) -> None:
        self._records = {}
        for m in meta["records"]:
            a = arrays[m["name"]]
            prefix = m["shared_prefix"] and SharedPrefix(**m["shared_prefix"])
            batch = TrainBatch(**{k: np.asarray(v) for k, v in a["batch"].items()},
                               shared_prefix=prefix)
            ro = {k: np.asarray(v) for k, v in a["rollouts"].items()}
            rollouts = Rollouts(
                examples=[Example(**e) for e in m["examples"]], texts=list(m["texts"]),
                reward_parts={k: np.asarray(v) for k, v in a.get("parts", {}).items()},
                env_mask=None if "env_mask" not in a else np.asarray(a["env_mask"]),
                stats={k: float(v) for k, v in m["stats"].items()}, **ro)
            plan = Plan(**{**m["plan"], "indices": tuple(m["plan"]["indices"])})
            self._records[(m["step"], m["unit"])] = RolloutRecord(
                step=m["step"], version=m["version"], batch=batch,
                sums={k: float(v) for k, v in m["sums"].items()}, rollouts=rollouts, plan=plan,
                observations=np.asarray(a["observations"], np.int32))


def _fields(batch: TrainBatch) -> dict:
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}


def staleness_sums(staleness: np.ndarray, max_staleness: int) -> dict[str, float]:
    """Rows per staleness 0..k (every bucket present, so keys do not vary step to step)."""
    counts = np.bincount(np.asarray(staleness, np.int64), minlength=max_staleness + 1)
    if len(counts) > max_staleness + 1:
        raise RuntimeError(f"a row is {len(counts) - 1} versions stale, more than the bound "
                           f"k={max_staleness}")
    return {f"stale/{s}": float(c) for s, c in enumerate(counts)}


def merge(parts: list[RolloutRecord], step: int, host: int, num_hosts: int,
          max_staleness: int) -> RolloutRecord:
    """Concatenate a step's units in slot order; host `host` of `num_hosts` gets its rows.

    The step's sums (and its staleness histogram) go to host 0 and zeros to the others, so
    that summing over learner hosts, as the loop does, counts every row once. Every unit
    carries the step's whole admission plan (a function of the step alone: workers plan on
    their own), which must agree; a host gets the pass-count observations of its own slots.
    """
    g = parts[0].rollouts.group_size
    plan, prefix = parts[0].plan, parts[0].batch.shared_prefix
    for p in parts[1:]:
        if p.plan != plan or p.batch.shared_prefix != prefix:
            raise RuntimeError(f"the units of step {step} disagree on the step's plan or "
                               f"prompt layout: {p.plan} / {p.batch.shared_prefix} vs {plan} / "
                               f"{prefix}")
    staleness = np.concatenate([np.full(len(p.rollouts.texts), step - p.version, np.int32)
                                for p in parts])
    fields = {}
    for name, first in _fields(parts[0].batch).items():
        if name == "staleness":
            fields[name] = staleness
        elif name == "shared_prefix":  # static: the same for every unit (checked above)
            fields[name] = prefix
        else:
            fields[name] = None if first is None else np.concatenate(
                [np.asarray(getattr(p.batch, name)) for p in parts])
    rows = len(staleness)
    if rows % num_hosts or (rows // num_hosts) % g:
        raise ValueError(f"{rows} rows of step {step} do not split into whole groups over "
                         f"{num_hosts} learner hosts")
    lo, hi = host * rows // num_hosts, (host + 1) * rows // num_hosts
    batch = TrainBatch(**{k: v if v is None or k == "shared_prefix" else v[lo:hi]
                          for k, v in fields.items()})

    sums: dict[str, float] = {}
    for p in parts:
        for k, v in p.sums.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    sums.update(staleness_sums(staleness, max_staleness))
    ro = [p.rollouts for p in parts]
    stats: dict[str, float] = {}
    for r in ro:
        for k, v in r.stats.items():
            stats[k] = stats.get(k, 0.0) + float(v)
    if host:
        sums, stats = dict.fromkeys(sums, 0.0), dict.fromkeys(stats, 0.0)

    cat = lambda name: np.concatenate([getattr(r, name) for r in ro])  # noqa: E731
    p_lo, p_hi = lo // g, hi // g
    obs = np.concatenate([p.observations for p in parts])
    per_slot = len(obs) // (rows // g)  # 1 + refill rounds
    mine = obs[(obs[:, 0] >= p_lo) & (obs[:, 0] < p_hi)]
    pad = np.full(((p_hi - p_lo) * per_slot - len(mine), obs.shape[1]), -1, np.int32)
    rollouts = Rollouts(
        examples=[e for r in ro for e in r.examples][p_lo:p_hi],
        prompt_tokens=cat("prompt_tokens")[p_lo:p_hi], prompt_mask=cat("prompt_mask")[p_lo:p_hi],
        tokens=cat("tokens")[lo:hi], mask=cat("mask")[lo:hi], logprobs=cat("logprobs")[lo:hi],
        texts=[t for r in ro for t in r.texts][lo:hi], rewards=cat("rewards")[lo:hi],
        reward_parts={k: np.concatenate([r.reward_parts[k] for r in ro])[lo:hi]
                      for k in ro[0].reward_parts},
        group_ids=cat("group_ids")[lo:hi],
        env_mask=None if ro[0].env_mask is None else cat("env_mask")[lo:hi], stats=stats)
    version = min(p.version for p in parts)
    return RolloutRecord(step=step, version=version, batch=batch, sums=sums, rollouts=rollouts,
                         plan=plan, observations=np.concatenate([mine, pad]).astype(np.int32))
