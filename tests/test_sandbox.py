"""The sandbox contains real escape attempts: reading/writing outside, network, fork bomb, runaway
CPU, huge allocations and huge files, and processes that leave the process group.

Each escape test runs under the strongest isolation this machine allows (`Sandbox()`), plus
bubblewrap when it is installed (or pointed to by LOCOJAX_TEST_BWRAP). A test is skipped, with
the reason, only when the active isolation does not claim the guarantee under test. Limits are
tiny (8 processes, 1-2 CPU seconds, a few seconds of wall time) so the aggressive tests cannot
hurt the machine; `test_process_cap_probe` checks the process cap with a bounded loop first.
"""

import os
import shutil
import signal
import socket
import sys
import time

import pytest

from locojax.envs.sandbox import Limits, Sandbox, SandboxConfig, SandboxError, SandboxResult

SMALL = Limits(cpu_seconds=2, wall_seconds=8, memory_bytes=512 << 20, file_size_bytes=1 << 20,
               max_processes=8, max_output_bytes=8 << 10)

_BWRAP = os.environ.get("LOCOJAX_TEST_BWRAP") or shutil.which("bwrap")
_MODES = ["auto"] + (["bwrap"] if _BWRAP else [])


@pytest.fixture(scope="module", params=_MODES)
def sb(request) -> Sandbox:
    return Sandbox(SandboxConfig(mode=request.param, bwrap_path=_BWRAP), SMALL)


def _uids_alive(uid: int) -> list[int]:
    """Host pids of processes running as `uid`."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("Uid:") and int(line.split()[1]) == uid:
                            out.append(int(pid))
            except OSError:
                pass
    return out


def _require(sb: Sandbox, guarantee: str):
    if not getattr(sb.isolation, guarantee):
        pytest.skip(f"active isolation does not provide {guarantee}: {sb.isolation.describe()}")


# -- plain behaviour ------------------------------------------------------------------------------


def test_isolation_is_probed_and_described(sb):
    iso = sb.isolation
    assert iso.mode in ("namespaces", "bwrap", "none")
    desc = iso.describe()
    assert f"mode={iso.mode}" in desc and "rlimits" in desc
    if iso.mode != "none":
        assert iso.filesystem and iso.network and iso.pid


def test_runs_argv_and_source_with_files_and_read_back(sb):
    r = sb.run([sys.executable, "-c", "import sys; print(open('data/in.txt').read().upper()); "
                "sys.stderr.write('warn'); open('out.txt', 'w').write('42')"],
               files={"data/in.txt": "hello"}, read_back=["out.txt", "absent.txt"])
    assert isinstance(r, SandboxResult)
    assert (r.returncode, r.stdout, r.stderr) == (0, "HELLO\n", "warn")
    assert r.files == {"out.txt": "42"} and r.ok and not r.timed_out and r.killed_reason is None
    r = sb.run("import os, sys\nprint(os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])\n"
               "sys.exit(3)")
    assert r.returncode == 3 and r.stdout == "True\n" and not r.ok


def test_files_from_directory(sb, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("X = 7\n")
    r = sb.run("from pkg.m import X\nprint(X * 6)", files=tmp_path)
    assert r.stdout == "42\n"


def test_output_is_truncated_keeping_head_and_tail(sb):
    r = sb.run("print('HEAD' + 'x' * 100000 + 'TAIL')")
    assert len(r.stdout.encode()) < SMALL.max_output_bytes + 100
    assert r.stdout.startswith("HEAD") and r.stdout.rstrip().endswith("TAIL")
    assert "bytes truncated" in r.stdout


def test_bad_input_is_rejected(sb):
    with pytest.raises(ValueError, match="relative"):
        sb.run(["true"], files={"../evil.py": "x"})
    with pytest.raises(ValueError, match="relative"):
        sb.run(["true"], files={"/etc/evil": "x"})
    with pytest.raises(ValueError, match="non-empty list"):
        sb.run([])
    with pytest.raises(ValueError, match="does not exist"):
        sb.run(["true"], files="/nonexistent/dir")
    with pytest.raises(ValueError, match="cpu_seconds"):
        Limits(cpu_seconds=-1)
    with pytest.raises(ValueError, match="mode"):
        SandboxConfig(mode="docker")


def test_missing_executable_is_reported(sb):
    if sb.isolation.mode == "bwrap":  # bwrap itself reports the failed exec, as the child
        r = sb.run(["no-such-binary-xyz"])
        assert r.returncode != 0 and "no-such-binary-xyz" in r.stderr
        return
    with pytest.raises(SandboxError, match="no-such-binary"):
        sb.run(["no-such-binary-xyz"])


# -- escape attempts ------------------------------------------------------------------------------


def test_reading_a_planted_file_fails(sb, tmp_path):
    _require(sb, "filesystem")
    secret_dir = tmp_path / "planted"
    secret_dir.mkdir()
    secret = secret_dir / "secret.txt"
    secret.write_text("TOP-SECRET-7731")
    for p in (tmp_path, secret_dir):  # world-readable, so only the sandbox can hide it
        os.chmod(p, 0o755)
    os.chmod(secret, 0o644)
    code = (f"import os\np = {str(secret)!r}\nprint('exists', os.path.exists(p))\n"
            "try:\n    print(open(p).read())\nexcept OSError as e:\n    print('denied', e)\n"
            "print('home', sorted(os.listdir('/root')) if os.path.isdir('/root') else None)")
    r = sb.run(code)
    assert r.returncode == 0, r.stderr
    assert "exists False" in r.stdout and "denied" in r.stdout
    assert "TOP-SECRET-7731" not in r.stdout + r.stderr


def test_writing_outside_fails(sb, tmp_path):
    _require(sb, "filesystem")
    target_dir = tmp_path / "open"
    target_dir.mkdir()
    os.chmod(tmp_path, 0o777)
    os.chmod(target_dir, 0o777)  # even an unprivileged uid could write here without the sandbox
    targets = [str(target_dir / "pwned.txt"), "/tmp/locojax-pwned.txt",
               os.path.join(os.path.dirname(sys.executable), "pwned")]
    code = (f"import os\nfor p in {targets!r}:\n    try:\n"
            "        open(p, 'w').write('x')\n        print('WROTE', p)\n"
            "    except OSError as e:\n        print('blocked', p, e.errno)\n"
            "open('inside.txt', 'w').write('ok')\nprint(os.getcwd())")
    r = sb.run(code, read_back=["inside.txt"])
    assert r.returncode == 0, r.stderr
    assert "WROTE" not in r.stdout and r.stdout.count("blocked") == len(targets)
    for p in targets:
        assert not os.path.exists(p), p
    assert r.files == {"inside.txt": "ok"}  # the work dir itself stays writable
    assert not os.path.exists(r.stdout.split()[-1])  # and is removed after the run


def test_network_is_unreachable(sb):
    _require(sb, "network")
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = ("import socket\nfor host in ('127.0.0.1', '10.255.255.1'):\n"
            "    s = socket.socket(); s.settimeout(2)\n"
            f"    try:\n        s.connect((host, {port})); print('CONNECTED', host)\n"
            "    except OSError as e:\n        print('failed', host, e.errno)\n")
    try:
        r = sb.run(code)
        with pytest.raises(socket.timeout):
            server.accept()  # the test's server never sees a connection
    finally:
        server.close()
    assert r.returncode == 0, r.stderr
    assert "CONNECTED" not in r.stdout and r.stdout.count("failed") == 2


def test_process_cap_probe(sb):
    """Harmless check of the cap before the fork bomb: 20 sleepers asked, fewer than 8 start."""
    code = ("import subprocess\nps, err = [], None\nfor _ in range(20):\n    try:\n"
            "        ps.append(subprocess.Popen(['sleep', '5']))\n    except OSError as e:\n"
            "        err = e\n        break\nprint(len(ps), type(err).__name__)\n"
            "for p in ps:\n    p.kill()\n")
    r = sb.run(code)
    started, err = r.stdout.split()
    assert 0 < int(started) < SMALL.max_processes, r.stdout
    assert err == "BlockingIOError"


def test_fork_bomb_is_contained(sb):
    bomb = ("import os, time\nprint(os.getuid(), flush=True)\nwhile True:\n    try:\n"
            "        os.fork()\n    except OSError:\n        time.sleep(0.01)\n")
    limits = Limits(cpu_seconds=1, wall_seconds=3, max_processes=8)
    t0 = time.monotonic()
    r = sb.run(bomb, limits=limits)
    assert time.monotonic() - t0 < 10
    assert r.killed_reason in ("wall_time", "cpu_time"), r
    uid = int(r.stdout.split()[0])
    if sb.isolation.uid:
        assert _uids_alive(uid) == []  # every forked process is gone
    assert sb.run("print('alive')").stdout == "alive\n"  # and the machine carries on


def test_process_that_leaves_the_group_is_killed(sb, tmp_path):
    """A grandchild that calls setsid (new process group) still dies with the run."""
    _require(sb, "pid")
    code = ("import os, subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); "
            "time.sleep(60)'])\nprint(os.getuid(), flush=True)\ntime.sleep(0.3)\n")
    r = sb.run(code)
    assert r.returncode == 0, r.stderr
    if sb.isolation.uid:
        time.sleep(0.2)
        assert _uids_alive(int(r.stdout.split()[0])) == []


def test_cpu_loop_is_killed_at_the_cpu_limit(sb):
    t0 = time.monotonic()
    r = sb.run("while True:\n    pass\n", limits=Limits(cpu_seconds=1, wall_seconds=10))
    assert time.monotonic() - t0 < 12
    assert r.killed_reason == "cpu_time", r
    assert r.returncode in (-signal.SIGXCPU, -signal.SIGKILL)


def test_sleeping_loop_is_killed_at_the_wall_limit(sb):
    t0 = time.monotonic()
    r = sb.run("import time\nprint('start', flush=True)\nwhile True:\n    time.sleep(0.05)\n",
               limits=Limits(cpu_seconds=5, wall_seconds=2))
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.killed_reason == "wall_time" and r.returncode == -signal.SIGKILL
    assert 1.9 < elapsed < 5 and r.stdout == "start\n"


def test_huge_allocation_fails_inside_the_child(sb):
    r = sb.run("try:\n    x = bytearray(10 * 2**30)\n    print('ALLOCATED')\n"
               "except MemoryError:\n    print('MemoryError')\n")
    assert r.returncode == 0 and r.stdout == "MemoryError\n"


def test_huge_file_write_is_stopped(sb):
    code = ("import os\nf = open('big.bin', 'wb')\ntry:\n    for _ in range(1024):\n"
            "        f.write(b'x' * (1 << 20))\n        f.flush()\n"
            "except OSError as e:\n    print('stopped', e.errno)\n"
            "f.close()\nprint(os.path.getsize('big.bin'), os.getcwd())\n")
    r = sb.run(code)
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    assert words[0] == "stopped" and words[1] == "27"  # EFBIG
    assert int(words[2]) <= SMALL.file_size_bytes
    assert not os.path.exists(words[3])  # the work dir, with the file, is gone


def test_none_mode_still_enforces_limits():
    sb = Sandbox(SandboxConfig(mode="none"), SMALL)
    assert not sb.isolation.filesystem and not sb.isolation.network
    assert "NOT isolated" in sb.isolation.describe()
    r = sb.run("try:\n    bytearray(10 * 2**30)\nexcept MemoryError:\n    print('MemoryError')\n")
    assert r.stdout == "MemoryError\n"
    r = sb.run("import time\nwhile True:\n    time.sleep(0.05)\n", limits=Limits(wall_seconds=1))
    assert r.timed_out


def test_extra_read_only_paths(tmp_path):
    data = tmp_path / "shared data"  # a space exercises the mountinfo octal escapes
    data.mkdir()
    (data / "x.txt").write_text("visible")
    for p in (tmp_path, data):
        os.chmod(p, 0o755)
    os.chmod(data / "x.txt", 0o644)
    sb = Sandbox(SandboxConfig(ro_paths=(str(data),)), SMALL)
    _require(sb, "filesystem")
    code = (f"p = {str(data / 'x.txt')!r}\nprint(open(p).read())\ntry:\n"
            "    open(p, 'w')\nexcept OSError as e:\n    print('blocked', e.errno)\n")
    r = sb.run(code)
    assert r.stdout.split() == ["visible", "blocked", "30"]  # EROFS, even for root-owned files
    assert (data / "x.txt").read_text() == "visible"


def test_read_back_does_not_follow_planted_symlinks(sb, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("HOST-ONLY")
    code = (f"import os\nos.symlink({str(secret)!r}, 'link.txt')\n"
            f"os.symlink({str(tmp_path)!r}, 'dir')\nopen('real.txt', 'w').write('fine')\n")
    r = sb.run(code, read_back=["link.txt", "dir/secret.txt", "real.txt"])
    assert r.returncode == 0, r.stderr
    assert r.files == {"real.txt": "fine"}
