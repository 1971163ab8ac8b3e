"""Placement and schedule of the Ray modes (disaggregated, async): settings, checked plan.

DESIGN.md "Asynchrony": one mechanism, three settings.
- placement: which hosts learn and which produce rollouts. `disaggregated` splits `hosts`
  by `rollout_fraction`; `async` has `learner_hosts` learners and `workers` rollout workers.
- max staleness k (`Schedule`): 0 lock-step (equals colocated), 1 DA's one-step overlap,
  > 1 async. `disaggregated` names each step's version deterministically (max(0, s - k)),
  `async` lets a lease take the newest version.
- versions kept K by the parameter server (at least k + 1).

`PlacementConfig` checks its own values when made (so the CLI refuses them while parsing);
`place` turns it into a `PlacementPlan` of concrete numbers, refusing what only the mode
and the batch can tell, with a message that names the flag. Plain Python: no Ray, no JAX.
"""

from __future__ import annotations

import dataclasses
import math

ASYNC_MODES = ("disaggregated", "async")
"""Rollout workers feeding a learner group through a versioned buffer (this module's modes)."""
RAY_MODES = ("controller", *ASYNC_MODES)
"""The modes Ray places: the async ones, and the controller's hosts (`controller.py`)."""


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

    def admits(self, step: int, newest_version: int) -> bool:
        return step - newest_version <= self.max_staleness

    def version_for(self, step: int, newest_version: int) -> int:
        if not self.admits(step, newest_version):
            raise ValueError(f"step {step} is not admitted at version {newest_version} "
                             f"(k={self.max_staleness})")
        return newest_version if self.newest else max(0, step - self.max_staleness)


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
    """Ray modes only (controller, disaggregated, async): hosts, staleness, leases, the Ray
    cluster."""

    hosts: int = 4
    """Hosts the run places on, each with --devices-per-host devices (simulated CPU devices
    on a CPU cluster): the controller's hosts, or the learner group and rollout workers."""
    rollout_fraction: float = 0.75
    """disaggregated: share of the hosts that run rollout workers; the rest learn."""
    workers: int = 2
    """async: rollout workers (one host each)."""
    learner_hosts: int = 1
    """async: hosts of the learner group (joined by jax.distributed)."""
    max_staleness: int = 1
    """k: the most versions a sample may lag the learner (0 lock-step, 1 one-step overlap)."""
    versions_kept: int = 0
    """K: weight versions the parameter server keeps (0: k + 1, the fewest that work)."""
    prompts_per_lease: int = 0
    """Prompts (whole groups) per leased unit of work, always generated as one batch
    (0: the largest divisor of prompts_per_step up to prompts_per_step / workers, e.g. one
    unit per worker per step when they divide)."""
    lease_timeout_s: float = 300.0
    """A worker that has not returned a lease after this long loses it (and is restarted)."""
    start_timeout_s: float = 900.0
    """A rollout worker that has not warmed up (compiled its programs and produced one
    throw-away unit) this long after it was asked is killed and restarted; --max-attempts
    such warm-ups in a row stop the run."""
    max_attempts: int = 3
    """Failed attempts at one leased unit (its worker died, hung past the lease, or its
    verifier calls kept failing) before the run stops with an error naming the step, the
    unit, the last error and the worker: a unit that kills every worker stops the run."""
    stall_warning_s: float = 60.0
    """The learner warns, naming the units it waits for and who holds them, each time it has
    waited this long for a step's rollouts."""
    verifiers: int = 1
    """Reward/verifier actors that score the workers' completions."""
    verifier_timeout_s: float = 0.0
    """Deadline of one verifier call (a worker's share of a unit's completions): past it the
    verifier is killed (Ray restarts it) and the call is retried on another, at most
    --max-attempts times. 0: half of --lease-timeout-s, so that a retry fits in the lease."""
    ray_address: str = ""
    """Join this Ray cluster (e.g. 'auto' or 'HOST:6379' after `ray start --head`); empty:
    start a local one for this run."""
    ray_cpus: float = 0.0
    """CPUs of the local Ray cluster (0: this machine's). Actors request fractions of them."""

    def __post_init__(self):
        k = self.max_staleness
        if k < 0:
            raise ValueError(f"--max-staleness must be >= 0 (0 is lock-step, as colocated), "
                             f"got {k}")
        if self.versions_kept and self.versions_kept < k + 1:
            raise ValueError(f"--versions-kept {self.versions_kept} is fewer than "
                             f"--max-staleness + 1 = {k + 1}: a lease may still need any of "
                             f"the last {k + 1} versions")
        if self.hosts < 1:
            raise ValueError(f"--hosts must be >= 1, got {self.hosts}")
        if not 0.0 < self.rollout_fraction < 1.0:
            raise ValueError(f"--rollout-fraction must be in (0, 1), got "
                             f"{self.rollout_fraction}")
        if self.workers < 1 or self.learner_hosts < 1:
            raise ValueError(f"--workers and --learner-hosts must be >= 1, got {self.workers} "
                             f"and {self.learner_hosts}")
        if self.prompts_per_lease < 0:
            raise ValueError(f"--prompts-per-lease must be >= 0 (0: automatic), got "
                             f"{self.prompts_per_lease}")
        if self.lease_timeout_s <= 0:
            raise ValueError(f"--lease-timeout-s must be > 0, got {self.lease_timeout_s}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"--start-timeout-s must be > 0, got {self.start_timeout_s}")
        if self.max_attempts < 1:
            raise ValueError(f"--max-attempts must be >= 1, got {self.max_attempts}")
        if self.stall_warning_s <= 0:
            raise ValueError(f"--stall-warning-s must be > 0, got {self.stall_warning_s}")
        if self.verifiers < 1:
            raise ValueError(f"--verifiers must be >= 1, got {self.verifiers}")
        if not 0 <= self.verifier_timeout_s < self.lease_timeout_s:
            raise ValueError(f"--verifier-timeout-s must be >= 0 (0: half the lease) and below "
                             f"--lease-timeout-s {self.lease_timeout_s}, got "
                             f"{self.verifier_timeout_s}: a stuck verifier must be found out "
                             "before the lease that waits on it expires")


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
    schedule = Schedule(p.max_staleness, p.versions_kept or p.max_staleness + 1,
                        newest=mode == "async")
    return PlacementPlan(mode, learners, workers, d, per_lease, schedule, p.lease_timeout_s,
                         p.verifiers, p.max_attempts, p.stall_warning_s,
                         p.verifier_timeout_s or p.lease_timeout_s / 2, p.start_timeout_s)
