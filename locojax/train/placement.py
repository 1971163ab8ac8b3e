"""Settings of the Ray modes (disaggregated, async), and the plan checked before any actor starts.

DESIGN.md "Asynchrony": one mechanism, three settings.
- placement: which hosts learn and which produce rollouts. `disaggregated` splits `hosts`
  by `rollout_fraction`; `async` has `learner_hosts` learners and `workers` rollout workers.
- max staleness k (`Schedule`): 0 lock-step (equals colocated), 1 DA's one-step overlap,
  > 1 async. `disaggregated` names each step's version deterministically (max(0, s - k)),
  `async` lets a lease take the newest version.
- versions kept K by the parameter server (at least k + 1).

`plan` turns a `RunConfig` into the concrete numbers, or raises `ValueError` with a message
that names the flag. Plain Python: no Ray, no JAX.
"""

from __future__ import annotations

import dataclasses
import math

from locojax.train.leases import Schedule

RAY_MODES = ("disaggregated", "async")


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
    """Ray modes only (disaggregated, async): hosts, staleness, leases, the Ray cluster."""

    hosts: int = 4
    """Hosts the run places its learner group and rollout workers on, each with
    --devices-per-host devices (simulated CPU devices on a CPU cluster)."""
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
    verifiers: int = 1
    """Reward/verifier actors that score the workers' completions."""
    ray_address: str = ""
    """Join this Ray cluster (e.g. 'auto' or 'HOST:6379' after `ray start --head`); empty:
    start a local one for this run."""
    ray_cpus: float = 0.0
    """CPUs of the local Ray cluster (0: this machine's). Actors request fractions of them."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """The checked, concrete layout of one Ray-mode run."""

    mode: str
    learner_hosts: int
    workers: int
    devices_per_host: int
    prompts_per_lease: int
    schedule: Schedule
    lease_timeout_s: float
    verifiers: int

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


def plan(mode: str, p: PlacementConfig, prompts_per_step: int, devices_per_host: int) -> Plan:
    """Check the settings and derive the layout; `ValueError` naming the flag otherwise."""
    if mode not in RAY_MODES:
        raise ValueError(f"mode {mode!r} is not a Ray mode ({', '.join(RAY_MODES)})")
    d = devices_per_host or 1
    if p.max_staleness < 0:
        raise ValueError(f"--max-staleness must be >= 0 (0 is lock-step, as colocated), got "
                         f"{p.max_staleness}")
    kept = p.versions_kept or p.max_staleness + 1
    if kept < p.max_staleness + 1:
        raise ValueError(f"--versions-kept {kept} is fewer than --max-staleness + 1 = "
                         f"{p.max_staleness + 1}: a lease may still need any of the last "
                         f"{p.max_staleness + 1} versions")
    if p.hosts < 2:
        raise ValueError(f"--hosts must be >= 2 (one learner and one rollout worker), got "
                         f"{p.hosts}")
    if mode == "disaggregated":
        if not 0.0 < p.rollout_fraction < 1.0:
            raise ValueError(f"--rollout-fraction must be in (0, 1), got {p.rollout_fraction}")
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
        if workers < 1 or learners < 1:
            raise ValueError(f"--workers and --learner-hosts must be >= 1, got {workers} and "
                             f"{learners}")
        if workers + learners > p.hosts:
            raise ValueError(
                f"--workers {workers} + --learner-hosts {learners} need {workers + learners} "
                f"hosts of {d} device(s), more than the devices allow: --hosts {p.hosts} x "
                f"--devices-per-host {d} = {p.hosts * d} devices")
    per_lease = p.prompts_per_lease
    if per_lease == 0:
        per_lease = max([n for n in range(1, max(prompts_per_step // workers, 1) + 1)
                         if prompts_per_step % n == 0])
    if per_lease < 1 or prompts_per_step % per_lease:
        raise ValueError(f"--prompts-per-lease {per_lease} does not divide "
                         f"rollout.prompts_per_step={prompts_per_step}")
    if p.lease_timeout_s <= 0:
        raise ValueError(f"--lease-timeout-s must be > 0, got {p.lease_timeout_s}")
    if p.verifiers < 1:
        raise ValueError(f"--verifiers must be >= 1, got {p.verifiers}")
    schedule = Schedule(p.max_staleness, kept, newest=mode == "async")
    return Plan(mode, learners, workers, d, per_lease, schedule, p.lease_timeout_s, p.verifiers)
