"""A discrete-event simulation of the buffered modes (disaggregated, async): leases, versions,
length tails, pacing and, on one shared machine, processor sharing.

The system (docs/design.md "Asynchrony"; locojax/fleet): W rollout workers take leases, each
the generation of `per_lease` prompts of a step s; the learner trains step s once every
lease of s is back, then publishes version s + 1 (a weight push). A lease of step s starts
once, disaggregated, version max(0, s - k) is published, and uses it; async, once some
version >= s - k is, and uses the newest. A sample's staleness is s - v (0 <= s - v <= k).
A worker runs one lease at a time, in step order, each drawn per lease (the length tail).

Processor sharing: with `shared_cores` > 0 (hosts are processes on one machine), the n busy
processes split the cores, each task progressing at its `Task.seconds(cores / n)`; else
every task runs on its own host. Outputs: each step's time, the learner's wait, every
lease's staleness; closed forms it must agree with: tests/test_predict_simulate.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np


@dataclasses.dataclass
class Task:
    """Work that takes `seconds(cores)` when it has `cores` cores per process to itself, run by
    `procs` processes at once (a learner group of L hosts is one task of L processes), and
    then `then`, if any (a lease's env turns, run by its env processes)."""

    seconds: Callable[[float], float]
    procs: float = 1
    then: Task | None = None

    @classmethod
    def fixed(cls, s: float, procs: int = 1) -> "Task":
        return cls(lambda _c, s=s: s, procs)


@dataclasses.dataclass
class Spec:
    """One buffered-mode run to simulate."""

    steps: int
    leases_per_step: int
    workers: int
    max_staleness: int  # k
    newest: bool  # async: newest version; disaggregated: the deterministic max(0, s - k)
    lease: Callable[[np.random.Generator], Task]  # one lease's work (drawn per lease)
    train: Callable[[np.random.Generator], Task]  # one update of the learner group
    sync: Callable[[np.random.Generator], Task]  # publishing a version (weight push)
    shared_cores: float = 0.0
    seed: int = 0


@dataclasses.dataclass
class Result:
    step_end: np.ndarray  # [steps] time each update (and its publish) finished
    wait: np.ndarray  # [steps] learner idle time before each update
    staleness: np.ndarray  # [leases] s - v of every lease
    train_s: np.ndarray  # [steps] wall time of each update, contention included

    def step_times(self, skip: int = 0) -> np.ndarray:
        ends = np.concatenate([[0.0], self.step_end])
        return np.diff(ends)[skip:]

    def staleness_hist(self, k: int) -> list[float]:
        counts = np.bincount(self.staleness.astype(int), minlength=k + 1)[:k + 1]
        return list(counts / max(1, counts.sum()))


class _Running:
    __slots__ = ("task", "left", "done", "_cores", "_rate")

    def __init__(self, task: Task, done):
        self.task, self.left, self.done = task, 1.0, done
        self._cores, self._rate = None, 0.0

    def rate(self, cores: float) -> float:
        """Share of the task done per second at `cores` per process; a task's time depends
        on its cores only, so it is recomputed only when they change (never, where hosts
        do not share a machine: thousands of events for tens of tasks)."""
        if cores != self._cores:
            self._cores, self._rate = cores, 1.0 / max(self.task.seconds(cores), 1e-12)
        return self._rate


def run(spec: Spec) -> Result:
    rng = np.random.default_rng(spec.seed)
    k, m = spec.max_staleness, spec.leases_per_step
    published = 0  # newest version available to workers
    queue = [(s, j) for s in range(spec.steps) for j in range(m)]  # leases in step order
    next_lease = 0
    free_workers = spec.workers
    returned = np.zeros(spec.steps, int)
    staleness: list[int] = []
    learner = {"step": 0, "busy": False, "idle_since": 0.0}
    step_end, waits, train_s = [], [], []
    running: list[_Running] = []
    now = 0.0

    def needed(s: int) -> int:
        return max(0, s - k)

    def lease_done(s: int, v: int):
        nonlocal free_workers
        free_workers += 1
        returned[s] += 1
        staleness.append(s - v)

    def start_leases():
        nonlocal next_lease, free_workers
        while free_workers and next_lease < len(queue):
            s, _ = queue[next_lease]
            if published < needed(s):
                return
            v = published if spec.newest else needed(s)
            free_workers -= 1
            next_lease += 1
            running.append(_Running(spec.lease(rng), lambda s=s, v=v: lease_done(s, v)))

    def start_learner():
        s = learner["step"]
        if learner["busy"] or s >= spec.steps or returned[s] < m:
            return
        learner["busy"] = True
        waits.append(now - learner["idle_since"])
        t0 = now

        def published_done():
            nonlocal published
            published = s + 1
            learner.update(step=s + 1, busy=False, idle_since=now)
            step_end.append(now)

        def trained():
            train_s.append(now - t0)
            running.append(_Running(spec.sync(rng), published_done))

        running.append(_Running(spec.train(rng), trained))

    while True:
        start_leases()
        start_learner()
        if not running:
            break
        procs = sum(r.task.procs for r in running)
        cores = spec.shared_cores / procs if spec.shared_cores else 0.0
        rates = [r.rate(cores) for r in running]
        dt = min(r.left / rate for r, rate in zip(running, rates))
        now += dt
        finished = []
        for r, rate in zip(running, rates):
            r.left -= dt * rate
            if r.left <= 1e-9:
                finished.append(r)
        for r in finished:
            running.remove(r)
            if r.task.then is not None:
                running.append(_Running(r.task.then, r.done))
            else:
                r.done()
    if len(step_end) < spec.steps:
        raise RuntimeError(f"simulation stalled after {len(step_end)} of {spec.steps} steps")
    return Result(np.asarray(step_end), np.asarray(waits), np.asarray(staleness),
                  np.asarray(train_s))
