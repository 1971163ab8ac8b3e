"""Device work on a step's rows that needs no reward, dispatched before the rows are scored.

In the lock-step modes (single, colocated) a step's rows are generated, scored on the host
(detokenize and rewards), then trained on. While the host scores, the chip waits, unless it
has been given work that does not need the rewards. The reference policy's logprobs (β > 0)
are such work: they read the rows' tokens, never their advantages. So `EarlyReference`
takes the step's train rows from the producer before they are scored (`Producer.early`,
advantages 0), cuts and places them exactly as the step will (`buckets.fit`,
`global_batch`), and dispatches `train_step.with_reference` on them without waiting for
it (JAX's async dispatch); the step waits for them after the scoring (`wait`, a `reference`
phase, where the chip's time on them that the scoring did not hide shows), finds them in its
batch (`attach`), and the update's own `with_reference` has nothing left to do. The same program
on the same arrays: the logprobs, and so the params, are bitwise those computed in the
update (tests/test_host_overlap.py).

The timer is told (`StepTimer.device_busy`), so a step reports how much of its host time
the chip spent on this work (`perf/host_hidden`) and how much it waited (`perf/host_exposed`;
`profiler.py`).

Not moved yet (issue 56): π_old's forward (μ > 1), which is traced inside the fused train
step, and scoring the rows that finish while others still decode (the engine's compaction
waves would allow it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from locojax.profiler import StepTimer
from locojax.rl import buckets
from locojax.rl import train_step as ts
from locojax.rl.batch import TrainBatch


class EarlyReference:
    """The reference forward of one step's rows, in flight while the host scores them.

    `reference()` gives the reference weights at the time of the dispatch (the loop's
    `reference_of`); `parts` and `wiring` are the run's, whose learner config, model and
    layout the update uses."""

    def __init__(self, reference: Callable[[], Any], parts, wiring):
        self.reference, self.parts, self.wiring = reference, parts, wiring
        self._ref = None  # the dispatched [B, T] reference logprobs, until `attach`

    def dispatch(self, local: TrainBatch, timer: StepTimer) -> None:
        """Given this host's train rows before scoring (advantages 0): place them as the
        step will, and dispatch their reference logprobs without waiting."""
        local, _ = buckets.fit(local, self.wiring.gather_over_hosts)
        batch = self.wiring.global_batch(local)
        batch = ts.with_reference(batch, self.reference(), self.parts.model_cfg,
                                  self.parts.learner, self.wiring.train_mesh)
        self._ref = batch.ref_logprobs
        timer.device_busy(self._ref)

    def wait(self, timer: StepTimer) -> None:
        """Wait for the dispatched forward, if any, in a phase of its own (`reference`), once
        the rows are scored and before the producer's `batch` phase: else that host phase
        would hold the wait (its advantages are jnp ops, queued behind the forward on the
        device) and report it as host work."""
        if self._ref is not None:
            with timer.phase("reference") as ph:
                ph.sync(self._ref)

    def attach(self, batch: TrainBatch) -> TrainBatch:
        """The step's `batch` with the reference logprobs dispatched for it, if any (a step
        with refill rounds dispatches none: `Producer._generate`)."""
        ref, self._ref = self._ref, None
        if ref is None:
            return batch
        if ref.shape != batch.old_logprobs.shape:  # not this batch's rows: a wiring bug
            raise RuntimeError(f"early reference logprobs {ref.shape} do not fit the step's "
                               f"batch {batch.old_logprobs.shape}")
        return dataclasses.replace(batch, ref_logprobs=ref)
