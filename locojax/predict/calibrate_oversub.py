"""Contention between local hosts, for `locojax predict calibrate` (`oversubscription`).

N colocated hosts on one machine are N processes. `locojax launch` pins each to its share
of the cores where there are at least as many cores as hosts; beyond, they run unpinned,
each with an XLA thread pool as wide as the machine, so k busy hosts on c cores contend
for cores as well as for the memory system (pinned, for the memory system and the
last-level cache only). The cost model gives each host its share of the cores, c / k, and
multiplies a program's time by the penalty ρ(k) this probe measures
(`shared_machine.oversubscription`):

    ρ(k) = wall of each of k processes started together / (wall of one alone on one core
           x max(1, k / c))

the denominator being fair time-slicing. Each process runs the GRPO train step of the
decoder it is given (calibrate's: `CALIBRATION_DECODER`) on 16 rows of 32 + 32 tokens, a
shape no benchmark runs, `CALLS` times per round after warm-ups, placed as `locojax launch`
places its hosts; the median of the k processes' walls, then of `ROUNDS` rounds. The
one-core reference is a process pinned to one core, as `flops_per_core` is measured.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from locojax import distributed

KS = (2, 4)
CALLS = 8
ROUNDS = 3
WARMUPS = 3


def _step(decoder: dict):
    """One GRPO update of the decoder `config.tiny(**decoder)` on 16 rows of 32 + 32
    tokens, its state carried between calls."""
    from locojax.model import config
    from locojax.predict import calibration_step

    return calibration_step.update(config.tiny(**decoder), 4, 4, 32, 32)


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


def worker(calls: int, rounds: int, decoder: dict) -> None:
    """This module's worker: pinned where the parent says (`distributed.ENV_CPUS`, as
    `locojax launch` says it), before JAX starts."""
    distributed.pin_cpus(os.environ.get(distributed.ENV_CPUS))
    serve(_step(decoder), calls, rounds)


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


def _walls(k: int, decoder: dict, pin: int | None = None, calls: int = CALLS,
           rounds: int = ROUNDS) -> float:
    """`walls` of k of this module's workers: pinned to CPU `pin` where given, else placed
    as `locojax launch` places k hosts (`distributed.placed`)."""
    envs = distributed.placed(dict(os.environ), k)
    if pin is not None:
        envs = [{**e, distributed.ENV_CPUS: str(pin)} for e in envs]
    cmd = [sys.executable, "-m", "locojax.predict.calibrate_oversub", str(calls), str(rounds),
           json.dumps(decoder)]
    return walls([cmd] * k, rounds, envs)


def oversubscription(decoder: dict, ks: tuple[int, ...] = KS, calls: int = CALLS,
                     rounds: int = ROUNDS) -> dict:
    """{"penalty": {str(k): ρ(k)}, "alone_1_core_s": the reference's wall} for the train
    step of `config.tiny(**decoder)` (see the module docstring)."""
    cpus = sorted(os.sched_getaffinity(0))
    alone = _walls(1, decoder, pin=cpus[0], calls=calls, rounds=rounds)
    penalty = {str(k): _walls(k, decoder, calls=calls, rounds=rounds)
               / (alone * max(1.0, k / len(cpus))) for k in ks}
    return {"penalty": penalty, "alone_1_core_s": alone}


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))
