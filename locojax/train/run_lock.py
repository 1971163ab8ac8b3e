"""One run per run directory: a lock file that names its holder.

Two runs on one `--run-dir` interleaved `metrics.jsonl` and one died with Orbax's
`StepAlreadyExistsError` (issue 38). The run's process 0 writes the run directory's own
files (`metrics.jsonl`, `perf.jsonl`, `final_model/`, setting checkpoints aside), so it, and
only it, holds `run_dir/run.lock` for as long as its `Trainer` lives. The other hosts of a
multi-host run write their checkpoint shards under the lock their process 0 holds, and are
never refused by it.

The lock is `flock` on the file (released by the kernel when the holder dies, also over NFS,
which maps it to a POSIX lock), and the file holds `{"host", "pid", "since"}` for the
message. So:

- held: `flock` fails for `HELD_WAIT_S` (a holder being killed, e.g. a Ray actor that is
  being replaced, takes a moment to let go), and the run is refused naming the holder's
  host and pid;
- stale: `flock` succeeds but the file still names a holder (killed before it could clear
  the file). On this host a process that held the lock is gone once its `flock` is free, so
  the lock is taken over with a warning. Named from another host, `flock` alone cannot be
  trusted (a filesystem without cross-host locks grants every host), so the run is refused,
  saying to delete the file if that process is gone.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
HELD_WAIT_S = 10.0
"""How long a held lock is waited for before the run is refused."""


class RunDirLocked(RuntimeError):
    """Another run holds (or may hold) the run directory."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _flock(fd: int, wait_s: float) -> bool:
    """Take the exclusive flock of `fd`, trying for up to `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)


class RunLock:
    """The lock of one run directory, held from `acquire` until `release` (or the process
    ends)."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(os.path.abspath(run_dir), LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _flock(fd, HELD_WAIT_S):
                raise RunDirLocked(f"{os.path.dirname(self.path)} is in use by another run: "
                                   f"{self._describe(self._holder(fd))} holds {self.path}. "
                                   "Wait for it to end, or choose another --run-dir") from None
            holder = self._holder(fd)
            if holder:
                self._stale(holder)
            me = {"host": socket.gethostname(), "pid": os.getpid(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _stale(self, holder: dict) -> None:
        """The file names a holder whose `flock` is gone: take over, or refuse (see above)."""
        who = self._describe(holder)
        if holder.get("host") != socket.gethostname():
            raise RunDirLocked(
                f"{self.path} names {who}, which cannot be checked from "
                f"{socket.gethostname()}: another run may be using "
                f"{os.path.dirname(self.path)}. If that process is gone, delete {self.path}; "
                "else wait for it to end, or choose another --run-dir")
        pid = holder.get("pid")
        gone = "is gone" if not (isinstance(pid, int) and _alive(pid)) else \
            "no longer holds it (the pid is another process now)"
        log.warning("taking over the stale lock %s: its holder, %s, %s (killed?)", self.path,
                    who, gone)

    @staticmethod
    def _holder(fd: int) -> dict:
        try:
            data = os.pread(fd, 4096, 0)
            holder = json.loads(data) if data.strip() else {}
        except ValueError:  # a half-written file: someone held it, we cannot say who
            holder = {"host": "an unknown host", "pid": "unknown"}
        return holder if isinstance(holder, dict) else {}

    @staticmethod
    def _describe(holder: dict) -> str:
        if not holder:
            return "a process that has not yet written its name"
        return (f"pid {holder.get('pid')} on host {holder.get('host')}"
                + (f" (since {holder['since']})" if holder.get("since") else ""))

    def release(self) -> None:
        """Clear the holder's name and unlock (a later run starts without a warning)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the last descriptor releases the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def acquire(run_dir: str) -> RunLock:
    """Hold `run_dir`'s lock, or raise `RunDirLocked` naming the holder."""
    return RunLock(run_dir).acquire()
