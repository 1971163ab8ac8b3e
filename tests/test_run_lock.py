"""One run per run directory (issue 38): two runs on one directory interleaved
`metrics.jsonl` and one died with StepAlreadyExistsError. A second run is refused naming the
holder's host and pid; a lock left by a killed holder on this host is taken over with a
warning; only process 0 of a multi-host run takes it."""

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import types

import pytest

from locojax.train import loop, run_lock
from locojax.train.run_lock import LOCK_FILE, RunDirLocked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLDER = """
import sys, time
from locojax.train import run_lock
lock = run_lock.acquire(sys.argv[1])  # held while referenced
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch):
    """A held lock is refused at once (a run waits HELD_WAIT_S for a dying holder)."""
    monkeypatch.setattr(run_lock, "HELD_WAIT_S", 0.0)


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/run."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run")], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_run_is_refused_naming_the_holder(tmp_path, holder):
    with pytest.raises(RunDirLocked, match=rf"in use by another run: pid {holder.pid} on host "
                                           rf"{socket.gethostname()} \(since "):
        run_lock.acquire(str(tmp_path / "run"))


def test_a_killed_holders_lock_is_taken_over_with_a_warning(tmp_path, holder, caplog):
    holder.kill()
    holder.wait()
    caplog.set_level(logging.WARNING, logger="locojax")
    lock = run_lock.acquire(str(tmp_path / "run"))
    assert f"taking over the stale lock {tmp_path / 'run' / LOCK_FILE}" in caplog.text
    assert f"pid {holder.pid} on host {socket.gethostname()}" in caplog.text
    record = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    lock.release()  # a clean release leaves no name: the next run starts without a warning
    caplog.clear()
    run_lock.acquire(str(tmp_path / "run")).release()
    assert "stale" not in caplog.text


def test_a_lock_named_from_another_host_is_not_taken_over(tmp_path):
    """Its flock may be free only because the filesystem does not share locks across
    hosts: refused, saying how to clear it if that process is gone."""
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 7}))
    with pytest.raises(RunDirLocked, match=r"names pid 7 on host elsewhere, which cannot be "
                                           r"checked from .* delete .*run\.lock"):
        run_lock.acquire(str(tmp_path))


def test_start_takes_the_lock_on_process_0_only(tmp_path, holder, monkeypatch):
    """`loop.start` is refused before it reads, truncates or compiles anything; the other
    hosts of a multi-host run write their checkpoint shards under process 0's lock."""
    from locojax.train.config import demo

    cfg = dataclasses.replace(demo(), run_dir=str(tmp_path / "run"))
    monkeypatch.setattr(loop, "check_run", lambda *a: None)
    monkeypatch.setattr(loop, "_start", lambda cfg, wiring, lock: lock)  # what start holds
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    host = lambda i: types.SimpleNamespace(host=types.SimpleNamespace(  # noqa: E731
        process_id=i, num_processes=2))
    with pytest.raises(RunDirLocked, match=f"pid {holder.pid}"):
        loop.start(cfg, host(0))
    assert loop.start(cfg, host(1)) is None  # not refused, and holds nothing
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    holder.kill()
    holder.wait()
    lock = loop.start(cfg, host(0))
    assert lock.held
    lock.release()
