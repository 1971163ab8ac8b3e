"""Per-run cgroups: one memory cgroup (the run's aggregate memory cap) and one pids cgroup
(its process cap) for each sandboxed run, where this process may create them.

The run's cgroups are made under this process's own cgroup in each hierarchy (so a limit
that already applies to the trainer also applies to the run), from cgroup v2 when its
controllers are enabled for children there, else from the v1 hierarchy of that controller.
Whether it works is found by doing it once (`Cgroups.probe`): a cgroup that could be made
but not joined or limited would make `Isolation.describe()` claim a cap that is not there.

v2: `memory.max` (+ `memory.swap.max` = 0), `pids.max`; v1: `memory.limit_in_bytes`
(+ `memory.memsw.limit_in_bytes`, so swap cannot extend it), `pids.max`. The sandbox's own
processes (the bootstrap and, with a pid namespace, its init) are in the pids cgroup too, so
its pids.max is `Limits.max_processes` plus those.

References: the kernel's cgroup-v2.rst (delegation, "no internal processes") and
cgroup-v1/memory.rst, pids.rst.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import signal
import time

log = logging.getLogger("locojax.envs.sandbox")

SANDBOX_PROCESSES = 2
"""The bootstrap and the pid-namespace init: in the pids cgroup, not counted as the code's."""


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    import re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> tuple[str | None, dict[str, str]]:
    """(cgroup2 mount point, {v1 controller: its hierarchy's mount point})."""
    v2, v1 = None, {}
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2" and v2 is None:
            v2 = _unescape(fields[4])
        elif rest[0] == "cgroup":
            for opt in rest[2].split(","):
                v1.setdefault(opt, _unescape(fields[4]))
    return v2, v1


def _own_paths() -> tuple[str | None, dict[str, str]]:
    """This process's cgroup path in v2, and per v1 controller (/proc/self/cgroup)."""
    v2, v1 = None, {}
    for line in _read("/proc/self/cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        for c in parts[1].split(","):
            if c:
                v1[c] = parts[2]
    return v2, v1


@dataclasses.dataclass(frozen=True)
class _Parent:
    """Where one controller's per-run cgroups are made."""

    controller: str  # "memory" or "pids"
    path: str  # the directory under which run cgroups are created
    v2: bool


def _parents() -> dict[str, _Parent]:
    v2_mount, v1_mounts = _mounts()
    v2_own, v1_own = _own_paths()
    out: dict[str, _Parent] = {}
    if v2_mount and v2_own is not None:
        here = os.path.normpath(v2_mount + "/" + v2_own)
        # Only where the controllers are already enabled for children: enabling them would
        # change the host's cgroup setup (and v2 refuses it where processes live anyway).
        enabled = set(_read(os.path.join(here, "cgroup.subtree_control")).split())
        for c in ("memory", "pids"):
            if c in enabled:
                out[c] = _Parent(c, here, True)
    for c in ("memory", "pids"):
        if c not in out and c in v1_mounts and c in v1_own:
            out[c] = _Parent(c, os.path.normpath(v1_mounts[c] + "/" + v1_own[c]), False)
    return out


class RunCgroups:
    """The cgroups of one run: `procs` are the files the bootstrap joins."""

    def __init__(self, dirs: list[tuple[_Parent, str]]):
        self.dirs = dirs

    @property
    def procs(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for _, d in self.dirs]

    def oom_killed(self) -> bool:
        """True when the memory cgroup's OOM killer killed a process of the run."""
        for parent, d in self.dirs:
            if parent.controller != "memory":
                continue
            text = _read(os.path.join(d, "memory.events" if parent.v2 else "memory.oom_control"))
            for line in text.splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill" and v.strip().isdigit() and int(v) > 0:
                    return True
        return False

    def remove(self) -> None:
        """Kill whatever is left in the run's cgroups and remove them."""
        for parent, d in self.dirs:
            if parent.v2 and os.path.exists(os.path.join(d, "cgroup.kill")):
                try:
                    _write(os.path.join(d, "cgroup.kill"), "1")
                except OSError:
                    pass
            deadline = time.monotonic() + 5
            while True:
                for pid in _read(os.path.join(d, "cgroup.procs")).split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError, PermissionError):
                        pass
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("sandbox: could not remove cgroup %s", d)
                        break
                    time.sleep(0.02)


class Cgroups:
    """Finds, once, where per-run memory and pids cgroups can be made; makes them per run."""

    def __init__(self, enabled: bool = True):
        self.parents: dict[str, _Parent] = {}
        if not enabled:
            return
        for c, parent in _parents().items():
            if self._works(parent):
                self.parents[c] = parent

    @property
    def memory(self) -> bool:
        return "memory" in self.parents

    @property
    def pids(self) -> bool:
        return "pids" in self.parents

    def _works(self, parent: _Parent) -> bool:
        """Make, limit and remove one cgroup: an unwritable hierarchy says so here."""
        try:
            run = self._make(parent, memory_bytes=64 << 20, max_processes=1)
        except OSError:
            return False
        RunCgroups([run]).remove()
        return True

    def _make(self, parent: _Parent, memory_bytes: int, max_processes: int) -> tuple[_Parent, str]:
        d = os.path.join(parent.path, f"locojax-sbx-{secrets.token_hex(6)}")
        os.mkdir(d)
        try:
            if parent.controller == "pids":
                _write(os.path.join(d, "pids.max"), str(max_processes + SANDBOX_PROCESSES))
            elif parent.v2:
                _write(os.path.join(d, "memory.max"), str(memory_bytes))
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    _write(os.path.join(d, "memory.swap.max"), "0")
            else:
                _write(os.path.join(d, "memory.limit_in_bytes"), str(memory_bytes))
                if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
                    try:  # absent without swap accounting; the RAM limit still holds
                        _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(memory_bytes))
                    except OSError:
                        pass
        except OSError:
            os.rmdir(d)
            raise
        return parent, d

    def make(self, memory_bytes: int, max_processes: int) -> RunCgroups:
        """The run's cgroups; an OSError here is a setup failure (the caps were promised)."""
        made: list[tuple[_Parent, str]] = []
        try:
            for parent in self.parents.values():
                made.append(self._make(parent, memory_bytes, max_processes))
        except OSError:
            RunCgroups(made).remove()
            raise
        return RunCgroups(made)
