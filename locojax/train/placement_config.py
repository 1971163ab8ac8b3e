"""The Ray modes' settings: which modes Ray places, and `PlacementConfig`, their flags.

`RunConfig` (`config.py`) composes `PlacementConfig` like every other subsystem's config,
and `fleet/placement.py` turns it into a checked `PlacementPlan` and version schedule. It
lives here, in train/, so that the run config never imports fleet/: fleet/ (the Ray modes)
builds on train/, never the other way round. Plain Python: no Ray, no JAX.
"""

from __future__ import annotations

import dataclasses

ASYNC_MODES = ("disaggregated", "async")
"""Rollout workers feeding a learner group through a versioned buffer (`fleet/`)."""
RAY_MODES = ("controller", *ASYNC_MODES)
"""The modes Ray places: the async ones, and the controller's hosts (`fleet/controller.py`)."""


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
    inflight_chunk: int = 0
    """async: decode iterations between a rollout worker's checks for a newer weight version,
    which it then samples with from the next iteration on (in-flight updates; each token
    records its version). 0: a unit is generated with the one version its lease names."""
    partial_rollouts: bool = False
    """async: cut each step once enough leased units are in, training the ones that finished
    first, whichever step's prompts they hold; a unit still decoding goes on, with its
    versions, into a later step (no long unit holds a step up). Every unit trains once."""
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
        if self.inflight_chunk < 0:
            raise ValueError(f"--inflight-chunk must be >= 0 (0: off), got "
                             f"{self.inflight_chunk}")
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
