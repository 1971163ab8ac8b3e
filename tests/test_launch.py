"""`locojax launch`: host-prefixed logs, real cross-host collectives, clean shutdown."""

import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from locojax.commands.launch import LaunchArgs, launch
from locojax import distributed
from locojax.distributed import cpu_shares

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_hosts_all_reduce_over_gloo():
    out = subprocess.run(
        [sys.executable, "-m", "locojax.cli", "launch", "--hosts", "2", "--devices-per-host", "2",
         "--heartbeat-s", "10", "--", "devices"],  # pinned by default
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for host in (0, 1):
        assert f"[host {host}] process {host}/2: 2 local / 4 global cpu devices" in out.stdout
    assert out.stdout.count("all-reduce 4102 (expected 4102)") == 2
    shares = cpu_shares(2, sorted(os.sched_getaffinity(0)))
    for host, share in enumerate(shares):  # each host pinned to its own CPUs (when there are 2+)
        if share is not None:
            assert f"[host {host}] " in out.stdout and f"cpus {share}\n" in out.stdout


def test_cpu_shares_split_evenly_and_never_overlap():
    assert cpu_shares(2, [0, 1, 2, 3]) == ["0,1", "2,3"]
    assert cpu_shares(3, [0, 1, 2, 3]) == ["0", "1", "2"]  # the odd CPU is left idle
    assert cpu_shares(4, [0, 1]) == [None] * 4  # more hosts than CPUs: no pinning


def _script(body: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(body)]


def test_hosts_are_given_their_cpu_share_by_default_and_none_when_asked():
    child = _script("""
        import os
        print("cpus", os.environ.get("LOCOJAX_CPUS", "none"), flush=True)
    """)
    shares = cpu_shares(2, sorted(os.sched_getaffinity(0)))
    for args, expect in ((LaunchArgs(hosts=2), shares),
                         (LaunchArgs(hosts=2, pin_cpus=False), [None, None])):
        out = io.StringIO()
        assert launch(args, child, out=out) == 0
        for host, share in enumerate(expect):
            assert f"[host {host}] cpus {share or 'none'}" in out.getvalue()


def test_probes_place_their_processes_as_launch_places_hosts(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    env = {"A": "1", distributed.ENV_CPUS: "0"}  # a surrounding launch's share is dropped
    assert distributed.placed(env, 2) == [{"A": "1", distributed.ENV_CPUS: "0"},
                                          {"A": "1", distributed.ENV_CPUS: "1"}]
    assert distributed.placed(env, 4) == [{"A": "1"}] * 4  # more than the CPUs: unpinned


def test_one_host_dying_stops_the_others_and_returns_its_code(tmp_path):
    pidfile = tmp_path / "survivor.pid"
    child = _script(f"""
        import os, sys, time
        if os.environ["LOCOJAX_PROCESS_ID"] == "1":
            print("failing now", flush=True)
            sys.exit(3)
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """)
    out = io.StringIO()
    start = time.monotonic()
    code = launch(LaunchArgs(hosts=2, grace_s=2.0), child, out=out)
    assert code == 3
    assert time.monotonic() - start < 30
    assert "[host 1] failing now" in out.getvalue()
    assert "host 1 exited with 3" in out.getvalue()
    survivor = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(survivor, 0)


def test_ctrl_c_stops_every_host(tmp_path):
    """SIGINT to the launcher reaches every host; hosts that ignore it are killed after grace."""
    host = tmp_path / "host.py"
    host.write_text(textwrap.dedent(f"""
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stubborn host: needs the SIGKILL
        pid_dir = {str(tmp_path)!r}
        open(os.path.join(pid_dir, os.environ["LOCOJAX_PROCESS_ID"]), "w").write(str(os.getpid()))
        time.sleep(120)
    """))
    # The driver stands for `locojax launch` in a terminal, where Ctrl-C raises
    # KeyboardInterrupt. A test run started in the background (nohup, `&` in a script) has
    # SIGINT ignored, which children inherit: restore the terminal's default first.
    driver = textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from locojax.commands.launch import LaunchArgs, launch
        child = [sys.executable, {str(host)!r}]
        sys.exit(launch(LaunchArgs(hosts=2, grace_s=1.0), child))
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    pid_files = [tmp_path / "0", tmp_path / "1"]
    while not all(f.exists() and f.read_text() for f in pid_files) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(f.read_text()) for f in pid_files]
    assert len(pids) == 2
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, stdout
    assert "interrupted; stopping every host" in stdout
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
