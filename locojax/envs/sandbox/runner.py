"""The parent side of the sandbox: `Sandbox` and its helpers (see `locojax.envs.sandbox`)."""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from locojax.envs.sandbox import bootstrap
from locojax.envs.sandbox.bootstrap import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS,
                                            CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWUTS)
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
    """Runs commands in isolated children; see `locojax.envs.sandbox` for what "isolated" means.

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
                [sys.executable, "-I", "-S", "-B", os.path.abspath(bootstrap.__file__),
                 json.dumps(spec)],
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
