"""What every actor of the Ray modes shares: its log format, its CPU request, its environment.

Logs: Ray prefixes each line an actor prints with the actor's `repr` (`(worker 2 pid=...)`),
so every actor class defines `__repr__` as its role and index, and the driver turns off
Ray's de-duplication of repeated lines (it would merge the workers' identical lines).

CPU requests are fractions: Ray reserves a whole CPU per actor unless told otherwise, and a
local run on 2 cores has up to a dozen actors. A request only reserves a share for Ray's
scheduling; the processes still share the cores.
"""

from __future__ import annotations

import logging
import os
import socket

from locojax import gc_tuning

LIGHT_CPUS = 0.05
"""Request of the actors that do little compute (parameter server, dispatcher, verifier)."""

NOISY_LOGGERS = ("absl", "jax._src", "orbax")
"""Loggers an actor keeps at WARNING: their INFO lines would fill the driver's output."""

FORWARDED_ENV_PREFIXES = ("JAX_", "XLA_", "LOCOJAX_HEARTBEAT", "PYTHONPATH", "TF_CPP")
"""Environment the actors inherit from the driver (compile cache, XLA flags, import path)."""


def setup_process(level: int = logging.INFO) -> None:
    """An actor's process: logging to stderr, which Ray forwards to the driver with the
    actor's prefix, and the GC threshold of locojax's processes (`gc_tuning`)."""
    gc_tuning.tune()
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", force=True)
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def host_cpus(total: float, hosts: int, light_actors: int) -> float:
    """Each host actor's CPU request, so that every actor fits in `total` CPUs."""
    share = (total - LIGHT_CPUS * light_actors) / hosts
    if share <= 0:
        raise ValueError(f"{total} CPUs cannot hold {hosts} hosts and {light_actors} helper "
                         "actors; pass a larger --ray-cpus")
    return min(1.0, round(share - 0.005, 2))


def forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
