"""The learner group of the Ray modes: the same `Trainer` loop, fed by a remote rollout source.

Each `Learner` actor is one learner host. The group is joined by jax.distributed among
themselves (host 0 picks the coordinator address and the driver passes it to every host's
`run`, which joins with it), and then runs `loop.Trainer` exactly as colocated hosts do,
with one difference in the wiring: `LearnerWiring.rollout_source` is a `RemoteSource`, so a
step's rollouts come from the dispatcher's versioned buffer instead of this host's engine
(which only evaluates).

`RemoteSource`:
- `take(step)`: this host's rows of the oldest step, waiting until all its units are in;
  host 0 meanwhile watches the parameter server and restores it if Ray restarted it;
- `publish(v)`: every host keeps the newest K versions host-side (numpy, checksummed: they
  go into the checkpoint and restore a restarted parameter server); host 0 pushes version
  v to the server and tells the dispatcher, which opens the gate for step v + k;
- `state` / `begin`: the buffer, the leases and the kept versions, into the checkpoint and
  back; on resume host 0 rewinds the server and the dispatcher to the checkpoint.

Metrics (host 0): `sync/bytes`, `sync/version`, and, as wall-clock figures in perf.jsonl,
`perf/sync/seconds` and the dispatcher's `DispatchStats`. The record's stats add the
staleness histogram, the workers' logprob check and phases (`train/record.py`).
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
from locojax.fleet.actors import free_port, setup_logging
from locojax.fleet.dispatcher import DispatchStats
from locojax.fleet.faults import Faults, kill_self
from locojax.fleet.parameter_server import TRANSIENT, ObjectStoreTransport
from locojax.fleet.placement import PlacementPlan
from locojax.fleet.versions import VersionStore, nbytes, verify
from locojax.model import loader
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

    # --- begin / checkpoint -----------------------------------------------------------------

    def begin(self, step: int, params, saved) -> None:
        arrays, state = saved if saved and saved[1] else ({}, {})
        tree = loader.host_local(params)
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
            self._restore_ps()
            ray.get(self.dispatcher.begin.remote(step, state or None, arrays.get("buffer")))
            ray.get(self.dispatcher.published.remote(self.kept.newest()))

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
            while True:
                out = ray.get(self.dispatcher.take.remote(step, self.host, self.num_hosts,
                                                          POLL_S))
                if out is not None:
                    break
                if self.is_main:
                    self._check_ps()
        record, self._queue = out
        return record

    def publish(self, version: int, params, timer) -> dict[str, float]:
        if self.faults.kill_learner_after == version - 1 and self.is_main \
                and self.faults.fire(self.run_dir, "kill_learner"):
            kill_self(f"learner host 0 after the update of step {version - 1}")
        with timer.phase("weight_sync"):
            tree = loader.host_local(params)
            digest = self.kept.add(version, tree)
            if not self.is_main:
                return {}
            t = time.perf_counter()
            try:
                self.transport.push(version, tree, digest)
            except TRANSIENT:  # the server died: restore it with every kept version
                self._restore_ps()
            seconds = time.perf_counter() - t
            self.dispatcher.published.remote(version)
        queue = self._queue.metrics() if self._queue is not None else {}
        return {**queue, "sync/version": float(version), "sync/bytes": float(nbytes(tree)),
                "perf/sync/seconds": seconds}

    def close(self) -> None:
        pass

    # --- the parameter server ---------------------------------------------------------------

    def _check_ps(self) -> None:
        try:
            now = ray.get(self.server.incarnation.remote(), timeout=POLL_S * 5)
        except TRANSIENT:
            return  # down or restarting: check again at the next poll
        if now != self._incarnation:
            log.warning("parameter server restarted: restoring versions %s",
                        self.kept.versions())
            self._restore_ps()

    def _restore_ps(self, attempts: int = 120) -> None:
        """Make the server hold exactly the kept versions (after a restart, or a rewind)."""
        versions = [(v, *self.kept.get(v)) for v in self.kept.versions()]
        for i in range(attempts):
            try:
                ray.get(self.server.reset.remote(versions), timeout=120)
                self._incarnation = ray.get(self.server.incarnation.remote(), timeout=30)
                return
            except TRANSIENT:
                time.sleep(0.5)
        raise RuntimeError(f"the parameter server did not come back after {attempts} tries")


class LearnerWiring(Colocated):
    """Colocated's learner half over the learner hosts; rollouts from the remote workers."""

    name = "learner"
    remote_rollouts = True  # this host's engine only evaluates; batches carry staleness

    def __init__(self, host: HostInfo, handles: Handles, plan: PlacementPlan, run_dir: str,
                 faults: Faults):
        super().__init__(host)
        self.handles, self.plan, self.run_dir, self.faults = handles, plan, run_dir, faults

    def rollout_source(self, producer) -> RemoteSource:
        return RemoteSource(self.handles, self.plan, self.run_dir, self.faults)


class GroupHost:
    """One host of a jax.distributed group that Ray placed: the learner group of DA and
    async, the hosts of the controller mode. Host 0 picks the coordinator address; every
    host joins with it, then runs the `Trainer` loop on the wiring its role makes."""

    role = "host"

    def __init__(self, index: int, count: int):
        setup_logging()
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
            return LearnerWiring(host, handles, plan, cfg.run_dir, faults)

        return self._run(cfg, coordinator, plan.devices_per_host, wiring)
