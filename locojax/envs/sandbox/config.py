"""Limits, configuration and results of sandboxed runs (see `locojax.envs.sandbox`)."""

from __future__ import annotations

import dataclasses

MODES = ("auto", "namespaces", "bwrap", "none")
"""Sandbox modes a user may ask for. `auto` is the strongest of namespaces and bwrap that works
here, never `none`: running model-written code unisolated must be asked for by name."""

# ---------------------------------------------------------------------------------------------
# Configuration and results (parent side).


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits for one sandboxed run."""

    cpu_seconds: float = 10.0
    """RLIMIT_CPU per process: SIGXCPU at this many CPU seconds, SIGKILL one second later."""
    wall_seconds: float = 20.0
    """Wall-clock deadline for the whole run; then the process group is SIGKILLed."""
    memory_bytes: int = 1 << 30
    """The run's memory: its aggregate cap where a memory cgroup is writable (every process
    together), and RLIMIT_AS (address space) of each process always. Without a memory cgroup
    the aggregate bound is `max_processes * memory_bytes` (see `Isolation.describe`)."""
    file_size_bytes: int = 64 << 20
    """RLIMIT_FSIZE: the largest file the child may write (writes beyond it fail with EFBIG)."""
    max_processes: int = 32
    """Processes and threads of the code under test together (cgroup pids.max, or
    RLIMIT_NPROC of a uid that only this run uses); the sandbox's own processes do not count."""
    disk_bytes: int = 256 << 20
    """The work dir's size (namespaces mode: a tmpfs this large, in memory, so it counts in
    the run's memory bound too); writes beyond it fail with ENOSPC. Not enforced in the
    other modes (`Isolation.disk`)."""
    max_open_files: int = 256
    """RLIMIT_NOFILE."""
    max_output_bytes: int = 64 << 10
    """stdout and stderr are each kept to this many bytes (half head, half tail)."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"Limits.{f.name} must be a positive number, got {v!r}")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """How to isolate; the default picks the strongest mechanism this machine allows."""

    mode: str = "auto"
    """"auto" (namespaces, else bwrap, each only with a process cap, a memory cap and a disk
    quota, which bwrap lacks; an error when neither qualifies), "namespaces", "bwrap", or
    "none": no filesystem, network or pid isolation, only limits, a non-root uid without
    capabilities, and a loud warning. "none" is never chosen unless asked for by name."""
    ro_paths: tuple[str, ...] = ()
    """Extra host paths made visible read-only inside the sandbox (e.g. a data dir)."""
    cgroup: bool = True
    """Put each run in its own memory and pids cgroups where this process may create them."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables for the child (its environment is otherwise minimal)."""
    bwrap_path: str | None = None
    """bubblewrap binary; None means `bwrap` on PATH."""
    python: str | None = None
    """Interpreter for Python sources (`Sandbox.run(str)`) and the probe; None: this
    process's. As root in mode "none" it must be runnable by an unprivileged uid."""

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {'|'.join(MODES)}, got {self.mode!r}")


@dataclasses.dataclass(frozen=True)
class Isolation:
    """What the active mechanism enforces (probed, not assumed).

    Always enforced, in every mode: the code runs as a non-zero uid with every capability set
    empty (a run that would not is refused), no_new_privs, rlimits on CPU time, address space,
    file size and open files, and a wall-clock kill.
    """

    mode: str
    """"namespaces", "bwrap" or "none"."""
    filesystem: bool
    """Only the work dir is writable and host files outside the read-only system paths are
    absent (mount namespace + fresh root)."""
    network: bool
    """A network namespace with no usable interface."""
    pid: bool
    """A pid namespace: the run's processes die with it, even ones that escaped the group."""
    uid: bool
    """The child's uid on the host is unique to the run (as root: a fresh uid per run), so
    it cannot signal, trace or read the files of anything else."""
    process_cap: str
    """How `Limits.max_processes` is enforced: "cgroup" (pids.max), "rlimit" (RLIMIT_NPROC of
    a uid only this run uses: a fresh host uid, or the inner uid of the run's own user
    namespace) or "" (not enforced)."""
    memory_cap: str
    """How the run's memory is bounded as a whole: "cgroup" (a memory cgroup limit of
    `Limits.memory_bytes`), "rlimit" (RLIMIT_AS per process times the process cap, plus the
    tmpfs work dir; memfd and SysV shm are refused and there is no /dev/shm) or "" (per
    process only: no aggregate bound)."""
    disk: bool = False
    """The work dir is a private tmpfs of `Limits.disk_bytes` (a disk quota), which vanishes
    with the run: nothing the code writes reaches the host's disk."""

    def enforced(self) -> list[str]:
        """The guarantees in force, by name."""
        return [n for n in ("filesystem", "network", "pid", "uid") if getattr(self, n)] + (
            ["process_cap"] if self.process_cap else []) + (
            ["memory_cap"] if self.memory_cap else []) + (["disk"] if self.disk else [])

    def describe(self, limits: Limits | None = None) -> str:
        """One line saying what is enforced, and what is not, with the numbers of `limits`."""
        on = [n for n in ("filesystem", "network", "pid") if getattr(self, n)]
        off = [n for n in ("filesystem", "network", "pid") if not getattr(self, n)]
        (on if self.uid else off).append("per-run uid")
        n = f" {int(limits.max_processes)}" if limits else ""
        if self.process_cap == "cgroup":
            on.append(f"process cap{n} (cgroup pids.max)")
        elif self.process_cap == "rlimit":
            on.append(f"process cap{n} (RLIMIT_NPROC of "
                      + ("a per-run uid)" if self.uid else "the run's own user namespace)"))
        else:
            off.append("process cap")
        def mib(b: float) -> str:
            return f"{b / (1 << 20):.0f} MiB"

        if self.memory_cap == "cgroup":
            on.append("aggregate memory cap" + (f" {mib(limits.memory_bytes)}" if limits else "")
                      + " (cgroup)")
        elif self.memory_cap == "rlimit":
            on.append("aggregate memory bound" + (
                f" {int(limits.max_processes)} x {mib(limits.memory_bytes)} + "
                f"{mib(limits.disk_bytes)}" if limits else "")
                + " (RLIMIT_AS x process cap + tmpfs work dir; no memfd, SysV shm, /dev/shm)")
        else:
            off.append("aggregate memory cap (RLIMIT_AS per process only)")
        if self.disk:
            on.append("disk quota" + (f" {mib(limits.disk_bytes)}" if limits else "")
                      + " (tmpfs work dir)")
        else:
            off.append("disk quota")
        return (f"sandbox mode={self.mode}: enforced: {', '.join(on)}, non-root uid with no "
                "capabilities, no_new_privs, rlimits cpu/as/fsize/nofile, wall-clock kill"
                + (f"; NOT enforced: {', '.join(off)}" if off else ""))


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run."""

    returncode: int
    """Exit code; negative -N when killed by signal N (as `subprocess` reports it)."""
    stdout: str
    """Captured stdout (head and tail kept when over `Limits.max_output_bytes`)."""
    stderr: str
    """Captured stderr, truncated the same way."""
    timed_out: bool
    """True when the wall-clock deadline killed the run."""
    killed_reason: str | None
    """"wall_time", "cpu_time", "memory" (the memory cgroup's OOM kill), "file_size" or
    "signal <NAME>"; None when it exited itself."""
    wall_time: float
    """Seconds from start to the end of the run, including setup."""
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    """Files read back from the work dir after the run (see `Sandbox.run(read_back=...)`)."""
    channel: bytes | None = None
    """What the command wrote to fd 3, the run's private channel (`Sandbox.run(channel=True)`);
    None when not asked for or when it exceeded its cap."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not a failure of the code it ran)."""
