"""A host of `--mode controller`: colocated's train step, the controller's data path.

Each `ControllerHost` joins the hosts' jax.distributed group and runs the `Trainer` loop
exactly as a colocated host does (same mesh, same train step, same all-reduce), with one
difference in the wiring: its rollout source is a `ControllerSource`. Between steps the
loop waits in `take`; meanwhile the controller (`controller.py`) asks the host, through
`generate`, to generate rows on its devices with the params the loop is waiting with, and
then hands it the step's shard of the training batch through `put`. A host holds no data
path of its own: no admission, no tokenizer call, no reward.

The actor serves those calls on threads beside the loop's (`max_concurrency`): `generate`
for step s waits until the loop is in `take(s)`, so rows are always generated with the
params after step s - 1, never while the loop trains. The step's admission state (the
curator's, kept by the controller) comes with its shard and goes into the host's
checkpoint; on resume, host 0 hands it back to the controller (`resume_point`).
"""

from __future__ import annotations

import dataclasses
import threading

import jax
import numpy as np
import ray

from locojax.engine.engine import Decoding
from locojax.engine.extend import Conversation, TurnOutput
from locojax.engine.sampling import SamplingConfig
from locojax.fleet.faults import Faults, kill_self
from locojax.fleet.learner import GroupHost
from locojax.train.meshes import TrainConfig
from locojax.train.record import RolloutRecord
from locojax.train.wiring import Colocated

POLL_S = 1.0
"""How often a waiting call checks whether the run has ended."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """What the controller sends a host for one step."""

    record: RolloutRecord  # this host's rows (and, on host 0, the step's stats)
    admission: dict  # the controller's admission state after the step (JSON)
    metrics: dict[str, float]  # host 0: the controller's (curation/*, perf/controller/*)


class ControllerSource:
    """`source.RolloutSource` of a controller host: shards arrive through `put`."""

    def __init__(self, producer, wiring):
        self.engine, self.wiring = producer.engine, wiring
        self.faults: Faults = wiring.faults
        self.cv = threading.Condition()
        self.waiting: int | None = None  # the step `take` waits for
        self.weights = None  # the params `take` waits with, in the engine's layout
        self.shards: dict[int, Shard] = {}
        self.admission: dict = {}
        self.saved: tuple | None = None  # (start step, checkpointed JSON) once `begin` ran
        self.finished = False
        self.conversation: Conversation | None = None  # the controller's multi-turn rows
        self.decoding: Decoding | None = None  # a generate that the controller goes on with
        self._metrics: dict[str, float] = {}

    # --- the loop's side ----------------------------------------------------------------------

    def begin(self, step: int, params, saved) -> None:
        with self.cv:
            self.saved = (step, saved[1] if saved else {})
            self.admission = self.saved[1].get("curation", {})
            self.cv.notify_all()

    def take(self, step: int, params, timer) -> RolloutRecord:
        # On the loop's thread, as colocated's `InlineSource.take`: the reshard's cross-host
        # part is one program every host joins at this point of the step.
        with timer.phase("reshard") as ph:  # training layout -> rollout layout (meshes.py)
            weights = self.wiring.rollout_weights(params, self.engine.weight_shardings)
            ph.sync(weights)
        at = self.faults.stale_sampler_at_step  # the sampler keeps version 0's weights
        if at is not None:  # (a host copy: the update donates what the reshard may alias)
            self._first = jax.tree.map(np.array, weights) if step == 0 else self._first
            if step >= at:
                weights = jax.tree.map(lambda h, w: jax.device_put(h, w.sharding),
                                       self._first, weights)
        with timer.phase("wait_controller"), self.cv:
            self.weights, self.waiting = weights, step
            self.cv.notify_all()
            while step not in self.shards:
                self.cv.wait()
            shard = self.shards.pop(step)
            self.waiting = self.weights = None
        self.admission, self._metrics = shard.admission, shard.metrics
        return shard.record

    def publish(self, version: int, params, timer) -> dict[str, float]:
        host, hosts = self.wiring.host.process_id, self.wiring.host.num_processes
        if self.faults.kill_host_after == version - 1 and host == min(1, hosts - 1) \
                and self.faults.fire(self.wiring.run_dir, "kill_host"):
            kill_self(f"controller host {host} after the update of step {version - 1}")
        return self._metrics  # the params stay here: the next take reads them

    def state(self, next_step: int) -> tuple[dict, dict]:
        return {}, {"curation": self.admission}

    def close(self) -> None:
        with self.cv:
            self.finished = True
            self.cv.notify_all()

    # --- the controller's side ----------------------------------------------------------------

    def _wait(self, ready) -> None:
        while not ready():
            if self.finished:
                raise RuntimeError("the host's run has ended")
            self.cv.wait(POLL_S)

    def _weights(self, step: int):
        """The params the loop waits with in `take(step)`, placed for the engine."""
        with self.cv:
            self._wait(lambda: self.waiting == step)
            return self.weights

    def generate(self, step: int, prompt_tokens, prompt_mask, key_data, first_row: int,
                 sampling: SamplingConfig, num_samples: int, chunk: int = 0):
        """This host's rows: prefill, then the whole decode loop (chunk 0) or its first
        `chunk` iterations (`generate_more` goes on, the rows and cache staying here)."""
        weights = self._weights(step)
        key = jax.random.wrap_key_data(np.asarray(key_data, np.uint32))
        pending = self.engine.prefill(weights, prompt_tokens, key, sampling, num_samples,
                                      prompt_mask=prompt_mask, first_row=first_row)
        self.decoding = Decoding(self.engine, pending)
        return self.generate_more(chunk)

    def generate_more(self, chunk: int) -> tuple[np.ndarray, ...] | None:
        """Up to `chunk` more decode iterations (0: to the end); the rows' (tokens, mask,
        logprobs, decode iterations) once every row has stopped, else None."""
        if not self.decoding.advance(chunk or None):
            return None
        gen, self.decoding = self.decoding.result(), None
        return tuple(np.asarray(x) for x in (gen.tokens, gen.mask, gen.logprobs, gen.steps))

    def conversation_begin(self, step: int, conversation: dict, prompt_tokens, prompt_mask,
                           key_data, num_samples: int, first_row: int, limits, active) -> None:
        """Multi-turn: turn 1 of this host's rows (`Conversation.begin`), run to completion."""
        weights = self._weights(step)
        self.conversation = Conversation(self.engine, **conversation)
        self.conversation.begin(weights, prompt_tokens, prompt_mask,
                                jax.random.wrap_key_data(np.asarray(key_data, np.uint32)),
                                num_samples, first_row, limits, active)
        jax.block_until_ready(self.conversation.pending)

    def conversation_extend(self, rows, keep, appended, limits) -> None:
        self.conversation.extend(rows, keep, appended, limits)
        jax.block_until_ready(self.conversation.pending)

    def conversation_decode(self) -> TurnOutput:
        return self.conversation.decode()

    def conversation_close(self) -> None:
        if self.conversation is not None:
            self.conversation.close()
            self.conversation = None

    def put(self, step: int, shard: Shard) -> None:
        with self.cv:
            self.shards[step] = shard
            self.cv.notify_all()

    def resume_point(self) -> tuple[int, dict]:
        with self.cv:
            self._wait(lambda: self.saved is not None)
            return self.saved


class ControllerWiring(Colocated):
    """Colocated's train half; rows come from the controller."""

    name = "controller"
    remote_rollouts = False  # this host's engine generates the controller's rows

    def __init__(self, host, source_box: dict, run_dir: str, faults: Faults,
                 train: TrainConfig | None = None, tp: int = 1):
        super().__init__(host, train, tp)
        self.box, self.run_dir, self.faults = source_box, run_dir, faults

    def rollout_source(self, producer) -> ControllerSource:
        source = ControllerSource(producer, self)
        with self.box["cv"]:
            self.box["source"] = source
            self.box["cv"].notify_all()
        return source


@ray.remote(max_concurrency=4)
class ControllerHost(GroupHost):
    """One host of the controller mode: the `Trainer` loop, and the controller's calls."""

    role = "host"

    def __init__(self, index: int, count: int):
        super().__init__(index, count)
        self.box = {"cv": threading.Condition(), "source": None, "ended": False}

    def run(self, cfg, coordinator: str, devices_per_host: int, faults: Faults) -> dict:
        def wiring(host, cfg):
            return ControllerWiring(host, self.box, cfg.run_dir, faults, cfg.train,
                                    cfg.rollout.tp)

        try:
            return self._run(cfg, coordinator, devices_per_host, wiring)
        finally:
            with self.box["cv"]:
                self.box["ended"] = True
                self.box["cv"].notify_all()
            if self.box["source"] is not None:
                self.box["source"].close()

    def _source(self) -> ControllerSource:
        """The loop's rollout source, once the `Trainer` has been built (after planning)."""
        with self.box["cv"]:
            while self.box["source"] is None:
                if self.box["ended"]:
                    raise RuntimeError(f"{self!r}: the run ended before its trainer started")
                self.box["cv"].wait(POLL_S)
            return self.box["source"]

    def generate(self, step: int, *args) -> tuple[np.ndarray, ...] | None:
        return self._source().generate(step, *args)

    def generate_more(self, chunk: int) -> tuple[np.ndarray, ...] | None:
        return self._source().generate_more(chunk)

    def conversation(self, method: str, *args):
        """Multi-turn: `ControllerSource.conversation_<method>` (begin, extend, decode, close)
        of this host's rows."""
        return getattr(self._source(), f"conversation_{method}")(*args)

    def put(self, step: int, record: RolloutRecord, admission: dict,
            metrics: dict[str, float]) -> None:
        self._source().put(step, Shard(record, admission, metrics))

    def resume_point(self) -> tuple[int, dict]:
        return self._source().resume_point()
