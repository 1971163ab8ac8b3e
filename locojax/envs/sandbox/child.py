"""The parent's side of one sandboxed child: start the bootstrap, read its streams, its
status and its private channel until the wall clock, kill what is left, remove its files
(see `locojax.envs.sandbox`; `runner.Sandbox.run` drives these)."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys

from locojax.envs.sandbox import bootstrap

CHANNEL_CAP = 4 << 20  # bytes kept of the private channel; beyond it the channel is void
STATUS_CAP = 64 << 20  # the status pipe: a few JSON lines, and read-back files from a tmpfs


class Tail:
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


class Head:
    """The first `cap` bytes of a stream; past them the stream is void (`value()` is None)."""

    def __init__(self, cap: int):
        self.cap, self.data, self.over = cap, bytearray(), False

    def add(self, data: bytes) -> None:
        self.over = self.over or len(self.data) + len(data) > self.cap
        if not self.over:
            self.data += data

    def value(self) -> bytes | None:
        return None if self.over else bytes(self.data)


def launch(spec: dict, deadline: float, output_cap: int, channel: bool, warn):
    """Run the bootstrap with `spec` until it ends or `deadline` (monotonic) passes:
    (rc, stdout, stderr, channel bytes or None, timed_out, status dict). The status pipe is
    drained while the run goes on (it may carry read-back files); `warn` gets its warnings."""
    r, w = os.pipe()
    cr, cw = os.pipe() if channel else (-1, -1)
    spec["status_fd"], spec["channel_fd"] = w, cw
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", os.path.abspath(bootstrap.__file__),
             json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(w,) + ((cw,) if channel else ()), start_new_session=True, env={},
            close_fds=True)
    finally:
        os.close(w)
        if channel:
            os.close(cw)
    extra = {r: Head(STATUS_CAP)} | ({cr: Head(CHANNEL_CAP)} if channel else {})
    try:
        out, err, timed_out = _collect(proc, deadline, output_cap, extra)
        if timed_out:
            killpg(proc.pid)
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            killpg(proc.pid)
            rc = proc.wait()
        if not timed_out:  # what is left after an exit; every writer is dead, never blocks
            _drain(extra)
    finally:
        for fd in extra:
            os.close(fd)
        killpg(proc.pid)  # anything still in the group (mode "none" leftovers)
    lines = (extra[r].value() or b"").decode(errors="replace").splitlines()
    return (rc, out.text(), err.text(), extra[cr].value() if channel else None, timed_out,
            _status(lines, warn))


def _status(lines: list[str], warn) -> dict:
    status: dict = {}
    for line in lines:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "warning" in msg:
            warn(f"sandbox: {msg['warning']}")
        elif "error" in msg and "error" not in status:
            status["error"] = msg["error"]
        else:
            status.update({k: v for k, v in msg.items() if k != "error"})
    return status


def _drain(extra: dict) -> None:
    for fd, sink in extra.items():
        os.set_blocking(fd, False)
        try:
            while data := os.read(fd, 1 << 16):
                sink.add(data)
        except BlockingIOError:
            pass


def _collect(proc, deadline: float, cap: int, extra: dict):
    """Read stdout/stderr (and the fds of `extra` into their sinks) until all close or the
    deadline passes; True if it passed."""
    import time

    out, err = Tail(cap), Tail(cap)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    for fd, sink in extra.items():
        sel.register(fd, selectors.EVENT_READ, sink)
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


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid`: kill(-1) from a process running as that uid."""
    subprocess.run([sys.executable, "-I", "-S", "-c",
                    "import os, signal\ntry: os.kill(-1, signal.SIGKILL)\nexcept OSError: pass"],
                   user=uid, group=uid, extra_groups=[], env={}, timeout=10, check=False,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def remove_tree(path: str) -> str | None:
    """Remove a run's dir, whatever the code did to it: directories it made unreadable or
    unwritable (`chmod 000`: `rmtree` alone left them, and any setuid file inside, behind)
    get their owner's rights back first, and every setuid or setgid bit is cleared before
    anything is removed. None, or what is left and why."""
    if not os.path.lexists(path):
        return None
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass
    for dirpath, dirnames, filenames in os.walk(path):
        for d in [dirpath] + [os.path.join(dirpath, n) for n in dirnames]:
            if not os.path.islink(d):
                try:
                    os.chmod(d, 0o700)  # before os.walk lists it (top-down)
                except OSError:
                    pass
        for f in (os.path.join(dirpath, n) for n in filenames):
            try:  # first, so that even a file rmtree fails on is no setuid binary
                mode = os.lstat(f).st_mode
                if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                    os.chmod(f, stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID))
            except OSError:
                pass
    try:
        shutil.rmtree(path)
    except OSError as e:
        return f"{path}: {e}"
    return None
