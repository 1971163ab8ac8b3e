"""Start probe workers together and time them: the protocol of `predict_probes.py oversub`
(k processes of one program at once, against one alone). A leaf: no benchmarks import.

A worker `serve`s: it warms up, says ready, then runs its calls once per round when told
and prints its wall; `walls` starts every worker, waits until all are ready, and starts the
rounds together, so no worker's start-up falls inside another's timed calls.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time

WARMUPS = 3


def serve(step, calls: int, rounds: int, warmups: int = WARMUPS) -> None:
    """A probe worker's side of `walls`: run `step` `warmups` times, say ready; then per
    round wait for a line on stdin, run `calls` calls, print the wall as JSON."""
    for _ in range(warmups):
        step()
    print("ready", flush=True)
    for _ in range(rounds):
        sys.stdin.readline()
        t = time.perf_counter()
        for _ in range(calls):
            step()
        print(json.dumps({"wall": time.perf_counter() - t}), flush=True)


def walls(commands: list[list[str]], rounds: int, envs: list[dict] | None = None,
          timeout: float = 600) -> float:
    """Start one worker a command (each `serve`s; `envs`, each one's environment), wait
    until all are ready, then per round start them together: the median over rounds of the
    median of their walls."""
    # stderr to files, not pipes: a pipe nobody reads until the end could fill and stall a
    # worker; a file keeps a failed worker's message for the error.
    errs = [tempfile.TemporaryFile("w+") for _ in commands]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                              text=True, env=env) for cmd, err, env in
             zip(commands, errs, envs or [None] * len(commands))]

    def line(i: int, expect: str) -> str:
        out = procs[i].stdout.readline()
        if not out:
            procs[i].kill()
            procs[i].wait()
            errs[i].seek(0)
            raise RuntimeError(f"oversubscription probe worker died before {expect}:\n"
                               + errs[i].read()[-2000:])
        return out

    try:
        for i in range(len(procs)):
            line(i, "it was ready")
        medians = []
        for _ in range(rounds):
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            medians.append(statistics.median(json.loads(line(i, "its wall"))["wall"]
                                             for i in range(len(procs))))
        for p in procs:
            p.communicate(timeout=timeout)
        return statistics.median(medians)
    finally:
        for p, err in zip(procs, errs):
            if p.poll() is None:
                p.kill()
                p.wait()
            err.close()
