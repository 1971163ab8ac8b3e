"""`locojax launch --hosts N --devices-per-host M -- SUBCOMMAND ...`: N local hosts.

Starts N processes of `locojax SUBCOMMAND ...` on 127.0.0.1, each told its process id and the
coordinator through the environment (read by `locojax.distributed.initialize`). It prefixes
every output line with `[host i]`, and because a jax.distributed job cannot survive a lost
peer (the others would hang in a collective until the heartbeat timeout), it stops all
processes as soon as one fails, and on Ctrl-C.

When a host fails, what the others print while they are stopped (a lost peer's gloo and
coordination-service errors, their interrupted tracebacks) is left off the screen: it says
nothing about the failure and used to bury it. The failed host's own last line (a locojax
command says its error there, naming the host and the user's file:line: `locojax/failure.py`)
is repeated as the last line printed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import tyro

from locojax import distributed


@dataclasses.dataclass(frozen=True)
class LaunchArgs:
    """Run a locojax subcommand as N local hosts joined by jax.distributed."""

    hosts: int = 2
    """Number of host processes to start."""
    devices_per_host: int = 1
    """Simulated CPU devices per host (jax_num_cpu_devices)."""
    port: int = 0
    """Coordinator port on 127.0.0.1; 0 picks a free one."""
    heartbeat_s: int = 30
    """jax.distributed heartbeat timeout: how long survivors wait for a lost peer."""
    grace_s: float = 10.0
    """After asking processes to stop, how long to wait before killing them."""
    pin_cpus: bool = True
    """Give each host its own equal share of this machine's CPUs, as real hosts have their
    own cores (only when there are at least as many CPUs as hosts; `--no-pin-cpus` leaves
    each host's XLA thread pool as wide as the machine). On by default: on 2 cores, 2-host
    steps interleaved pinned and not (`benchmarks/ab_runs.py --launch-flag`, 2026-12-06)
    took 0.035 s pinned against 0.050 unpinned at TINY and 2.56 against 2.67 s at SMALL
    (docs/results/modes_step_time.md, "Pinning again")."""


class _Screen:
    """What reaches the terminal: every host's lines until one fails, then that host's only.
    Remembers each host's last non-blank line."""

    def __init__(self, out, hosts: int):
        self.out, self.lock = out, threading.Lock()
        self.failed: int | None = None
        self.last = [""] * hosts

    def line(self, host: int, line: str) -> None:
        with self.lock:
            if line.strip():
                self.last[host] = line.rstrip("\n")
            if self.failed is None or self.failed == host:
                self.out.write(f"[host {host}] {line}")
                self.out.flush()

    def say(self, text: str) -> None:
        with self.lock:
            self.out.write(text)
            self.out.flush()


def _pump(stream, host: int, screen: _Screen) -> None:
    for line in iter(stream.readline, ""):
        screen.line(host, line)
    stream.close()


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGINT every live process group, then SIGKILL whatever outlives the grace period."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def launch(args: LaunchArgs, child_argv: list[str], out=sys.stdout) -> int:
    """Run `child_argv` as `args.hosts` processes; the first failure's exit code wins."""
    if args.hosts < 1 or args.devices_per_host < 1:
        raise ValueError(f"--hosts and --devices-per-host must be >= 1, got {args}")
    port = args.port or distributed.free_port()
    cpus = sorted(os.sched_getaffinity(0))
    shares = distributed.cpu_shares(args.hosts, cpus) if args.pin_cpus else [None] * args.hosts
    if args.pin_cpus and shares[0] is None:
        out.write(f"[launch] {args.hosts} hosts share {len(cpus)} CPUs (not pinned)\n")
    procs, pumps = [], []
    screen = _Screen(out, args.hosts)
    for host in range(args.hosts):
        env = dict(
            os.environ,
            **{
                distributed.ENV_COORDINATOR: f"127.0.0.1:{port}",
                distributed.ENV_NUM_PROCESSES: str(args.hosts),
                distributed.ENV_PROCESS_ID: str(host),
                distributed.ENV_DEVICES_PER_HOST: str(args.devices_per_host),
                distributed.ENV_HEARTBEAT: str(args.heartbeat_s),
                "PYTHONUNBUFFERED": "1",
            },
        )
        if shares[host]:
            env[distributed.ENV_CPUS] = shares[host]
        p = subprocess.Popen(
            child_argv, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        t = threading.Thread(target=_pump, args=(p.stdout, host, screen), daemon=True)
        t.start()
        procs.append(p)
        pumps.append(t)

    code, failed_host = 0, None
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                code = failed[0].returncode
                failed_host = procs.index(failed[0])
                screen.failed = failed_host  # the others' dying words stay off the screen
                screen.say(f"[launch] host {failed_host} exited with {code}; stopping the "
                           "others\n")
                _stop(procs, args.grace_s)
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        screen.say("[launch] interrupted; stopping every host\n")
        _stop(procs, args.grace_s)
        code = 130
    for t in pumps:
        t.join(timeout=5)
    if failed_host is not None:
        screen.say(f"[launch] host {failed_host} failed: {screen.last[failed_host]}\n")
    if code == 0:
        code = next((p.returncode for p in procs if p.returncode), 0)
    return code


def main(argv: list[str]) -> int:
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
    else:
        own, command = argv, []
    args = tyro.cli(LaunchArgs, args=own, prog="locojax launch")
    if not command:
        print("locojax launch: give a subcommand after `--`, e.g. `-- train ...`", file=sys.stderr)
        return 2
    try:
        return launch(args, [sys.executable, "-m", "locojax.cli", *command])
    except ValueError as e:
        print(f"locojax launch: {e}", file=sys.stderr)
        return 2
