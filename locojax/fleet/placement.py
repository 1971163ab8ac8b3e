"""Placement and schedule of the Ray modes (disaggregated, async): settings, checked plan.

docs/design.md "Asynchrony": one mechanism, three settings.
- placement: which hosts learn and which produce rollouts. `disaggregated` splits `hosts`
  by `rollout_fraction`; `async` has `learner_hosts` learners and `workers` rollout workers.
- max staleness k (`Schedule`): 0 lock-step (equals colocated), 1 DA's one-step overlap,
  > 1 async. `disaggregated` names each step's version deterministically (max(0, s - k)),
  `async` lets a lease take the newest version.
- versions kept K by the parameter server (at least k + 1).

`PlacementConfig` (the flags, in `train/placement_config.py` so that the run config needs
nothing from fleet/) checks its own values when made (so the CLI refuses them while parsing);
`place` turns it into a `PlacementPlan` of concrete numbers, refusing what only the mode
and the batch can tell, with a message that names the flag. Plain Python: no Ray, no JAX.
"""

from __future__ import annotations

import dataclasses
import math

from locojax.train.placement_config import ASYNC_MODES, PlacementConfig


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Which steps may be generated, and with which weight version (from a checked
    `PlacementConfig`: k >= 0, K >= k + 1)."""

    max_staleness: int
    """k: a sample trains at most k versions after the one that generated it."""
    versions_kept: int
    """K: weight versions the parameter server keeps (>= k + 1)."""
    newest: bool
    """True: a lease takes the newest version (async). False: `max(0, step - k)`, the
    deterministic schedule (disaggregated), so a run's tokens do not depend on timing."""
    partial: bool = False
    """Partial rollouts (async): the learner's step s is cut once enough units are in and
    trains those that finished first, whichever step's prompts they hold; units still
    decoding go on, with their versions, into a later step (`leases.py`)."""

    def admits(self, step: int, newest_version: int) -> bool:
        return step - newest_version <= self.max_staleness

    def version_for(self, step: int, newest_version: int) -> int:
        if not self.admits(step, newest_version):
            raise ValueError(f"step {step} is not admitted at version {newest_version} "
                             f"(k={self.max_staleness})")
        return newest_version if self.newest else max(0, step - self.max_staleness)


@dataclasses.dataclass(frozen=True)
class PlacementPlan:
    """The checked, concrete layout of one Ray-mode run."""

    mode: str
    learner_hosts: int
    workers: int
    devices_per_host: int
    prompts_per_lease: int
    schedule: Schedule
    lease_timeout_s: float
    verifiers: int
    max_attempts: int = 3
    stall_warning_s: float = 60.0
    verifier_timeout_s: float = 150.0  # resolved: never 0
    start_timeout_s: float = 900.0

    @property
    def hosts(self) -> int:
        return self.learner_hosts + self.workers

    def describe(self) -> str:
        s = self.schedule
        return (f"{self.mode}: {self.learner_hosts} learner host(s) + {self.workers} rollout "
                f"worker(s) x {self.devices_per_host} device(s), max staleness "
                f"{s.max_staleness}, {s.versions_kept} version(s) kept, "
                f"{'newest' if s.newest else 'deterministic'} version schedule, "
                f"{'partial rollouts, ' if s.partial else ''}"
                f"{self.prompts_per_lease} prompt(s) per lease")


def place(mode: str, p: PlacementConfig, prompts_per_step: int,
          devices_per_host: int) -> PlacementPlan:
    """The layout of a Ray-mode run; `ValueError` naming the flag if it cannot be made."""
    if mode not in ASYNC_MODES:
        raise ValueError(f"mode {mode!r} has no rollout workers ({', '.join(ASYNC_MODES)} do)")
    if p.hosts < 2:
        raise ValueError(f"--hosts must be >= 2 (one learner and one rollout worker), got "
                         f"{p.hosts}")
    d = devices_per_host or 1
    if mode == "disaggregated" and p.inflight_chunk:
        raise ValueError("--inflight-chunk is async only: disaggregated's versions are "
                         "deterministic (max(0, s - k)), a version taken mid-unit is not")
    if mode == "disaggregated":
        workers = math.floor(p.rollout_fraction * p.hosts + 0.5)
        learners = p.hosts - workers
        if workers < 1:
            raise ValueError(f"--rollout-fraction {p.rollout_fraction} of --hosts {p.hosts} "
                             f"leaves no rollout worker ({p.rollout_fraction} x {p.hosts} "
                             "rounds to 0)")
        if learners < 1:
            raise ValueError(f"--rollout-fraction {p.rollout_fraction} of --hosts {p.hosts} "
                             "leaves no learner host")
    else:
        workers, learners = p.workers, p.learner_hosts
        if workers + learners > p.hosts:
            raise ValueError(
                f"--workers {workers} + --learner-hosts {learners} need {workers + learners} "
                f"hosts of {d} device(s), more than the devices allow: --hosts {p.hosts} x "
                f"--devices-per-host {d} = {p.hosts * d} devices")
    per_lease = p.prompts_per_lease or max(
        n for n in range(1, max(prompts_per_step // workers, 1) + 1) if prompts_per_step % n == 0)
    if prompts_per_step % per_lease:
        raise ValueError(f"--prompts-per-lease {per_lease} does not divide "
                         f"rollout.prompts_per_step={prompts_per_step}")
    if mode == "disaggregated" and p.partial_rollouts:
        raise ValueError("--partial-rollouts is async only: disaggregated trains each step's "
                         "own prompts, deterministically")
    schedule = Schedule(p.max_staleness, p.versions_kept or p.max_staleness + 1,
                        newest=mode == "async", partial=p.partial_rollouts)
    return PlacementPlan(mode, learners, workers, d, per_lease, schedule, p.lease_timeout_s,
                         p.verifiers, p.max_attempts, p.stall_warning_s,
                         p.verifier_timeout_s or p.lease_timeout_s / 2, p.start_timeout_s)
