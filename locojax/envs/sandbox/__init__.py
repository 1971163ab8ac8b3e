"""Run untrusted code (model-written patches, tests, code rewards) in a contained child process.

Every run gets a fresh temporary directory, which is the only place the child can write, and
these layers, each used when the kernel allows it (`Sandbox.isolation` and a start-up log
line say which are in force; `docs/security.md` lists each threat, its defence and its test):

- namespaces (`unshare(2)` through ctypes; Python 3.11 has no `os.unshare`): a new mount
  namespace whose root is a fresh read-only tmpfs holding only read-only bind mounts of the
  system and Python directories plus the read-write work dir (`pivot_root`), so files planted
  elsewhere do not exist inside; a new network namespace (no interfaces up, not even loopback);
  a new pid namespace (killing its init kills everything, including processes that `setsid`);
  new IPC and UTS namespaces. As non-root a user namespace is added to make this possible, in
  which the trainer's uid is a non-zero inner uid (so exec leaves the code no capability) and
  no further user namespace may be made. The work dir inside is a private tmpfs of
  `Limits.disk_bytes` holding a copy of the host's (a disk quota; nothing reaches the host).
- bubblewrap (`bwrap`), when installed and the direct namespaces are refused.
- no privilege, in every mode: as root the child drops to a uid unique to the run; every
  capability set (bounding and ambient included) is emptied and securebits are locked before
  exec, and a run whose child would still hold a capability or uid 0 is refused.
- per-run cgroups where this process may make them (`cgroup.py`): memory (the run's aggregate
  memory cap) and pids (its process cap). Otherwise RLIMIT_NPROC of a uid that only the run
  uses caps processes, and RLIMIT_AS times that cap bounds memory.
- always: rlimits on CPU time, address space, file size and open files, no core dumps;
  `PR_SET_NO_NEW_PRIVS`; a seccomp filter refusing memory outside RLIMIT_AS (memfd, SysV
  shm); the bootstrap ignoring the signals the code can send it; a wall-clock deadline after
  which the whole process group is SIGKILLed; stdout/stderr kept to a head and a tail of
  bounded size; the run's files removed whatever their modes.

Modes: "auto" is namespaces, else bwrap, each only with a process cap, an aggregate memory
cap and a disk quota (bwrap has no disk quota, so it runs by name only), else an error naming
what is missing and how to get it; never "none". "none" (no filesystem, network or pid
isolation) runs only when asked for by name, and says so in one warning line.

Mechanics: the parent (`runner.py`) starts `bootstrap.py` as a script (`python -I -S
bootstrap.py SPEC`, stdlib only, so it imports nothing from the project) in a new session.
That bootstrap joins the cgroups, unshares, builds the root, forks the target, which sets
rlimits, drops privileges and `exec`s the command. The bootstrap reports the target's exit
status, or a setup error, as JSON lines on a dedicated pipe, so infrastructure failures are
told apart from the child's. A run may also ask for a private channel, fd 3 of the command
(the SWE test harness sends its verdict on it).

References: bubblewrap (the tmpfs root + bind mounts + pivot_root recipe), nsjail and the
`unshare(1)`, `user_namespaces(7)`, `capabilities(7)` man pages; the limits follow OpenAI's
human-eval `reliability_guard` and the SWE-bench harness, but here they are kernel-enforced
instead of monkey-patched.

Layout: `config.py` holds limits, configuration and results; `runner.py` the parent side
(`Sandbox`); `child.py` one child's streams, status, kill and cleanup; `cgroup.py` the
per-run cgroups; `bootstrap.py` the child side, run as a
stdlib-only script.
"""

from locojax.envs.sandbox.config import (MODES, Isolation, Limits, SandboxConfig, SandboxError,
                                         SandboxResult)
from locojax.envs.sandbox.runner import HOW_TO_ISOLATE, Sandbox, default_sandbox

__all__ = ["HOW_TO_ISOLATE", "MODES", "Isolation", "Limits", "Sandbox", "SandboxConfig",
           "SandboxError", "SandboxResult", "default_sandbox"]
