"""The reward/verifier pool of the Ray modes (RLAX's verifier pool).

A rollout worker's producer is handed a `VerifierPool` in place of a local `RewardRunner`:
the pool splits each batch over the `Verifier` actors, each of which guards its calls with
its own `RewardRunner` (per-call timeouts, errors, process isolation). Scoring is
idempotent, so a call can be made again anywhere.

Every verifier call has a deadline (`PlacementPlan.verifier_timeout_s`), because the
verifier itself can get stuck where its runner cannot help: a reward run in a thread that
hangs holding the GIL (catastrophic regex backtracking, a huge integer power in sympy)
stops the whole actor, runner included. Past the deadline the pool kills the verifier (Ray
restarts it) and makes the call again on the next verifier; a call that dies with its
verifier is made again the same way. After `attempts` tries the call raises, which fails the
worker's lease (counted against the unit's attempts). The actors are made with
`max_task_retries=0` so that Ray never replays a call on the restarted verifier by itself:
retries are the pool's, and bounded.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import ray

from locojax.envs.base import CombinedReward
from locojax.envs.rewards import RewardConfig, RewardRunner, Scores
from locojax.fleet.actors import setup_process
from locojax.fleet.faults import Faults, hang_holding_the_gil

log = logging.getLogger(__name__)

_DEAD = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


@ray.remote
class Verifier:
    """Scores completions with its own guarded `RewardRunner`."""

    def __init__(self, index: int, config: RewardConfig, run_dir: str = "",
                 faults: Faults = Faults()):
        setup_process()
        self.index, self.runner = index, RewardRunner(config)
        self.run_dir, self.faults, self.calls = run_dir, faults, 0

    def __repr__(self) -> str:
        return f"verifier {self.index}"

    def score(self, fn, completions: list[str], examples: list) -> tuple[Scores, dict]:
        self.calls += 1
        after = self.faults.hang_verifier_after_calls
        if after is not None and self.calls > after and self.faults.fire(self.run_dir,
                                                                          "hang_verifier"):
            hang_holding_the_gil(f"verifier {self.index}")
        scores = self.runner.score_batch(fn, completions, examples)
        return scores, self.runner.metrics()


def scoring_bound_s(rows: int, parts: int, reward: RewardConfig) -> float:
    """The longest one `RewardRunner` may take to score `rows` rows with `parts` reward
    functions when every call runs to its deadline: `reward.workers` rows at a time, each
    part in turn, `reward.timeout_s` each. Slow but legal: such rows score 0 (timeouts)."""
    return math.ceil(rows / max(1, reward.workers)) * parts * reward.timeout_s


class VerifierPool:
    """The `RewardRunner` interface the producer uses, served by `Verifier` actors.

    A call's deadline is `timeout_s` (`--verifier-timeout-s`: the verifier's own overhead,
    and how long a stuck one goes unnoticed) plus `scoring_bound_s` of its rows: a fixed
    deadline per call stopped a run on a unit of slow-but-legal rewards, which single mode
    scores 0 (issue 38)."""

    def __init__(self, verifiers: list, timeout_s: float = 150.0, attempts: int = 3,
                 reward: RewardConfig = RewardConfig()):
        self.verifiers, self.timeout_s, self.attempts = verifiers, timeout_s, attempts
        self.reward = reward
        self._counts: dict[str, float] = {}
        self.restarts = 0  # verifiers this pool killed for missing a deadline

    def lease_extra_s(self, fn, rows: int) -> float:
        """What a lease of `rows` rows needs beyond `--lease-timeout-s`: its largest chunk's
        scoring bound (the verifiers score their chunks at once), so the lease outlasts the
        verifier calls it waits on, as `--verifier-timeout-s < --lease-timeout-s` meant."""
        chunk = math.ceil(rows / max(1, len(self.verifiers)))
        return self.deadline_s(fn, chunk) - self.timeout_s

    def deadline_s(self, fn, rows: int) -> float:
        """The deadline of one call scoring `rows` rows with `fn`."""
        parts = len(fn.parts) if isinstance(fn, CombinedReward) else 1
        return self.timeout_s + scoring_bound_s(rows, parts, self.reward)

    def score_batch(self, fn, completions, examples) -> Scores:
        n = len(completions)
        bounds = np.linspace(0, n, min(len(self.verifiers), max(n, 1)) + 1).astype(int)
        chunks = [(list(completions[a:b]), list(examples[a:b]))
                  for a, b in zip(bounds[:-1], bounds[1:])]
        results = self._call_all(fn, chunks)
        for _, counts in results:
            for k, v in counts.items():
                if not k.endswith("/mean"):  # part means are recomputed from the rows
                    self._counts[k] = self._counts.get(k, 0.0) + v
        parts = {k: np.concatenate([s.parts[k] for s, _ in results]) for k in results[0][0].parts}
        return Scores(np.concatenate([s.total for s, _ in results]), parts)

    def _call_all(self, fn, chunks: list) -> list:
        """One call per chunk (chunk i on verifier i first), each with its deadline; a call
        that misses it or dies with its verifier is made again on the next verifier."""
        results: list = [None] * len(chunks)
        tries = [0] * len(chunks)
        where = list(range(len(chunks)))  # verifier of each chunk's current call
        calls = {}  # ref -> (chunk, deadline)

        def submit(i: int) -> None:
            tries[i] += 1
            ref = self.verifiers[where[i]].score.remote(fn, *chunks[i])
            calls[ref] = (i, time.monotonic() + self.deadline_s(fn, len(chunks[i][0])))

        def again(i: int, why: str) -> None:
            if tries[i] >= self.attempts:
                raise RuntimeError(f"verifier calls on {len(chunks[i][0])} completion(s) failed "
                                   f"{tries[i]} time(s), the last on verifier {where[i]}: {why}")
            where[i] = (where[i] + 1) % len(self.verifiers)
            submit(i)

        for i in range(len(chunks)):
            submit(i)
        while calls:
            soonest = min(deadline for _, deadline in calls.values())
            ready, _ = ray.wait(list(calls), num_returns=1,
                                timeout=max(0.0, soonest - time.monotonic()))
            for ref in ready:
                i, _ = calls.pop(ref)
                try:
                    results[i] = ray.get(ref)
                except _DEAD as e:
                    log.warning("verifier %d died during a call (%s); calling verifier %d",
                                where[i], type(e).__name__, (where[i] + 1) % len(self.verifiers))
                    again(i, f"died ({type(e).__name__})")
            now = time.monotonic()
            for ref, (i, deadline) in list(calls.items()):
                if deadline <= now:
                    del calls[ref]
                    self._kill(where[i])
                    again(i, f"no answer within {self.deadline_s(fn, len(chunks[i][0])):g} s "
                             f"(--verifier-timeout-s {self.timeout_s:g} + its rows' reward "
                             "deadlines)")
        return results

    def _kill(self, index: int) -> None:
        """A verifier that missed its deadline is stuck (it may hold the GIL, so nothing
        inside it can be asked to stop): kill its process; Ray starts a new one."""
        self.restarts += 1
        log.warning("verifier %d missed its deadline: killed, Ray restarts it; the call "
                    "goes to verifier %d", index,
                    (index + 1) % len(self.verifiers))
        ray.kill(self.verifiers[index], no_restart=False)

    def metrics(self, reset: bool = True) -> dict[str, float]:
        out = dict(self._counts)
        if reset:
            self._counts = {}
        return out

    def close(self) -> None:
        pass
