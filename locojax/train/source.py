"""Where a learner step's rollouts come from: the producer → buffer → consumer seam.

`Trainer.step` asks its `RolloutSource` for the step's `RolloutRecord` (this host's rows)
and, after the update, hands it the new weights as the next version. Every mode runs that
same loop; what differs is where the producer runs and how deep the buffer is:

- `InlineSource` (single, colocated): the producer runs right here, on this host's replica
  of the params, when the step asks for it. The buffer has depth 0 and the weights need no
  transport: staleness is 0 by construction. `publish` folds the step's pass counts (every
  host's) into the producer's curator, which admits the next step's prompts.
- `fleet.controller_host.ControllerSource` (controller): the central controller generates
  and scores every host's rows, and each host's shard arrives through `put`; `take` waits
  for this host's.
- `fleet.learner.RemoteSource` (disaggregated, async): rollout workers produce into a
  versioned buffer under a staleness bound k; `take` waits for the oldest step, `publish`
  pushes the new version to the parameter server.

A source's `state` goes into the checkpoint (the admission state; the buffer, the leases,
the versions), and `begin` gets it back on resume, so a resumed run continues exactly.
"""

from __future__ import annotations

from typing import Protocol

from locojax.profiler import StepTimer
from locojax.train.curation import Feedback
from locojax.train.producer import Producer
from locojax.train.record import RolloutRecord


class RolloutSource(Protocol):
    def begin(self, step: int, params, saved: tuple[dict | None, dict] | None) -> None:
        """Before the first step `step`, with the checkpointed (arrays, JSON) if resumed."""

    def take(self, step: int, params, timer: StepTimer) -> RolloutRecord:
        """This host's rows of step `step`; `params` are the learner's, version `step`."""

    def publish(self, version: int, params, timer: StepTimer) -> dict[str, float]:
        """The params after an update, as `version` (the step that made them is done);
        returns its metrics (`sync/*`, `curation/*`)."""

    def state(self, next_step: int) -> tuple[dict, dict]:
        """(numpy arrays, JSON) for the checkpoint taken before step `next_step`."""

    def close(self) -> None:
        ...


class InlineSource:
    """The producer inline, at depth 0: step s is generated with version s, when asked."""

    def __init__(self, producer: Producer, wiring):
        self.producer, self.wiring = producer, wiring
        self._feedback: Feedback | None = None

    def begin(self, step, params, saved) -> None:
        if saved is not None:
            self.producer.curator.load_state(saved[1]["curation"])

    def take(self, step: int, params, timer: StepTimer) -> RolloutRecord:
        start, stop = self.wiring.host_slice(self.producer.prompts_per_step)
        with timer.phase("reshard") as ph:  # training layout -> rollout layout (meshes.py)
            weights = self.wiring.rollout_weights(params, self.producer.engine.weight_shardings)
            ph.sync(weights)
        record, self._feedback = self.producer.produce(step, weights, start, stop, timer)
        self.producer.engine.release_cache()  # the train step runs without it (memory plan)
        return record

    def publish(self, version: int, params, timer: StepTimer) -> dict[str, float]:
        curator, feedback = self.producer.curator, self._feedback
        with timer.phase("admission"):  # every host folds in every host's pass counts
            counts = feedback.observations if not curator.cfg.enabled \
                else self.wiring.gather_over_hosts(feedback.observations)
            return curator.update(feedback.admission, counts)

    def state(self, next_step: int) -> tuple[dict, dict]:
        return {}, {"curation": self.producer.curator.state()}

    def close(self) -> None:
        pass
