"""Fault injection for the Ray modes' preemption tests: each fault fires once per run.

A dead or hung actor is an expected event with its own test (STYLE.md 13). The tests pass a
`Faults` to `driver.run`; the actors consult it at fixed points and fire a fault the
first time its point is reached, recording that under `run_dir/faults/` (an atomically
created marker file), so an actor that Ray restarts, or a learner group that resumes,
does not fire it again. Kills are SIGKILL of the actor's own process: as abrupt as
`kill -9` from outside, but at a chosen point (a worker "mid-generation" is one that
finished prefill and entered decode). The exception is a poison unit, which fires every
time: it is the unit that kills or hangs whichever worker decodes it.

A hung verifier holds the GIL (catastrophic regex backtracking, as math-verify has met), so
nothing inside its process can notice a deadline: only killing the process ends it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import time

from locojax.profiler import StepTimer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Faults:
    kill_worker_at_step: int | None = None
    """SIGKILL the first worker that starts decoding a lease of this step (whichever worker
    that is: which worker gets which lease depends on timing)."""
    hang_worker_at_step: int | None = None
    """The first worker that starts decoding a lease of this step stops progressing."""
    poison_unit: tuple[int, int] | None = None
    """(step, unit): every worker that starts decoding this unit dies (`poison` "kill") or
    hangs ("hang"), every time: bounded retries must stop the run."""
    poison: str = "kill"
    """What the poison unit does to its worker: "kill" or "hang"."""
    kill_learner_after: int | None = None
    """Learner host 0 SIGKILLs itself after the update of this step, before publishing its
    version and before its checkpoint."""
    kill_learner_after_publish: int | None = None
    """Learner host 0 SIGKILLs itself after the update of this step and after publishing its
    version (the server holds it, the dispatcher leases with it), before its checkpoint."""
    hang_warmup: bool = False
    """Every rollout worker's warm-up (its `ready` call) hangs: bounded by the start
    deadline, not by any lease's."""
    hang_verifier_after_calls: int | None = None
    """A verifier's call after this many calls in its life hangs holding the GIL (once)."""
    kill_ps_at_version: int | None = None
    """The parameter server SIGKILLs itself on the first pull once it holds this version."""
    corrupt_version: int | None = None
    """The parameter server serves this version with one bit flipped (bad memory, a bad
    link): the worker must refuse it."""
    slow_version_check_s: float = 0.0
    """Each in-flight version check of a rollout worker (`--inflight-chunk`) first sleeps
    this long: a decode slow enough that versions arrive mid-unit, so swaps happen."""
    slow_unit: tuple[int, int] | None = None
    """(step, unit): the first worker that starts decoding this unit first sleeps
    `slow_unit_s` (once): a long tail, which partial rollouts train in a later step."""
    slow_unit_s: float = 0.0
    stale_sampler_at_step: int | None = None
    """Every rollout worker (controller mode: every host) samples leases (steps) of this step
    and later with version 0's weights while holding, naming and checking a newer version:
    the stale-weights bug class, which the logprob check must stop the run on, naming the
    versions."""
    kill_host_after: int | None = None
    """Controller mode: host 1 (or 0 if alone) SIGKILLs itself after the update of this step."""

    def fire(self, run_dir: str, name: str) -> bool:
        """True exactly once per run for `name` (marker file created with O_EXCL)."""
        folder = os.path.join(run_dir, "faults")
        os.makedirs(folder, exist_ok=True)
        try:
            fd = os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True


def kill_self(what: str) -> None:
    log.warning("fault injection: SIGKILL %s (pid %d)", what, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)


def hang(what: str) -> None:
    log.warning("fault injection: %s hangs (pid %d)", what, os.getpid())
    while True:  # alive, not progressing, until its lease expires and it is killed
        time.sleep(60)


def hang_holding_the_gil(what: str) -> None:
    """Catastrophic backtracking: (a+)+$ against a run of a's and one b tries every split of
    the run, 2^40 of them, inside one call to the regex engine, which never releases the
    GIL."""
    log.warning("fault injection: %s hangs holding the GIL (pid %d)", what, os.getpid())
    re.match(r"(a+)+$", "a" * 40 + "b")


class FaultyTimer(StepTimer):
    """A step timer whose `decode` phase fires a worker's kill or hang fault."""

    def __init__(self, faults: Faults, run_dir: str, worker: int, step: int, unit: int = -1):
        super().__init__()
        self.faults, self.run_dir, self.worker, self.step = faults, run_dir, worker, step
        self.unit = unit

    @contextlib.contextmanager
    def phase(self, name: str):
        if name == "decode":
            p, step = self.faults, self.step
            if p.kill_worker_at_step == step and p.fire(self.run_dir, "kill_worker"):
                kill_self(f"worker {self.worker} mid-generation (step {step})")
            if p.hang_worker_at_step == step and p.fire(self.run_dir, "hang_worker"):
                hang(f"worker {self.worker} (step {step})")
            if p.slow_unit == (step, self.unit) and p.fire(self.run_dir, "slow_unit"):
                log.warning("fault injection: worker %d sleeps %.0f s on unit %d of step %d",
                            self.worker, p.slow_unit_s, self.unit, step)
                time.sleep(p.slow_unit_s)
            if p.poison_unit == (step, self.unit):
                what = f"worker {self.worker} decoding poison unit {self.unit} of step {step}"
                if p.poison == "kill":
                    kill_self(what)
                hang(what)
        with super().phase(name) as ph:
            yield ph
