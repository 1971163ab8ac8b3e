"""Limits, configuration and results of sandboxed runs (see `locojax.envs.sandbox`)."""

from __future__ import annotations

import dataclasses

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
    """RLIMIT_AS (address space) per process; a larger allocation fails inside the child."""
    file_size_bytes: int = 64 << 20
    """RLIMIT_FSIZE: the largest file the child may write (writes beyond it fail with EFBIG)."""
    max_processes: int = 32
    """Process/thread cap for the run (cgroup pids.max and RLIMIT_NPROC of the run's uid)."""
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
    """How to isolate; the defaults pick the strongest mechanism this machine allows."""

    mode: str = "auto"
    """"auto", "namespaces", "bwrap" or "none" (rlimits, cwd and uid drop only)."""
    ro_paths: tuple[str, ...] = ()
    """Extra host paths made visible read-only inside the sandbox (e.g. a data dir)."""
    unprivileged_uid: bool = True
    """When running as root, run the child as a fresh uid unique to each run."""
    cgroup: bool = True
    """Use a pids cgroup for the process cap when one is writable."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables for the child (its environment is otherwise minimal)."""
    bwrap_path: str | None = None
    """bubblewrap binary; None means `bwrap` on PATH."""

    def __post_init__(self):
        if self.mode not in ("auto", "namespaces", "bwrap", "none"):
            raise ValueError(f"SandboxConfig.mode must be auto|namespaces|bwrap|none, got "
                             f"{self.mode!r}")


@dataclasses.dataclass(frozen=True)
class Isolation:
    """What the active mechanism actually guarantees (probed, not assumed)."""

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
    """The child runs as a non-root uid unique to the run."""
    cgroup_pids: bool
    """A cgroup pids.max caps the run's process count."""

    def describe(self) -> str:
        on = [n for n in ("filesystem", "network", "pid", "uid", "cgroup_pids") if getattr(self, n)]
        off = [n for n in ("filesystem", "network", "pid", "uid", "cgroup_pids")
               if not getattr(self, n)]
        return (f"sandbox mode={self.mode}: isolated {', '.join(on) or 'nothing'}"
                + (f"; NOT isolated: {', '.join(off)}" if off else "")
                + "; rlimits cpu/as/fsize/nofile/nproc + wall-clock kill always on")


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
    """"wall_time", "cpu_time", "file_size" or "signal <NAME>"; None when it exited itself."""
    wall_time: float
    """Seconds from start to the end of the run, including setup."""
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    """Files read back from the work dir after the run (see `Sandbox.run(read_back=...)`)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not a failure of the code it ran)."""
