"""The sandbox contains real escape attempts, and each guarantee is asserted, never skipped.

Every escape test runs under `auto` (namespaces here, or bubblewrap when it is installed or
pointed to by LOCOJAX_TEST_BWRAP), and the ones whose guarantee mode "none" also claims run
under "none" too. A host where no isolation works fails these tests, with the reason: `auto`
never resolves to "none", so a test cannot pass by meeting an unisolated child.

`make test` runs this file twice: as the caller (root in CI) and as `nobody` (the non-root
path: a user namespace, no writable cgroup), see tests/sandbox_unprivileged.sh.

Each test below fails if its defence is removed (named in its docstring). Limits are tiny (8
processes, 1-2 CPU seconds, a few seconds of wall time, 128-512 MiB) so that the aggressive
tests cannot hurt the machine; `test_process_cap_probe` checks the process cap with a bounded
loop before the fork bomb runs.
"""

import glob
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import locojax
from locojax.envs.sandbox import (HOW_TO_ISOLATE, Limits, Sandbox, SandboxConfig, SandboxError,
                                  SandboxResult)

SMALL = Limits(cpu_seconds=2, wall_seconds=8, memory_bytes=512 << 20, file_size_bytes=1 << 20,
               max_processes=8, max_output_bytes=8 << 10)
ROOT = os.geteuid() == 0

_BWRAP = os.environ.get("LOCOJAX_TEST_BWRAP") or shutil.which("bwrap")
_MODES = ["auto"] + (["bwrap"] if _BWRAP else [])


def _python_for_other_uids() -> str:
    """An interpreter a fresh unprivileged uid can run: mode "none" as root runs the code as
    one, and this venv's interpreter may live under /root (mode 0700)."""
    for p in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        real = os.path.realpath(p)
        parents = [real] + [str(d) for d in Path(real).parents]
        if os.path.exists(real) and os.stat(real).st_mode & 0o001 and all(
                os.stat(d).st_mode & 0o001 for d in parents[1:]):
            return p
    pytest.fail("no interpreter runnable by an unprivileged uid (needed by mode none as root)")


@pytest.fixture(scope="module", params=_MODES)
def sb(request) -> Sandbox:
    return Sandbox(SandboxConfig(mode=request.param, bwrap_path=_BWRAP), SMALL)


@pytest.fixture(scope="module")
def none_sb() -> Sandbox:
    return Sandbox(SandboxConfig(mode="none", python=_python_for_other_uids()), SMALL)


@pytest.fixture(scope="module", params=["isolated", "none"])
def any_sb(request, sb, none_sb) -> Sandbox:
    """Guarantees every mode has (no capabilities, a non-zero uid, the limits)."""
    return sb if request.param == "isolated" else none_sb


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


def _still_there_after(uid: int, seconds: float = 5.0) -> list[int]:
    """`_uids_alive(uid)` once it is empty, or after `seconds`. A run's killed processes may
    linger a moment after `run` returns: the pid namespace's init reaps them as it exits,
    after the parent has seen it die (seen as zombies at a load average of 17)."""
    deadline = time.monotonic() + seconds
    while (alive := _uids_alive(uid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


# -- modes ----------------------------------------------------------------------------------------


def test_auto_is_isolated_and_says_what_it_enforces(sb):
    """`auto` resolved to a mode with every namespace guarantee, and a process and memory cap,
    for root and non-root alike. bwrap (by name only) says it has no disk quota, and non-root
    without a cgroup no caps: `auto` would refuse it."""
    iso = sb.isolation
    assert iso.mode in ("namespaces", "bwrap")
    assert iso.filesystem and iso.network and iso.pid
    assert iso.uid == ROOT  # a fresh host uid per run is a root-only guarantee
    if iso.mode == "bwrap":
        desc = iso.describe(SMALL)
        assert not iso.disk and "NOT enforced: " in desc and "disk quota" in \
            desc.split("NOT enforced: ")[1], desc
        return
    assert iso.process_cap in ("cgroup", "rlimit") and iso.memory_cap in ("cgroup", "rlimit")
    desc = iso.describe(SMALL)
    assert f"mode={iso.mode}" in desc and "no capabilities" in desc and "process cap 8" in desc
    assert ("aggregate memory cap 512 MiB" in desc if iso.memory_cap == "cgroup"
            else "aggregate memory bound 8 x 512 MiB" in desc)
    assert "NOT enforced" not in desc or desc.endswith("NOT enforced: per-run uid")


def test_auto_never_resolves_to_none(monkeypatch):
    """With every isolated mode failing, `auto` refuses and says what is missing and how to get
    it; it does not fall back to running the code unisolated."""
    def refuse(self, *a, **k):
        raise SandboxError("unshare: Operation not permitted")

    monkeypatch.setattr(Sandbox, "run", refuse)
    with pytest.raises(SandboxError, match="no sandbox isolation works here") as e:
        Sandbox(SandboxConfig(mode="auto", bwrap_path="/nonexistent/bwrap"))
    msg = str(e.value)
    assert "unshare: Operation not permitted" in msg and HOW_TO_ISOLATE in msg
    assert "--task.sandbox none" in msg and "bubblewrap" in msg and "root" in msg


def test_none_runs_only_by_name_and_says_so_in_one_line(caplog, monkeypatch):
    from locojax.envs.sandbox import runner

    monkeypatch.setattr(runner, "_logged", set())  # said once per process: forget the fixture's
    with caplog.at_level(logging.WARNING, logger="locojax.envs.sandbox"):
        sb = Sandbox(SandboxConfig(mode="none", python=_python_for_other_uids()),
                     Limits(max_processes=7))
    iso = sb.isolation
    assert iso.mode == "none" and not (iso.filesystem or iso.network or iso.pid)
    lines = [r.getMessage() for r in caplog.records if "mode=none" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "asked for by name" in lines[0] and "WITHOUT filesystem, network or pid" in lines[0]
    assert "NOT enforced: filesystem, network, pid" in lines[0]
    if not ROOT:  # no uid of its own, no writable cgroup here: it must not claim caps
        assert iso.process_cap in ("", "cgroup") and "process cap" in iso.describe()


@pytest.mark.skipif(not ROOT, reason="non-root, mode none runs the code as the caller's uid")
@pytest.mark.parametrize("mode", ["none"] + (["bwrap"] if _BWRAP else []))
def test_none_as_root_refuses_an_interpreter_other_uids_cannot_run(tmp_path, mode):
    """As root, mode none runs the code as a fresh unprivileged uid: an interpreter under a
    directory only root may enter (pyenv under /root) cannot start there. The refusal names
    it and its real path, not a failed probe's exit status. So does bwrap, exec'd as that
    uid (it said only "probe failed ... Can't find source path /root/.pyenv/...")."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    python = private / "python3"
    python.write_text(f"#!/bin/sh\nexec {_python_for_other_uids()} \"$@\"\n")
    python.chmod(0o755)
    with pytest.raises(SandboxError, match=f"sandbox mode {mode} does not work here") as e:
        Sandbox(SandboxConfig(mode=mode, python=str(python), bwrap_path=_BWRAP), SMALL)
    assert f"must be able to run {python} (really {python};" in str(e.value)
    assert "SandboxConfig.python" in str(e.value) and "mode" in str(e.value).split(". ")[-1]


# -- plain behaviour ------------------------------------------------------------------------------


def test_runs_argv_and_source_with_files_and_read_back(sb):
    r = sb.run([sys.executable, "-c", "import sys; print(open('data/in.txt').read().upper()); "
                "sys.stderr.write('warn'); open('out.txt', 'w').write('42')"],
               files={"data/in.txt": "hello"}, read_back=["out.txt", "absent.txt"])
    assert isinstance(r, SandboxResult)
    assert (r.returncode, r.stdout, r.stderr) == (0, "HELLO\n", "warn")
    assert r.files == {"out.txt": "42"} and r.ok and not r.timed_out and r.killed_reason is None
    assert r.channel is None
    r = sb.run("import os, sys\nprint(os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])\n"
               "sys.exit(3)")
    assert r.returncode == 3 and r.stdout == "True\n" and not r.ok


def test_private_channel_is_fd_3_and_not_a_file(sb):
    r = sb.run("import os\nos.write(3, b'verdict')\nprint(sorted(os.listdir('.')))",
               channel=True)
    assert r.returncode == 0, r.stderr
    assert r.channel == b"verdict" and r.stdout == "['__sandbox_main__.py']\n"
    r = sb.run("import os\nos.write(3, b'x' * (5 << 20))", channel=True)
    assert r.channel is None  # over its cap: void, never silently cut


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
    with pytest.raises(ValueError, match="auto|namespaces|bwrap|none"):
        SandboxConfig(mode="docker")


def test_missing_executable_is_reported(sb):
    if sb.isolation.mode == "bwrap":  # bwrap itself reports the failed exec, as the child
        r = sb.run(["no-such-binary-xyz"])
        assert r.returncode != 0 and "no-such-binary-xyz" in r.stderr
        return
    with pytest.raises(SandboxError, match="no-such-binary"):
        sb.run(["no-such-binary-xyz"])


# -- privileges -----------------------------------------------------------------------------------

_STATUS = ("import os\nst = dict(l.split(':', 1) for l in open('/proc/self/status')"
           ".read().splitlines())\n"
           "print(*(st[k].split()[0] for k in ('CapInh', 'CapPrm', 'CapEff', 'CapAmb', 'CapBnd',"
           " 'NoNewPrivs')), *os.getresuid(), *os.getresgid())\n")


def test_code_has_no_capability_and_no_uid_0(any_sb):
    """Defence: the inner uid is not 0 and every capability set is emptied before exec.
    Mapping the trainer to inner uid 0 (as before) gives CapEff = 1ff..f here."""
    r = any_sb.run(_STATUS)
    assert r.returncode == 0, r.stderr
    inh, prm, eff, amb, bnd, nnp, *ids = r.stdout.split()
    assert int(inh, 16) == int(prm, 16) == int(eff, 16) == int(amb, 16) == 0, r.stdout
    assert nnp == "1" and all(int(i) != 0 for i in ids), r.stdout
    if any_sb.isolation.mode == "namespaces" or ROOT:  # it had capabilities to give up
        assert int(bnd, 16) == 0, r.stdout


def test_remount_read_write_is_refused(sb):
    """Defence: no capability in the sandbox's mount namespace, and a nested user namespace
    is refused (non-root) or only gets locked mounts. With inner uid 0 (the old mapping) the
    first remount succeeds and the venv's site-packages become writable."""
    target = os.path.realpath(os.path.dirname(sys.executable))
    code = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
MS_REMOUNT, MS_BIND = 32, 4096
def remount(path):
    r = libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND, None)
    return 'REMOUNTED' if r == 0 else 'refused %d' % ctypes.get_errno()
def write(path):
    try:
        open(os.path.join(path, 'pwned'), 'w').write('x')
        return 'WROTE'
    except OSError as e:
        return 'blocked %d' % e.errno
print(remount({target!r}), write({target!r}), remount('/'))
if libc.unshare(0x10000000 | 0x00020000) == 0:  # a nested user + mount namespace
    print('nested', remount({target!r}), write({target!r}))
else:
    print('nested refused', ctypes.get_errno())
"""
    r = sb.run(code)
    assert r.returncode == 0, r.stderr
    assert "REMOUNTED" not in r.stdout and "WROTE" not in r.stdout, r.stdout
    assert r.stdout.count("refused") >= 2 and not os.path.exists(os.path.join(target, "pwned"))


# -- escape attempts ------------------------------------------------------------------------------


def test_reading_a_planted_file_fails(sb, tmp_path):
    """Defence: the fresh root holds only the system paths and the work dir."""
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


def test_projects_files_are_absent(sb):
    """Defence: the project directory (its source, .git, the trainer's run dirs) is not
    mounted; only the interpreter's directories are."""
    project = Path(locojax.__file__).resolve().parent.parent
    probes = [project / "locojax" / "__init__.py", project / "pyproject.toml", project / ".git"]
    code = (f"import os\nfor p in {[str(p) for p in probes]!r}:\n"
            "    print(os.path.exists(p))\n")
    r = sb.run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"] * len(probes), r.stdout
    assert all(p.exists() for p in probes[:2])  # they are there outside


def test_writing_outside_fails(sb, tmp_path):
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


def test_another_runs_work_dir_is_out_of_reach(any_sb):
    """Defence: each run sees only its own work dir (namespaces: its own root, and a tmpfs
    copy of the work dir), or, as root in mode none, owns it alone (a uid per run, mode
    0700). Run A's files hold a secret, on the host while A runs; run B looks for it in every
    sandbox work dir it can name. A is ended by the test (SIGKILL, found by its argv)."""
    token = secrets.token_hex(8)
    pattern = os.path.join(tempfile.gettempdir(), "locojax-sbx-*", "work", "secret.txt")
    holder = threading.Thread(target=any_sb.run, args=(
        [any_sb.python, "-c", "import time\nwhile True: time.sleep(1)", token],),
        kwargs={"files": {"secret.txt": token}, "limits": Limits(wall_seconds=30)})
    holder.start()
    a_pids: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while not a_pids:
            assert time.monotonic() < deadline, "run A never started"
            a_pids = _pids_with_arg(token)
            time.sleep(0.05)
        secret = next(p for p in glob.glob(pattern) if Path(p).read_text() == token)
        if not ROOT and any_sb.isolation.mode == "none":
            return  # the same uid as run A: mode none promises nothing here (security.md)
        code = (f"import glob\nfor p in glob.glob({pattern!r}):\n    try:\n"
                "        print(open(p).read())\n    except OSError as e:\n"
                "        print('denied', e.errno)\n")
        r = any_sb.run(code)
        assert r.returncode == 0, r.stderr
        assert token not in r.stdout, r.stdout
        assert os.path.exists(secret) and _pids_with_arg(token)  # A held it while B looked
    finally:
        for pid in a_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        holder.join()


def _args_still_there_after(arg: str, seconds: float = 5.0) -> list[int]:
    """`_pids_with_arg(arg)` once it is empty, or after `seconds` (as `_still_there_after`)."""
    deadline = time.monotonic() + seconds
    while (alive := _pids_with_arg(arg)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _pids_with_arg(arg: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if arg.encode() in f.read().split(b"\0"):
                    out.append(int(pid))
        except OSError:
            pass
    return out


def test_trainers_environment_is_out_of_reach(any_sb, monkeypatch):
    """Defence: the child's environment is built from scratch, and the trainer's
    /proc/PID/environ is hidden (pid namespace) or another uid's (as root). The child looks in
    its own environment and in every /proc/*/environ it can read."""
    token = secrets.token_hex(8)
    monkeypatch.setenv("LOCOJAX_TEST_SECRET", token)
    code = ("import glob, os\nfound = [k for k, v in os.environ.items() if v == "
            f"{token!r}]\nfor p in glob.glob('/proc/[0-9]*/environ'):\n    try:\n"
            f"        found += [p] if {token!r}.encode() in open(p, 'rb').read() else []\n"
            "    except OSError:\n        pass\nprint('found', found)\n")
    if not ROOT and any_sb.isolation.mode == "none":
        return  # the trainer's own uid: mode none promises nothing here (security.md)
    r = any_sb.run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "found []\n" and token not in r.stderr


def test_network_is_unreachable(sb):
    """Defence: a network namespace with no interface up."""
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


def _claims_no(sb, what: str) -> bool:
    """True when `sb`'s mode does not claim `what` ("process cap", "aggregate memory cap"),
    after checking that its start-up line says so. Only bwrap, asked for by name, non-root
    without a delegated cgroup, lacks them (`auto` refuses such a mode); a fork bomb is not
    run where nothing caps it."""
    if sb.isolation.process_cap if what == "process cap" else sb.isolation.memory_cap:
        return False
    assert sb.isolation.mode == "bwrap" and not ROOT, sb.isolation
    assert what in sb.isolation.describe(SMALL).split("NOT enforced: ")[1]
    return True


def test_process_cap_probe(sb):
    """Harmless check of the cap before the fork bomb: 20 sleepers asked, fewer than 8 start.
    Defence: pids.max or RLIMIT_NPROC of a uid only the run has (without them all 20 start)."""
    if _claims_no(sb, "process cap"):
        return
    code = ("import subprocess\nps, err = [], None\nfor _ in range(20):\n    try:\n"
            "        ps.append(subprocess.Popen(['sleep', '5']))\n    except OSError as e:\n"
            "        err = e\n        break\nprint(len(ps), type(err).__name__)\n"
            "for p in ps:\n    p.kill()\n")
    r = sb.run(code)
    started, err = r.stdout.split()
    assert 0 < int(started) < SMALL.max_processes, r.stdout
    assert err == "BlockingIOError"


def test_fork_bomb_is_contained(sb):
    # Each fork leaves the process group (setsid): only the pid namespace (or, as root, the
    # run's uid) ends them, not the group's kill.
    if _claims_no(sb, "process cap"):
        return
    bomb = ("import os, time\nprint(os.getuid(), flush=True)\nwhile True:\n    try:\n"
            "        if os.fork() == 0:\n            os.setsid()\n"
            "    except OSError:\n        time.sleep(0.01)\n")
    limits = Limits(cpu_seconds=1, wall_seconds=3, max_processes=8)
    token = secrets.token_hex(8)  # in every fork's argv: found by it as non-root too
    t0 = time.monotonic()
    r = sb.run([sb.python, "-c", bomb, token], limits=limits)
    elapsed = time.monotonic() - t0
    assert 0.9 < elapsed < 10  # ended by a limit (1 s CPU or 3 s wall), not at once
    assert r.killed_reason in ("wall_time", "cpu_time"), r
    assert _args_still_there_after(token) == []  # every forked process died
    if sb.isolation.uid:
        assert _still_there_after(int(r.stdout.split()[0])) == []
    assert sb.run("print('alive')").stdout == "alive\n"  # and the machine carries on


def test_memory_bomb_across_processes_stays_under_the_stated_bound(sb):
    """Many processes, each under RLIMIT_AS, together asking for far more than the run's
    memory. Defence: the memory cgroup (aggregate `memory_bytes`) or the process cap (bound
    `max_processes * memory_bytes`). The bomb counts its children still alive holding a
    written 48 MiB block at the end; without either defence all 18 would be (864 MiB, over
    both bounds)."""
    if _claims_no(sb, "aggregate memory cap"):
        return
    limits = Limits(cpu_seconds=5, wall_seconds=12, memory_bytes=128 << 20, max_processes=6)
    chunk, tries = 48 << 20, 3 * limits.max_processes
    code = f"""
import os, signal, time
r, w = os.pipe()
kids = []
for _ in range({tries}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(r)
        try:
            block = b'x' * {chunk}  # written: resident, not only reserved
        except MemoryError:
            os._exit(1)
        os.write(w, b'%d\\n' % os.getpid())
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
os.close(w)
os.set_blocking(r, False)
data, reported, dead = b'', set(), set()
deadline = time.monotonic() + 8  # until every child has reported or died (slow under OOM)
while time.monotonic() < deadline and len(reported | dead) < len(kids):
    try:
        data += os.read(r, 1 << 16)
    except BlockingIOError:
        pass
    reported = {{int(x) for x in data.split()}}
    dead |= {{p for p in kids if p not in dead and os.waitpid(p, os.WNOHANG) != (0, 0)}}
    time.sleep(0.05)
alive = reported - dead
print(len(kids), len(reported), len(alive), flush=True)
for p in set(kids) - dead:
    os.kill(p, signal.SIGKILL)
"""
    r = sb.run(code, limits=limits)
    assert r.returncode == 0, (r.stdout, r.stderr, r.killed_reason)
    forked, reported, alive = map(int, r.stdout.split())
    bound = (limits.memory_bytes if sb.isolation.memory_cap == "cgroup"
             else limits.max_processes * limits.memory_bytes)
    assert 1 <= alive <= reported and alive * chunk <= bound, r.stdout
    assert forked < tries or sb.isolation.memory_cap == "cgroup", r.stdout


def test_process_that_leaves_the_group_is_killed(sb, tmp_path):
    """A grandchild that calls setsid (new process group) still dies with the run. Found by
    a token in its argv, so the check holds non-root too, where the run has no uid of its
    own (by uid only, it passed as nobody with the pid namespace removed)."""
    assert sb.isolation.pid
    token = secrets.token_hex(8)
    code = ("import os, subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); "
            f"time.sleep(60)', {token!r}])\nprint(os.getuid(), flush=True)\ntime.sleep(0.3)\n")
    r = sb.run(code)
    assert r.returncode == 0, r.stderr
    assert _args_still_there_after(token) == []  # it would sleep 60 s if nothing killed it
    if sb.isolation.uid:
        assert _still_there_after(int(r.stdout.split()[0])) == []


def test_cpu_loop_is_killed_at_the_cpu_limit(any_sb):
    t0 = time.monotonic()
    # 60 s of wall clock: at load average 19 on 2 cores the loop got less than 1 CPU second
    # in 10 s and the wall clock ended it (the nobody phase); the CPU limit still ends it first.
    r = any_sb.run("while True:\n    pass\n", limits=Limits(cpu_seconds=1, wall_seconds=60))
    elapsed = time.monotonic() - t0
    assert 0.9 < elapsed < 62  # 1 CPU second at least (the loop burns one core)
    assert r.killed_reason == "cpu_time", r
    assert r.returncode in (-signal.SIGXCPU, -signal.SIGKILL)


def test_sleeping_loop_is_killed_at_the_wall_limit(any_sb):
    """A child that sleeps (no CPU) is ended by the wall clock, not before."""
    t0 = time.monotonic()
    r = any_sb.run("import time\nprint('start', flush=True)\nwhile True:\n    time.sleep(0.05)\n",
                   limits=Limits(cpu_seconds=5, wall_seconds=2))
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.killed_reason == "wall_time" and r.returncode == -signal.SIGKILL
    assert 1.9 < elapsed < 5 and r.stdout == "start\n"


def test_huge_allocation_fails_inside_the_child(any_sb):
    r = any_sb.run("try:\n    x = bytearray(10 * 2**30)\n    print('ALLOCATED')\n"
                   "except MemoryError:\n    print('MemoryError')\n")
    assert r.returncode == 0 and r.stdout == "MemoryError\n"


def test_huge_file_write_is_stopped(any_sb):
    code = ("import os\nf = open('big.bin', 'wb')\ntry:\n    for _ in range(1024):\n"
            "        f.write(b'x' * (1 << 20))\n        f.flush()\n"
            "except OSError as e:\n    print('stopped', e.errno)\n"
            "f.close()\nprint(os.path.getsize('big.bin'), os.getcwd())\n")
    r = any_sb.run(code)
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    assert words[0] == "stopped" and words[1] == "27"  # EFBIG
    assert int(words[2]) <= SMALL.file_size_bytes
    assert not os.path.exists(words[3])  # the work dir, with the file, is gone


def test_extra_read_only_paths(tmp_path):
    data = tmp_path / "shared data"  # a space exercises the mountinfo octal escapes
    data.mkdir()
    (data / "x.txt").write_text("visible")
    for p in (tmp_path, data):
        os.chmod(p, 0o755)
    os.chmod(data / "x.txt", 0o644)
    sb = Sandbox(SandboxConfig(ro_paths=(str(data),)), SMALL)
    assert sb.isolation.filesystem
    code = (f"p = {str(data / 'x.txt')!r}\nprint(open(p).read())\ntry:\n"
            "    open(p, 'w')\nexcept OSError as e:\n    print('blocked', e.errno)\n")
    r = sb.run(code)
    assert r.stdout.split() == ["visible", "blocked", "30"]  # EROFS, even for the owner
    assert (data / "x.txt").read_text() == "visible"


def test_read_back_does_not_follow_planted_symlinks(any_sb, tmp_path):
    """Defence: only regular files really inside the work dir are read back: in the
    bootstrap, inside the run's root (namespaces), and in the parent (`runner._read_back`,
    the other modes). Under `none` too: in namespaces mode the root alone hides the target
    (with the bootstrap's check removed this passed), so only mode none shows the parent's."""
    sb = any_sb
    secret = tmp_path / "secret.txt"
    secret.write_text("HOST-ONLY")
    code = (f"import os\nos.symlink({str(secret)!r}, 'link.txt')\n"
            f"os.symlink({str(tmp_path)!r}, 'dir')\nopen('real.txt', 'w').write('fine')\n")
    r = sb.run(code, read_back=["link.txt", "dir/secret.txt", "real.txt"])
    assert r.returncode == 0, r.stderr
    assert r.files == {"real.txt": "fine"}
