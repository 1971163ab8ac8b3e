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

Mechanics: the parent starts this very file as a script (`python -I -S sandbox.py SPEC`, stdlib
only, so it imports nothing from the project) in a new session. That bootstrap, still root,
joins the cgroup, unshares, builds the root, forks the target, which sets rlimits, drops the
uid and `exec`s the command. The bootstrap reports the target's exit status, or a setup error,
as JSON lines on a dedicated pipe, so infrastructure failures are told apart from the child's.

References: bubblewrap (the tmpfs root + bind mounts + pivot_root recipe), nsjail and the
`unshare(1)` man page; the limits follow OpenAI's human-eval `reliability_guard` and the SWE-
bench harness, but here they are kernel-enforced instead of monkey-patched.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys

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


# ---------------------------------------------------------------------------------------------
# The bootstrap: runs as `python -I -S sandbox.py SPEC`, stdlib only, between fork and exec.

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_DEV_NODES = ("null", "zero", "full", "random", "urandom")


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, src, dst, fstype, flags, data=None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), f"mount {dst}")


def _locked_flags(path: str) -> int:
    """Mount flags a user namespace may not clear on remount (else EPERM)."""
    f = os.statvfs(path).f_flag
    out = f & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    return out | (MS_RELATIME if f & 4096 else 0)  # ST_RELATIME is 4096, MS_RELATIME is not


def _mounts_under(root: str) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if mp.startswith(root + "/"):
                out.append(mp)
    return out


def _build_root(libc, spec: dict) -> None:
    """Fresh tmpfs root with read-only binds of the system, rw work dir, then pivot_root."""
    root, work = spec["newroot"], spec["work"]
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do propagates back
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for p in spec["ro_paths"]:
        dest = root + p
        if os.path.islink(p):  # e.g. /bin -> usr/bin on merged-/usr systems
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if not os.path.lexists(dest):
                os.symlink(os.readlink(p), dest)
            continue
        if not os.path.exists(p) or os.path.exists(dest):
            continue
        if os.path.isdir(p):
            os.makedirs(dest, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            open(dest, "w").close()
        _mount(libc, p, dest, None, MS_BIND | MS_REC)
    for mp in _mounts_under(root):  # every bind (and submount) read-only, no setuid
        _mount(libc, None, mp, None,
               MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | _locked_flags(mp))
    os.makedirs(root + "/dev")
    for name in _DEV_NODES:
        open(f"{root}/dev/{name}", "w").close()
        _mount(libc, f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{root}/dev/{name}")
    os.symlink("/proc/self/fd", f"{root}/dev/fd")
    if spec["flags"] & CLONE_NEWPID:
        os.makedirs(root + "/proc")
        _mount(libc, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + work)
    _mount(libc, work, root + work, None, MS_BIND | MS_REC)
    _mount(libc, None, root + work, None,
           MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | _locked_flags(root + work))
    _mount(libc, None, root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    nr = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if nr is not None:  # pivot_root(".", ".") then detach the old root stacked under it
        _check(libc.syscall(nr, b".", b"."), "pivot_root")
        _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    else:  # safe enough: the child is unprivileged and has no CAP_SYS_CHROOT to break out
        os.chroot(".")
    os.chdir("/")


def _exec_target(libc, spec: dict, status_fd: int) -> None:
    import resource

    try:
        os.set_inheritable(status_fd, False)  # the exec closes it
        for name, (soft, hard) in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if spec["uid"] is not None:
            os.setgroups([])
            os.setresgid(spec["uid"], spec["uid"], spec["uid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.chdir(spec["work"])
        os.umask(0o022)
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except BaseException as e:  # noqa: BLE001 - report anything, then die without cleanup
        os.write(status_fd, (json.dumps({"error": f"exec {spec['argv'][0]!r}: {e!r}"})
                             + "\n").encode())
        os._exit(127)


def _wait_for(pid: int) -> int:
    """Reap children (as a pid-namespace init we inherit orphans) until `pid` exits."""
    while True:
        got, status = os.waitpid(-1, 0)
        if got == pid:
            return status


def _bootstrap(spec: dict) -> None:
    import resource

    status_fd = spec["status_fd"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        libc = _libc()
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if spec["cgroup_procs"]:
            try:
                with open(spec["cgroup_procs"], "w") as f:
                    f.write(str(os.getpid()))
            except OSError as e:  # not fatal: the uid's RLIMIT_NPROC still caps processes
                os.write(status_fd, (json.dumps({"warning": f"cgroup join: {e!r}"}) + "\n")
                         .encode())
        flags = spec["flags"]
        if flags:
            outer_uid, outer_gid = os.geteuid(), os.getegid()
            _check(libc.unshare(flags), "unshare")
            if flags & CLONE_NEWUSER:  # map ourselves to root inside, to be allowed to mount
                with open("/proc/self/setgroups", "w") as f:
                    f.write("deny")
                with open("/proc/self/uid_map", "w") as f:
                    f.write(f"0 {outer_uid} 1")
                with open("/proc/self/gid_map", "w") as f:
                    f.write(f"0 {outer_gid} 1")
        if flags & CLONE_NEWPID:  # the next child is the namespace's init
            pid = os.fork()
            if pid:
                _wait_for(pid)
                os._exit(0)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if flags & CLONE_NEWNS:
            _build_root(libc, spec)
    except BaseException as e:  # noqa: BLE001
        os.write(status_fd, (json.dumps({"error": f"sandbox setup: {e!r}"}) + "\n").encode())
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        _exec_target(libc, spec, status_fd)
    status = _wait_for(pid)
    msg = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
           else {"exit": os.WEXITSTATUS(status)})
    os.write(status_fd, (json.dumps(msg) + "\n").encode())
    os._exit(0)  # as a pid-namespace init, this kills whatever the target left behind


if __name__ == "__main__":
    _bootstrap(json.loads(sys.argv[1]))
    raise SystemExit(0)

# ---------------------------------------------------------------------------------------------
# The parent side. Its imports live here so that the bootstrap above, which runs before every
# sandboxed command, starts without loading them.

import functools  # noqa: E402
import logging  # noqa: E402
import secrets  # noqa: E402
import selectors  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from pathlib import Path, PurePosixPath  # noqa: E402

log = logging.getLogger(__name__)

_NS_FLAGS = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
_SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
              "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
              "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/localtime")
_UID_BASE, _UID_SPAN = 2_000_000_000, 100_000_000  # far above any real account or subuid range
_logged: set[str] = set()
_logged_lock = threading.Lock()


def _python_paths() -> list[str]:
    """The interpreter and its libraries: venv prefix, base prefix, the executable's real dir."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(os.path.realpath(p) for p in paths if p and os.path.isdir(p))


def _cgroup_root() -> str | None:
    """A pids-cgroup directory we may create children in (v1 `pids` hierarchy or v2 root)."""
    if os.path.isdir("/sys/fs/cgroup/pids"):
        root = "/sys/fs/cgroup/pids"
    elif "pids" in _read("/sys/fs/cgroup/cgroup.subtree_control"):
        root = "/sys/fs/cgroup"
    else:
        return None
    return root if os.access(root, os.W_OK) else None


def _read(path: str, limit: int = 1 << 16) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read(limit)
    except OSError:
        return ""


def _safe_relpath(path: str) -> str:
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or str(p) in ("", "."):
        raise ValueError(f"sandbox file path must be relative and inside the work dir: {path!r}")
    return str(p)


class _Tail:
    """Keep the first and last `cap // 2` bytes of a stream and count what was dropped."""

    def __init__(self, cap: int):
        self.half, self.head, self.tail, self.total = cap // 2, bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > self.half:
            del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        mid = f"\n...[{dropped} bytes truncated]...\n".encode() if dropped else b""
        return bytes(self.head + mid + self.tail).decode("utf-8", errors="replace")


class Sandbox:
    """Runs commands in isolated children; see the module docstring for what "isolated" means.

    One instance is cheap to share across threads: each `run` is independent.
    """

    def __init__(self, config: SandboxConfig = SandboxConfig(), limits: Limits = Limits()):
        self.config, self.limits = config, limits
        self._root = os.geteuid() == 0
        self._ro_paths = list(_SYSTEM_RO) + _python_paths() + [
            os.path.realpath(p) for p in config.ro_paths]
        self._cgroup_root = _cgroup_root() if config.cgroup else None
        self._bwrap = config.bwrap_path or shutil.which("bwrap")
        self.isolation = self._choose()
        desc = self.isolation.describe()
        _warn_once(desc, log.info if self.isolation.filesystem and self.isolation.network
                   else log.warning)

    # -- mode selection ------------------------------------------------------------------------

    def _candidates(self) -> list[Isolation]:
        modes = ["namespaces", "bwrap", "none"] if self.config.mode == "auto" else [
            self.config.mode]
        drop = self._root and self.config.unprivileged_uid
        out = []
        for mode in modes:
            ns = mode in ("namespaces", "bwrap")
            # Outside our own mount setup the interpreter may live where only root can reach
            # it (e.g. under /root), so the other modes also try keeping the uid.
            for uid in ([drop, False] if drop and mode != "namespaces" else [drop]):
                out.append(Isolation(mode=mode, filesystem=ns, network=ns, pid=ns, uid=uid,
                                     cgroup_pids=self._cgroup_root is not None))
        return out

    def _choose(self) -> Isolation:
        errors = []
        for iso in self._candidates():
            if iso.mode == "bwrap" and not self._bwrap:
                errors.append("bwrap: not installed")
                continue
            self.isolation = iso
            try:
                r = self.run([sys.executable, "-c", "print('ok')"], limits=Limits(wall_seconds=30))
            except SandboxError as e:
                errors.append(f"{iso.mode}(uid={iso.uid}): {e}")
                continue
            if r.ok and r.stdout.strip() == "ok":
                return iso
            errors.append(f"{iso.mode}(uid={iso.uid}): probe failed rc={r.returncode} "
                          f"{r.stderr[-300:]!r}")
        raise SandboxError("no sandbox mode works here: " + "; ".join(errors))

    # -- one run -------------------------------------------------------------------------------

    def run(
        self,
        cmd: Sequence[str] | str,
        files: Mapping[str, str | bytes] | str | os.PathLike | None = None,
        limits: Limits | None = None,
        read_back: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        read_back_bytes: int = 1 << 20,
    ) -> SandboxResult:
        """Run `cmd` (argv, or Python source when a str) in a fresh work dir.

        `files` is either {relative path: content} or a host directory copied in. `read_back`
        names work-dir files returned in `SandboxResult.files` (missing ones are omitted; each
        is cut at `read_back_bytes`). `env` adds variables to the child's minimal environment.
        """
        limits = limits or self.limits
        t0 = time.monotonic()
        run_dir = tempfile.mkdtemp(prefix="locojax-sbx-")
        cgroup, uid = None, None
        try:
            os.chmod(run_dir, 0o711)  # in mode "none" the child's uid must traverse it
            work = os.path.join(run_dir, "work")
            self._populate(work, files)
            if isinstance(cmd, str):
                with open(os.path.join(work, "__sandbox_main__.py"), "w") as f:
                    f.write(cmd)
                cmd = [sys.executable, "__sandbox_main__.py"]
            if not cmd or not all(isinstance(c, str) for c in cmd):
                raise ValueError(f"sandbox cmd must be a non-empty list of str, got {cmd!r}")
            uid = (_UID_BASE + secrets.randbelow(_UID_SPAN)) if self.isolation.uid else None
            if uid is not None:
                for dirpath, dirnames, filenames in os.walk(work):
                    for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
                        os.lchown(name, uid, uid)
            cgroup = self._make_cgroup(limits)
            spec = self._spec(run_dir, work, list(cmd), limits, uid, cgroup, env or {})
            rc, out, err, timed_out, status = self._launch(spec, limits, t0)
            if status.get("error"):
                raise SandboxError(status["error"])
            sig = status.get("signal")
            if self.isolation.mode == "bwrap" and 128 < status.get("exit", 0) <= 128 + 64:
                sig = status.pop("exit") - 128  # bwrap, as init, exits 128+N for signal N
            if sig is None and "exit" not in status and not timed_out:
                raise SandboxError(f"sandbox bootstrap died without a status (rc={rc}): "
                                   f"{err[-500:]}")
            returncode = -sig if sig else status.get("exit", -signal.SIGKILL)
            reason = None
            if timed_out:
                reason = "wall_time"
            elif sig == signal.SIGXCPU or (sig == signal.SIGKILL
                                           and time.monotonic() - t0 >= limits.cpu_seconds):
                reason = "cpu_time"
            elif sig == signal.SIGXFSZ:
                reason = "file_size"
            elif sig:
                reason = f"signal {signal.Signals(sig).name}"
            back = {}
            for rel in read_back:
                p = os.path.join(work, _safe_relpath(rel))
                # The child may have planted symlinks (also as parent dirs): read only what
                # really lies inside the work dir.
                if os.path.realpath(p).startswith(work + os.sep) and os.path.isfile(p):
                    with open(p, "rb") as f:
                        back[rel] = f.read(read_back_bytes).decode("utf-8", "replace")
            return SandboxResult(returncode, out, err, timed_out, reason,
                                 time.monotonic() - t0, back)
        finally:
            if uid is not None and not self.isolation.pid and cgroup is None:
                _kill_uid(uid)  # stragglers that left the process group
            if cgroup:
                _remove_cgroup(cgroup)
            shutil.rmtree(run_dir, ignore_errors=True)

    def _populate(self, work: str, files) -> None:
        if files is None:
            os.mkdir(work)
        elif isinstance(files, (str, os.PathLike)):
            src = Path(files)
            if not src.is_dir():
                raise ValueError(f"sandbox files directory does not exist: {src}")
            shutil.copytree(src, work, symlinks=True)
        else:
            os.mkdir(work)
            for rel, content in files.items():
                p = os.path.join(work, _safe_relpath(rel))
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as f:
                    f.write(content.encode() if isinstance(content, str) else content)
        os.chmod(work, 0o700)

    def _make_cgroup(self, limits: Limits) -> str | None:
        if self._cgroup_root is None:
            return None
        path = os.path.join(self._cgroup_root, f"locojax-sbx-{secrets.token_hex(6)}")
        try:
            os.mkdir(path)
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write(str(int(limits.max_processes)))
        except OSError as e:
            log.warning("sandbox: cannot create pids cgroup %s (%s); relying on rlimits", path, e)
            _remove_cgroup(path)
            return None
        return path

    def _spec(self, run_dir, work, argv, limits, uid, cgroup, extra_env) -> dict:
        cpu = max(1, int(limits.cpu_seconds + 0.999))
        nproc = int(limits.max_processes)
        rlimits = {
            "RLIMIT_CPU": (cpu, cpu + 1),
            "RLIMIT_AS": (int(limits.memory_bytes),) * 2,
            "RLIMIT_FSIZE": (int(limits.file_size_bytes),) * 2,
            "RLIMIT_NOFILE": (int(limits.max_open_files),) * 2,
            "RLIMIT_CORE": (0, 0),
        }
        if uid is not None:  # per-uid count: only meaningful when the uid is ours alone
            rlimits["RLIMIT_NPROC"] = (nproc, nproc)
        pybin = os.path.dirname(sys.executable)
        env = {"PATH": f"{pybin}:/usr/local/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work,
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "USER": "sandbox", "LOGNAME": "sandbox",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        env.update(dict(self.config.env))
        env.update(extra_env)
        mode = self.isolation.mode
        flags = 0
        if mode == "namespaces":
            flags = _NS_FLAGS | (0 if self._root else CLONE_NEWUSER)
            os.mkdir(os.path.join(run_dir, "root"))
        elif mode == "bwrap":
            argv = self._bwrap_argv(work, env) + argv
        return {"flags": flags, "newroot": os.path.join(run_dir, "root"), "work": work,
                "ro_paths": self._ro_paths, "rlimits": rlimits, "uid": uid, "argv": argv,
                "env": env, "cgroup_procs": cgroup and os.path.join(cgroup, "cgroup.procs"),
                "status_fd": -1}

    def _bwrap_argv(self, work: str, env: dict) -> list[str]:
        a = [self._bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
        for p in self._ro_paths:
            if os.path.islink(p):
                a += ["--symlink", os.readlink(p), p]
            elif os.path.exists(p):
                a += ["--ro-bind", p, p]
        a += ["--dev", "/dev", "--proc", "/proc", "--bind", work, work, "--chdir", work,
              "--remount-ro", "/", "--clearenv"]
        for k, v in env.items():
            a += ["--setenv", k, v]
        return a + ["--"]

    def _launch(self, spec, limits, t0):
        r, w = os.pipe()
        spec["status_fd"] = w
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), json.dumps(spec)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(w,), start_new_session=True, env={}, close_fds=True)
        finally:
            os.close(w)
        try:
            out, err, timed_out = _collect(proc, t0 + limits.wall_seconds, limits.max_output_bytes)
            if timed_out:
                _killpg(proc.pid)
            try:
                rc = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid)
                rc = proc.wait()
            os.set_blocking(r, False)  # every writer is dead by now; never hang on a straggler
            try:
                status_lines = os.read(r, 1 << 16).decode(errors="replace").splitlines()
            except BlockingIOError:
                status_lines = []
        finally:
            os.close(r)
            _killpg(proc.pid)  # anything still in the group (mode "none" leftovers)
        status: dict = {}
        for line in status_lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "warning" in msg:
                _warn_once(f"sandbox: {msg['warning']}")
            elif "error" in msg and "error" not in status:
                status["error"] = msg["error"]
            else:
                status.update({k: v for k, v in msg.items() if k != "error"})
        return rc, out.text(), err.text(), timed_out, status


def _warn_once(msg: str, emit=None) -> None:
    with _logged_lock:
        if msg in _logged:
            return
        _logged.add(msg)
    (emit or log.warning)(msg)


@functools.cache
def default_sandbox() -> Sandbox:
    """One shared `Sandbox()` per process, so the isolation probe runs (and logs) once."""
    return Sandbox()


def _collect(proc, deadline: float, cap: int):
    """Read stdout/stderr until both close or the deadline passes; True if it passed."""
    out, err = _Tail(cap), _Tail(cap)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    timed_out, exited_at = False, None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = proc.poll() is None or exited_at is None
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 1.0:
                break  # the pipes are held by a straggler; it is about to be killed
            for key, _ in sel.select(timeout=min(0.1, deadline - now)):
                data = os.read(key.fd, 1 << 16)
                if data:
                    key.data.add(data)
                else:
                    sel.unregister(key.fileobj)
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    return out, err, timed_out


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid`: kill(-1) from a process running as that uid."""
    subprocess.run([sys.executable, "-I", "-S", "-c",
                    "import os, signal\ntry: os.kill(-1, signal.SIGKILL)\nexcept OSError: pass"],
                   user=uid, group=uid, extra_groups=[], env={}, timeout=10, check=False,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _remove_cgroup(path: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pids = _read(os.path.join(path, "cgroup.procs")).split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    log.warning("sandbox: could not remove cgroup %s", path)
