"""The learner group of the Ray modes: the same `Trainer` loop, fed by a remote rollout source.

Each `Learner` actor is one learner host. The group is joined by jax.distributed among
themselves (host 0 picks the coordinator address and the driver passes it to every host's
`run`, which joins with it), and then runs `loop.Trainer` exactly as colocated hosts do,
with one difference in the wiring: `LearnerWiring.rollout_source` is a `RemoteSource`, so a
step's rollouts come from the dispatcher's versioned buffer instead of this host's engine
(which only evaluates).

`RemoteSource`:
- `take(step)`: this host's rows of the oldest step, waiting until all its units are in;
  host 0 meanwhile watches the parameter server and restores it if Ray restarted it, and
  every `stall_warning_s` of waiting logs a warning naming the units it waits for and who
  holds them;
- `publish(v)`: every host copies the params whole into its memory (from its own shards, and
  across hosts where an `fsdp` group spans them, one weight at a time, never the whole
  params on a device: `meshes.host_copy`, `perf/phase/reshard`) and keeps the newest K
  versions host-side (numpy, checksummed: they go into the checkpoint and restore a
  restarted parameter server); host 0 pushes version v to the server and tells the
  dispatcher its number and checksum, which opens the gate for step v + k;
- `state` / `begin`: the buffer, the leases and the kept versions, into the checkpoint and
  back; on resume host 0 rewinds the server and the dispatcher to the checkpoint.

A restored parameter server is logged as a warning when it happens, with the versions and
checksums it was restored to and where they came from, and counted in
`perf/sync/ps_restores`.

Metrics (host 0): `sync/version`, and in perf.jsonl `perf/net/weight_sync_push_bytes` and,
as wall-clock figures, `perf/sync/seconds`, `perf/sync/ps_restores` and the dispatcher's
`DispatchStats`. The record's stats add the staleness histogram, the workers' logprob check
and phases (`train/record.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import jax
import numpy as np
import ray

from locojax import distributed
from locojax.distributed import HostInfo
from locojax.fleet.actors import free_port, setup_process
from locojax.fleet.dispatcher import DispatchStats
from locojax.fleet.faults import Faults, kill_self
from locojax.fleet.parameter_server import TRANSIENT, ObjectStoreTransport
from locojax.fleet.placement import PlacementPlan
from locojax.fleet.versions import VersionStore, nbytes, verify
from locojax.train import meshes
from locojax.train.meshes import TrainConfig
from locojax.train.record import RolloutRecord
from locojax.train.wiring import Colocated

log = logging.getLogger(__name__)

POLL_S = 1.0
"""How often a waiting learner host 0 checks that the parameter server is still the one it
published to."""


@dataclasses.dataclass(frozen=True)
class Handles:
    """The actors a learner talks to."""

    dispatcher: object
    server: object


class RemoteSource:
    """`source.RolloutSource` of a learner host in the Ray modes."""

    def __init__(self, handles: Handles, plan: PlacementPlan, run_dir: str, faults: Faults):
        self.dispatcher, self.server = handles.dispatcher, handles.server
        self.plan, self.run_dir, self.faults = plan, run_dir, faults
        self.host, self.num_hosts = jax.process_index(), jax.process_count()
        self.is_main = self.host == 0
        self.kept = VersionStore(plan.schedule.versions_kept)
        self.transport = ObjectStoreTransport(self.server)
        self._incarnation: str | None = None
        self._queue: DispatchStats | None = None  # host 0: the figures of the step taken
        self.ps_restores = 0  # times host 0 found the parameter server restarted and empty

    # --- begin / checkpoint -----------------------------------------------------------------

    def begin(self, step: int, params, saved) -> None:
        arrays, state = saved if saved and saved[1] else ({}, {})
        tree = self._whole(params)
        if state:
            for v, digest in sorted((int(v), d) for v, d in state["versions"].items()):
                kept = jax.tree.map(np.asarray, arrays["versions"][f"v{v}"])
                verify(kept, v, v, digest)
                self.kept.add(v, kept, digest)
            # The restored params must be the newest kept version, bit for bit.
            verify(tree, step, self.kept.newest(), self.kept.get(self.kept.newest())[1])
        else:
            self.kept.add(step, tree)
        if self.is_main:
            self._restore_ps(f"the checkpoint of step {step}" if state
                             else "the starting weights")
            ray.get(self.dispatcher.begin.remote(step, state or None, arrays.get("buffer")))
            for v in self.kept.versions():  # oldest first: the newest opens the gate last
                ray.get(self.dispatcher.published.remote(v, self.kept.get(v)[1]))

    def state(self, next_step: int) -> tuple[dict, dict]:
        arrays, state = ray.get(self.dispatcher.snapshot.remote(next_step))
        versions = {f"v{v}": self.kept.get(v)[0] for v in self.kept.versions()}
        state = dict(state, versions={str(v): self.kept.get(v)[1] for v in self.kept.versions()})
        out = {"versions": versions}
        if arrays:
            out["buffer"] = arrays
        return out, state

    # --- the step ---------------------------------------------------------------------------

    def take(self, step: int, params, timer) -> RolloutRecord:
        with timer.phase("wait_rollouts"):
            started, warned = time.monotonic(), 0
            while True:
                out = ray.get(self.dispatcher.take.remote(step, self.host, self.num_hosts,
                                                          POLL_S))
                if out is not None:
                    break
                if self.is_main:
                    self._check_ps()
                    waited = time.monotonic() - started
                    if waited >= (warned + 1) * self.plan.stall_warning_s:
                        warned += 1
                        log.warning("waited %.0f s for the rollouts of step %d: %s", waited,
                                    step, ray.get(self.dispatcher.waiting_for.remote(step)))
        record, self._queue = out
        return record

    def publish(self, version: int, params, timer) -> dict[str, float]:
        faults, step = self.faults, version - 1
        if faults.kill_learner_after == step and self.is_main \
                and faults.fire(self.run_dir, "kill_learner"):
            kill_self(f"learner host 0 after the update of step {step}")
        with timer.phase("reshard"):  # the training layout -> the whole params, host-side
            tree = self._whole(params)
        with timer.phase("weight_sync"):
            digest = self.kept.add(version, tree)
            if not self.is_main:
                return {}
            t = time.perf_counter()
            try:
                self.transport.push(version, tree, digest)
            except TRANSIENT:  # the server died: restore it with every kept version
                self._restore_ps("learner host 0's kept copies (it was down for a push)")
            seconds = time.perf_counter() - t
            announced = self.dispatcher.published.remote(version, digest)
        if faults.kill_learner_after_publish == step \
                and faults.fire(self.run_dir, "kill_learner_after_publish"):
            ray.get(announced)  # the dispatcher leases with it before this host dies
            kill_self(f"learner host 0 after publishing version {version}, before its "
                      "checkpoint")
        queue = self._queue.metrics() if self._queue is not None else {}
        return {**queue, "sync/version": float(version),
                "perf/net/weight_sync_push_bytes": float(nbytes(tree)),
                "perf/sync/seconds": seconds, "perf/sync/ps_restores": float(self.ps_restores)}

    def close(self) -> None:
        pass

    def _whole(self, params):
        """A version as workers take it: the whole params, as numpy on every host, copied
        from this host's shards (`meshes.host_copy`: sharded over an `fsdp` group that spans
        hosts, each leaf in turn crosses hosts first, in a collective every learner host
        joins at the same point of the step; never the whole params on a device)."""
        return meshes.host_copy(params)

    # --- the parameter server ---------------------------------------------------------------

    def _check_ps(self) -> None:
        try:
            now = ray.get(self.server.incarnation.remote(), timeout=POLL_S * 5)
        except TRANSIENT:
            return  # down or restarting: check again at the next poll
        if now != self._incarnation:
            self._restore_ps("learner host 0's kept copies (the server was restarted)")

    def _restore_ps(self, source: str, attempts: int = 120) -> None:
        """Make the server hold exactly the kept versions (after a restart, or a rewind),
        and say so: `source` is where the versions come from."""
        versions = [(v, *self.kept.get(v)) for v in self.kept.versions()]
        before = self._incarnation
        for i in range(attempts):
            try:
                ray.get(self.server.reset.remote(versions), timeout=120)
                self._incarnation = ray.get(self.server.incarnation.remote(), timeout=30)
                break
            except TRANSIENT:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"the parameter server did not come back after {attempts} tries")
        held = ", ".join(f"{v} ({digest})" for v, _, digest in versions)
        if before is None:  # the run's (or the restarted group's) first: expected
            log.info("parameter server holds version(s) %s, from %s", held, source)
        elif before != self._incarnation:
            self.ps_restores += 1
            log.warning("parameter server restarted (incarnation %s -> %s): restored "
                        "version(s) %s from %s", before[:8], self._incarnation[:8], held, source)


class LearnerWiring(Colocated):
    """Colocated's learner half over the learner hosts; rollouts from the remote workers."""

    name = "learner"
    remote_rollouts = True  # this host's engine only evaluates; batches carry staleness

    def __init__(self, host: HostInfo, handles: Handles, plan: PlacementPlan, run_dir: str,
                 faults: Faults, train: TrainConfig | None = None, tp: int = 1):
        super().__init__(host, train, tp)
        self.handles, self.plan, self.run_dir, self.faults = handles, plan, run_dir, faults

    def rollout_source(self, producer) -> RemoteSource:
        return RemoteSource(self.handles, self.plan, self.run_dir, self.faults)


class GroupHost:
    """One host of a jax.distributed group that Ray placed: the learner group of DA and
    async, the hosts of the controller mode. Host 0 picks the coordinator address; every
    host joins with it, then runs the `Trainer` loop on the wiring its role makes."""

    role = "host"

    def __init__(self, index: int, count: int):
        setup_process()
        self.index, self.count = index, count

    def __repr__(self) -> str:
        return f"{self.role} {self.index}"

    def address(self) -> str:
        """A coordinator address for the group (called on host 0)."""
        return f"{ray.util.get_node_ip_address()}:{free_port()}"

    def pid(self) -> int:
        return os.getpid()

    def _run(self, cfg, coordinator: str, devices_per_host: int, make_wiring) -> dict:
        from locojax.train.loop import start

        host = distributed.initialize(devices_per_host=devices_per_host,
                                      coordinator=coordinator, num_processes=self.count,
                                      process_id=self.index)
        cfg = dataclasses.replace(cfg, devices_per_host=devices_per_host,
                                  progress=cfg.progress and self.index == 0)
        return start(cfg, make_wiring(host, cfg)).run()


@ray.remote
class Learner(GroupHost):
    """One learner host of DA or async: rollouts come from the dispatcher's buffer."""

    role = "learner"

    def run(self, cfg, coordinator: str, handles: Handles, plan: PlacementPlan,
            faults: Faults) -> dict:
        def wiring(host, cfg):
            return LearnerWiring(host, handles, plan, cfg.run_dir, faults, cfg.train,
                                 cfg.rollout.tp)

        return self._run(cfg, coordinator, plan.devices_per_host, wiring)
