"""A host's environment worker pool: env steps of many rows at once, each with a deadline.

Multi-turn rollouts step every live row's environment between two model turns. The steps
are independent, and the slow ones (sandboxed test runs, real tools) wait on subprocesses
or I/O, so a few threads run them in parallel; where a step runs untrusted code the env
itself does it in the sandbox (`locojax.envs.sandbox`, e.g. `SWEEnv`'s test runs).

Every call gets `timeout_s` from the moment a worker starts it. An exception is an
`error` outcome, a call past its deadline a `timeout` outcome; neither reaches the caller
as an exception, so a broken or hung environment ends its own trajectory, never the run.
As with `rewards.RewardRunner`'s thread isolation, a hung call cannot be stopped: its
thread is abandoned (it exits when the call returns, its result unread) and a fresh
worker takes its place, so the pool keeps its size. Code that may loop forever belongs
in the sandbox, whose wall-clock limit kills it.

What the pool cannot survive: a call stuck inside one C call that never releases the GIL
(catastrophic regex backtracking, a huge integer power). CPython switches threads only
between bytecodes, so every thread of the process stops, the one that would notice the
deadline included, until that call returns. A pure-Python loop is preempted every switch
interval, and is timed out like any hang (tests/test_multi_turn_rollout.py). Tools that can
meet such input must run in a process (the sandbox).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Outcome:
    """The result of one call."""

    status: Literal["ok", "error", "timeout"]
    value: Any = None
    detail: str = ""


@dataclasses.dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple
    started: float = 0.0  # monotonic time a worker picked it up (0: queued)
    outcome: Outcome | None = None
    abandoned: bool = False


def env_deadline_s(timeout_s: float, task) -> float:
    """The env pool's deadline for `task`: `timeout_s` (`multi_turn.env_timeout_s`), raised
    above the task's own bound on a step (`Task.env_step_s`). Equal to the SWE sandbox's
    wall clock, it counted slow test runs as env timeouts, and the abandoned step's sandbox
    went on beside the next one's."""
    bound = getattr(task, "env_step_s", 0.0)
    if bound > timeout_s:
        log.info("env pool: deadline %.4g s, above task %s's own bound on a step (%.4g s), "
                 "not multi_turn.env_timeout_s %.4g s", bound, getattr(task, "name", "?"),
                 bound, timeout_s)
    return max(timeout_s, bound)


class EnvPool:
    """`run(fn, args_list)` calls fn(*args) for each args on `workers` threads."""

    def __init__(self, workers: int = 4, timeout_s: float = 30.0):
        if workers < 1:
            raise ValueError(f"env workers must be >= 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"env timeout_s must be > 0, got {timeout_s}")
        self.workers, self.timeout_s = workers, timeout_s
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._changed = threading.Condition()
        self._threads = [self._spawn() for _ in range(workers)]
        self._logged = 0

    def _spawn(self) -> threading.Thread:
        t = threading.Thread(target=self._work, daemon=True, name="locojax-env")
        t.start()
        return t

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._changed:
                job.started = time.monotonic()
                self._changed.notify_all()
            try:
                outcome = Outcome("ok", job.fn(*job.args))
            except BaseException as e:  # noqa: BLE001 - a broken env ends its trajectory
                outcome = Outcome("error", detail=f"{type(e).__name__}: {e}")
            with self._changed:
                if job.abandoned:  # timed out and replaced: this thread is surplus now
                    return
                job.outcome = outcome
                self._changed.notify_all()

    def run(self, fn: Callable[..., Any], args_list: Sequence[tuple]) -> list[Outcome]:
        """Outcomes in the order of `args_list`; returns once each call finished or timed out."""
        jobs = [_Job(fn, tuple(args)) for args in args_list]
        for job in jobs:
            self._queue.put(job)
        with self._changed:
            while True:
                now = time.monotonic()
                for job in jobs:
                    if job.outcome is None and job.started and now - job.started >= self.timeout_s:
                        job.abandoned = True
                        job.outcome = Outcome("timeout", detail=f"exceeded {self.timeout_s}s")
                        self._warn(job.outcome)
                        self._threads.append(self._spawn())  # keep `workers` threads serving
                pending = [j for j in jobs if j.outcome is None]
                if not pending:
                    break
                started = [j.started for j in pending if j.started]
                wait = (min(started) + self.timeout_s - now) if started else self.timeout_s
                self._changed.wait(timeout=max(wait, 1e-3))
        for job in jobs:
            if job.outcome.status == "error":
                self._warn(job.outcome)
        self._threads = [t for t in self._threads if t.is_alive()]
        return [job.outcome for job in jobs]

    def _warn(self, outcome: Outcome) -> None:
        # The first few failures are logged in full so a broken env is easy to diagnose;
        # after that only the counters (`env/errors`, `env/timeouts`) move.
        if self._logged < 5:
            self._logged += 1
            log.warning("env call %s: %s", outcome.status, outcome.detail)

    def close(self) -> None:
        """Stop the idle workers (a hung one exits when its call returns)."""
        for _ in self._threads:
            self._queue.put(None)
        self._threads = []

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
