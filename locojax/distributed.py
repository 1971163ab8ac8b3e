"""Joining a multi-host run: the one place that calls `jax.distributed.initialize`.

Three ways in, tried in order (each overridden by explicit arguments to `initialize`, which
is how the Ray modes join their learner group):
1. `locojax launch` sets LOCOJAX_COORDINATOR / LOCOJAX_NUM_PROCESSES / LOCOJAX_PROCESS_ID
   (and LOCOJAX_DEVICES_PER_HOST / LOCOJAX_CPUS for simulated CPU hosts) for each local
   process.
2. The usual JAX variables (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID) on a
   hand-rolled cluster.
3. `auto=True` on a real TPU pod / SLURM / Kubernetes cluster: `jax.distributed.initialize()`
   with no arguments auto-detects.

CPU hosts use gloo collectives (the default CPU backend has none across processes).
Everything here must run before anything touches the JAX backend.
"""

from __future__ import annotations

import dataclasses
import os
import socket

ENV_COORDINATOR = "LOCOJAX_COORDINATOR"
ENV_NUM_PROCESSES = "LOCOJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "LOCOJAX_PROCESS_ID"
ENV_DEVICES_PER_HOST = "LOCOJAX_DEVICES_PER_HOST"
ENV_HEARTBEAT = "LOCOJAX_HEARTBEAT_S"
ENV_CPUS = "LOCOJAX_CPUS"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a coordinator of processes on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class HostInfo:
    process_id: int
    num_processes: int

    @property
    def is_multihost(self) -> bool:
        return self.num_processes > 1


def _env_int(name: str, default: int | None = None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from e


def set_cpu_devices(n: int | None) -> None:
    """Simulate `n` devices on this CPU host. Must precede any backend use."""
    import jax

    if n:
        jax.config.update("jax_num_cpu_devices", int(n))


def pin_cpus(spec: str | None) -> None:
    """Restrict this process to the CPUs in `spec` ("0,1"), e.g. one simulated host's share.

    Before the backend starts, so XLA:CPU sizes its thread pools to this share rather than
    to the whole machine (N hosts on one machine would otherwise each run a pool per core).
    """
    if not spec:
        return
    try:
        cpus = {int(c) for c in spec.split(",")}
    except ValueError as e:
        raise ValueError(f"environment variable {ENV_CPUS}={spec!r} is not a CPU list") from e
    os.sched_setaffinity(0, cpus)


def cpu_shares(hosts: int, cpus: list[int]) -> list[str | None]:
    """Per host, a comma-separated CPU list of an equal share, or None when hosts > CPUs."""
    if hosts > len(cpus):
        return [None] * hosts
    share = len(cpus) // hosts
    return [",".join(map(str, cpus[i * share:(i + 1) * share])) for i in range(hosts)]


def placed(env: dict, hosts: int) -> list[dict]:
    """`env` for each of `hosts` local processes, placed as `locojax launch` places its
    hosts by default: each pinned to its share of this process's CPUs (`ENV_CPUS`), or all
    unpinned where they outnumber the CPUs. `predict calibrate`'s probes start theirs so."""
    base = {k: v for k, v in env.items() if k != ENV_CPUS}  # not a surrounding launch's share
    return [{**base, **({ENV_CPUS: share} if share else {})}
            for share in cpu_shares(hosts, sorted(os.sched_getaffinity(0)))]


def initialize(devices_per_host: int | None = None, auto: bool = False,
               coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> HostInfo:
    """Join the run given by the arguments, else the one the environment describes; a single
    process when nothing describes one."""
    import jax

    pin_cpus(os.environ.get(ENV_CPUS))
    set_cpu_devices(_env_int(ENV_DEVICES_PER_HOST, devices_per_host))
    if coordinator is None:
        coordinator = os.environ.get(ENV_COORDINATOR) or os.environ.get("JAX_COORDINATOR_ADDRESS")
        num_processes = _env_int(ENV_NUM_PROCESSES) or _env_int("JAX_NUM_PROCESSES")
        process_id = _env_int(ENV_PROCESS_ID)
        process_id = _env_int("JAX_PROCESS_ID") if process_id is None else process_id
    num, pid = num_processes, process_id
    heartbeat = _env_int(ENV_HEARTBEAT, 30)

    if coordinator and num and num > 1:
        if pid is None or not 0 <= pid < num:
            raise ValueError(f"process id {pid} is not in [0, {num}) for coordinator {coordinator}")
        # Only affects the CPU backend; accelerator hosts keep their own collectives.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num, process_id=pid,
            heartbeat_timeout_seconds=heartbeat, initialization_timeout=120,
        )
        return HostInfo(pid, num)
    if auto:
        jax.distributed.initialize()
        return HostInfo(jax.process_index(), jax.process_count())
    return HostInfo(0, 1)


MEET_TIMEOUT_S = 900
"""How long `meet` waits for the slowest host (its compiles on a loaded machine)."""


def meet(name: str, timeout_s: float = MEET_TIMEOUT_S) -> None:
    """Wait until every process of the run has reached `name`: a barrier of the coordination
    service, not a collective; nothing in a single-process run.

    Before the first cross-host collective: on CPU, gloo gives a peer 30 s to join a new
    communicator, so hosts whose compiles end more than 30 s apart (a cold cache on a loaded
    machine) failed there with "Gloo context initialization failed: DEADLINE_EXCEEDED"."""
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is not None:  # a barrier's id is used once: the k-th meeting of a name is name#k
        _meetings[name] = _meetings.get(name, 0) + 1
        client.wait_at_barrier(f"{name}#{_meetings[name]}", int(timeout_s * 1000))


_meetings: dict[str, int] = {}
