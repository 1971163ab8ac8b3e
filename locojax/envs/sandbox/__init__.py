"""Run untrusted code (model-written patches, tests, code rewards) in a contained child process.

Every run gets a fresh temporary directory, which is the only place the child can write, and
these layers, strongest first, each used when the kernel allows it (`Sandbox.isolation` and a
start-up log line say which are active):

- namespaces (`unshare(2)` through ctypes; Python 3.11 has no `os.unshare`): a new mount
  namespace whose root is a fresh read-only tmpfs holding only read-only bind mounts of the
  system and Python directories plus the read-write work dir (`pivot_root`), so files planted
  elsewhere do not exist inside; a new network namespace (no interfaces up, not even loopback);
  a new pid namespace (killing its init kills everything, including processes that `setsid`);
  new IPC and UTS namespaces. As non-root a user namespace is added to make this possible.
- an unprivileged uid: as root the child drops to a uid unique to the run, so root's
  permission bypass is gone and `RLIMIT_NPROC` (a per-uid count) becomes a per-run process cap.
- a cgroup `pids.max` where a pids cgroup is writable (a second, exact fork-bomb cap).
- bubblewrap (`bwrap`), when installed and the direct namespaces are refused.
- always: rlimits on CPU time, address space, file size, open files, process count, no core
  dumps; `PR_SET_NO_NEW_PRIVS`; a wall-clock deadline after which the whole process group is
  SIGKILLed; stdout/stderr kept to a head and a tail of bounded size.

Mechanics: the parent (`runner.py`) starts `bootstrap.py` as a script (`python -I -S
bootstrap.py SPEC`, stdlib only, so it imports nothing from the project) in a new session.
That bootstrap, still root, joins the cgroup, unshares, builds the root, forks the target,
which sets rlimits, drops the uid and `exec`s the command. The bootstrap reports the target's
exit status, or a setup error, as JSON lines on a dedicated pipe, so infrastructure failures
are told apart from the child's.

References: bubblewrap (the tmpfs root + bind mounts + pivot_root recipe), nsjail and the
`unshare(1)` man page; the limits follow OpenAI's human-eval `reliability_guard` and the SWE-
bench harness, but here they are kernel-enforced instead of monkey-patched.

Layout: `config.py` holds limits, configuration and results; `runner.py` the parent side
(`Sandbox`); `bootstrap.py` the child side, run as a stdlib-only script.
"""

from locojax.envs.sandbox.config import (Isolation, Limits, SandboxConfig, SandboxError,
                                         SandboxResult)
from locojax.envs.sandbox.runner import Sandbox, default_sandbox

__all__ = ["Isolation", "Limits", "Sandbox", "SandboxConfig", "SandboxError", "SandboxResult",
           "default_sandbox"]
