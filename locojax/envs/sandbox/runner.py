"""The parent side of the sandbox: `Sandbox` and its helpers (see `locojax.envs.sandbox`)."""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from locojax.envs.sandbox import child
from locojax.envs.sandbox.bootstrap import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS,
                                            CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWUTS)
from locojax.envs.sandbox.cgroup import SANDBOX_PROCESSES, Cgroups
from locojax.envs.sandbox.config import (Isolation, Limits, SandboxConfig, SandboxError,
                                         SandboxResult)

log = logging.getLogger(__package__)  # "locojax.envs.sandbox", as before the split

_NS_FLAGS = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
_SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
              "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
              "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/localtime")
_UID_BASE, _UID_SPAN = 2_000_000_000, 100_000_000  # far above any real account or subuid range
_logged: set[str] = set()
_logged_lock = threading.Lock()

HOW_TO_ISOLATE = (
    "To isolate model-written code, do one of: run the trainer as root; allow unprivileged user "
    "namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu 23.10+ "
    "kernel.apparmor_restrict_unprivileged_userns=0; in Docker, a seccomp profile that allows "
    "unshare/mount, e.g. --security-opt seccomp=unconfined); or install bubblewrap "
    "(apt-get install bubblewrap) and ask for it by name, --task.sandbox bwrap (weaker: no "
    "disk quota, and non-root no process or memory cap without a delegated cgroup). To run "
    "it without isolation, ask for that by name: "
    "--task.sandbox none (SandboxConfig(mode='none') in the library).")


def _python_paths(python: str) -> list[str]:
    """The interpreter and its libraries: venv prefix, base prefix, the executable's real dir."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)),
             os.path.dirname(os.path.realpath(python))}
    return sorted(os.path.realpath(p) for p in paths if p and os.path.isdir(p))


def _safe_relpath(path: str) -> str:
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or str(p) in ("", "."):
        raise ValueError(f"sandbox file path must be relative and inside the work dir: {path!r}")
    return str(p)


class Sandbox:
    """Runs commands in isolated children; see `locojax.envs.sandbox` for what "isolated" means.

    One instance is cheap to share across threads: each `run` is independent.
    """

    def __init__(self, config: SandboxConfig = SandboxConfig(), limits: Limits = Limits()):
        self.config, self.limits = config, limits
        self.python = config.python or sys.executable
        self._root = os.geteuid() == 0
        self._ro_paths = list(_SYSTEM_RO) + _python_paths(self.python) + [
            os.path.realpath(p) for p in config.ro_paths]
        self._cgroups = Cgroups(config.cgroup)
        self._bwrap = config.bwrap_path or shutil.which("bwrap")
        self.isolation = self._choose()
        desc = self.isolation.describe(limits)
        if self.isolation.mode == "none":
            _warn_once("sandbox mode=none, asked for by name: model-written code runs WITHOUT "
                       "filesystem, network or pid isolation. " + desc)
        else:
            _warn_once(desc, log.info)

    # -- mode selection ------------------------------------------------------------------------

    def _candidate(self, mode: str) -> Isolation:
        ns = mode in ("namespaces", "bwrap")
        # RLIMIT_NPROC counts processes per (user namespace, uid): a per-run cap only for a
        # fresh host uid (as root) or our own user namespace (non-root namespaces mode).
        per_run_uid = self._root or mode == "namespaces"
        process_cap = "cgroup" if self._cgroups.pids else "rlimit" if per_run_uid else ""
        # The product of the rlimits bounds memory only where nothing else holds any: memfd
        # and SysV shm are refused in every mode (bootstrap.refuse_shared_memory), but only
        # our own root has no writable /dev/shm (bwrap's --dev has one; "none" the host's).
        memory_cap = "cgroup" if self._cgroups.memory else (
            "rlimit" if process_cap and mode == "namespaces" else "")
        return Isolation(mode=mode, filesystem=ns, network=ns, pid=ns, uid=self._root,
                         process_cap=process_cap, memory_cap=memory_cap,
                         disk=mode == "namespaces")

    def _choose(self) -> Isolation:
        # "auto" never falls back to "none": unisolated runs are asked for by name.
        modes = ["namespaces", "bwrap"] if self.config.mode == "auto" else [self.config.mode]
        errors = []
        for mode in modes:
            if mode == "bwrap" and not self._bwrap:
                errors.append("bwrap: not installed")
                continue
            self.isolation = self._candidate(mode)
            iso = self.isolation
            if self.config.mode == "auto" and not (iso.process_cap and iso.memory_cap
                                                   and iso.disk):
                cap = ("process" if not iso.process_cap else "aggregate memory"
                       if not iso.memory_cap else "disk")
                errors.append(f"{mode}: no {cap} cap here (`auto` takes only a mode with both; "
                              f"ask for it by name: --task.sandbox {mode})")
                continue
            try:
                r = self.run([self.python, "-c", "print('ok')"], limits=Limits(wall_seconds=30))
            except SandboxError as e:
                errors.append(f"{mode}: {e}")
                continue
            if r.ok and r.stdout.strip() == "ok":
                return self.isolation
            errors.append(f"{mode}: probe failed rc={r.returncode} {r.stderr[-300:]!r}")
        if self.config.mode == "none" or (self.config.mode == "bwrap" and self._root):
            # bwrap too: as root it is exec'd after the drop to the run's uid.
            raise SandboxError(
                f"sandbox mode {self.config.mode} does not work here ({'; '.join(errors)}). "
                "As root it runs the code as a fresh unprivileged uid, which must be able to "
                f"run {self.python} (really {os.path.realpath(self.python)}; not under /root, "
                "mode 0700): use an interpreter other users can run (SandboxConfig.python; "
                "`locojax train` uses its own, so install it with a system-wide Python), or "
                + ("an isolated mode." if self.config.mode == "none" else "mode namespaces."))
        raise SandboxError(f"no sandbox isolation works here ({'; '.join(errors)}). "
                           + HOW_TO_ISOLATE)

    # -- one run -------------------------------------------------------------------------------

    def run(
        self,
        cmd: Sequence[str] | str,
        files: Mapping[str, str | bytes] | str | os.PathLike | None = None,
        limits: Limits | None = None,
        read_back: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        read_back_bytes: int = 1 << 20,
        channel: bool = False,
    ) -> SandboxResult:
        """Run `cmd` (argv, or Python source when a str) in a fresh work dir.

        `files` is either {relative path: content} or a host directory copied in. `read_back`
        names work-dir files returned in `SandboxResult.files` (missing ones are omitted; each
        is cut at `read_back_bytes`). `env` adds variables to the child's minimal environment.
        `channel` opens fd 3 of the command as a pipe to the parent, returned in
        `SandboxResult.channel`: a way out of the sandbox that is not a file in the work dir.
        """
        limits = limits or self.limits
        t0 = time.monotonic()
        run_dir = tempfile.mkdtemp(prefix="locojax-sbx-")
        cgroups, uid = None, None
        try:
            os.chmod(run_dir, 0o711)  # in mode "none" the child's uid must traverse it
            work = os.path.join(run_dir, "work")
            self._populate(work, files, limits)
            if isinstance(cmd, str):
                with open(os.path.join(work, "__sandbox_main__.py"), "w") as f:
                    f.write(cmd)
                cmd = [self.python, "__sandbox_main__.py"]
            if not cmd or not all(isinstance(c, str) for c in cmd):
                raise ValueError(f"sandbox cmd must be a non-empty list of str, got {cmd!r}")
            uid = (_UID_BASE + secrets.randbelow(_UID_SPAN)) if self.isolation.uid else None
            if uid is not None:
                for dirpath, dirnames, filenames in os.walk(work):
                    for name in [dirpath, *(os.path.join(dirpath, n)
                                            for n in dirnames + filenames)]:
                        os.lchown(name, uid, uid)
            try:
                cgroups = self._cgroups.make(int(limits.memory_bytes), int(limits.max_processes))
            except OSError as e:
                raise SandboxError(f"cannot create the run's cgroups: {e}") from e
            spec = self._spec(run_dir, work, list(cmd), limits, uid, cgroups, env or {})
            spec["read_back"] = [_safe_relpath(rel) for rel in read_back]
            spec["read_back_bytes"] = int(read_back_bytes)
            rc, out, err, chan, timed_out, status = child.launch(
                spec, t0 + limits.wall_seconds, limits.max_output_bytes, channel, _warn_once)
            returncode, reason = self._outcome(rc, err, timed_out, status, cgroups, limits, t0)
            back = (status.get("files", {}) if self.isolation.disk
                    else _read_back(work, read_back, read_back_bytes))
            return SandboxResult(returncode, out, err, timed_out, reason,
                                 time.monotonic() - t0, back, chan)
        finally:
            if uid is not None and not self.isolation.pid and not self._cgroups.pids:
                child.kill_uid(uid)  # stragglers that left the process group
            if cgroups is not None:
                cgroups.remove()
            left = child.remove_tree(run_dir)
            if left:
                _warn_once(f"sandbox: could not remove a run's files: {left}")

    def _outcome(self, rc, err, timed_out, status, cgroups, limits, t0) -> tuple[int, str | None]:
        """(returncode, killed_reason) from the bootstrap's status, or SandboxError."""
        if status.get("error"):
            raise SandboxError(status["error"])
        sig = status.get("signal")
        if self.isolation.mode == "bwrap" and 128 < status.get("exit", 0) <= 128 + 64:
            sig = status.pop("exit") - 128  # bwrap, as init, exits 128+N for signal N
        if sig is None and "exit" not in status and not timed_out:
            raise SandboxError(f"sandbox bootstrap died without a status (rc={rc}): "
                               f"{err[-500:]}")
        returncode = -sig if sig else status.get("exit", -signal.SIGKILL)
        if timed_out:
            return returncode, "wall_time"
        if sig == signal.SIGKILL and cgroups.oom_killed():
            return returncode, "memory"
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL
                                     and time.monotonic() - t0 >= limits.cpu_seconds):
            return returncode, "cpu_time"
        if sig == signal.SIGXFSZ:
            return returncode, "file_size"
        return returncode, (f"signal {signal.Signals(sig).name}" if sig else None)

    def _populate(self, work: str, files, limits: Limits) -> None:
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
        size = sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(work)
                   for n in names)
        if self.isolation.disk and size > limits.disk_bytes:
            raise ValueError(f"sandbox files hold {size} bytes, more than the work dir's "
                             f"quota Limits.disk_bytes={int(limits.disk_bytes)}")

    def _spec(self, run_dir, work, argv, limits, uid, cgroups, extra_env) -> dict:
        cpu = max(1, int(limits.cpu_seconds + 0.999))
        userns = self.isolation.mode == "namespaces" and not self._root
        # In our own user namespace the bootstrap and the namespace's init count too.
        nproc = int(limits.max_processes) + (SANDBOX_PROCESSES if userns else 0)
        rlimits = {
            "RLIMIT_CPU": (cpu, cpu + 1),
            "RLIMIT_AS": (int(limits.memory_bytes),) * 2,
            "RLIMIT_FSIZE": (int(limits.file_size_bytes),) * 2,
            "RLIMIT_NOFILE": (int(limits.max_open_files),) * 2,
            "RLIMIT_CORE": (0, 0),
        }
        if uid is not None or userns:  # a per-uid count: a cap only where the uid is ours alone
            rlimits["RLIMIT_NPROC"] = (nproc, nproc)
        pybin = os.path.dirname(self.python)
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
        disk = int(limits.disk_bytes) if self.isolation.disk else 0
        return {"flags": flags, "newroot": os.path.join(run_dir, "root"), "work": work,
                "disk_bytes": disk, "read_back": [], "read_back_bytes": 0,
                "ro_paths": self._ro_paths, "rlimits": rlimits, "uid": uid, "argv": argv,
                "env": env, "cgroup_procs": cgroups.procs, "status_fd": -1, "channel_fd": -1}

    def _bwrap_argv(self, work: str, env: dict) -> list[str]:
        a = [self._bwrap, "--unshare-all", "--die-with-parent", "--new-session",
             "--cap-drop", "ALL"]
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


def _read_back(work: str, read_back: Sequence[str], cap: int) -> dict[str, str]:
    """Work-dir files on the host (modes without a tmpfs work dir). The child may have
    planted symlinks (also as parent dirs): read only what really lies inside the work dir."""
    back = {}
    for rel in read_back:
        p = os.path.join(work, _safe_relpath(rel))
        if os.path.realpath(p).startswith(work + os.sep) and os.path.isfile(p):
            with open(p, "rb") as f:
                back[rel] = f.read(cap).decode("utf-8", "replace")
    return back


def _warn_once(msg: str, emit=None) -> None:
    with _logged_lock:
        if msg in _logged:
            return
        _logged.add(msg)
    (emit or log.warning)(msg)


@functools.cache
def default_sandbox(mode: str = "auto") -> Sandbox:
    """One shared `Sandbox(SandboxConfig(mode=mode))` per process and mode, so the isolation
    probe runs (and logs) once. Raises `SandboxError`, naming what is missing and how to get
    it, when `mode` cannot work here; "auto" never resolves to "none"."""
    return Sandbox(SandboxConfig(mode=mode))
