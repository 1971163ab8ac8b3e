"""A reward worker process, and the messages it exchanges with `rewards.RewardRunner`.

The worker is a spawned process in its own session (so its parent can kill it and whatever it
started as one group). It loads pickled reward functions, scores one (completion, example) at
a time, and checks each value itself (`check_value`), so that only a float, "none" or an
error text crosses back: the parent never unpickles an object the reward made. Every
message is a tuple whose first item names it (`ARITY`); anything else the parent receives is
that row's error, and the worker is replaced.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Literal, NamedTuple

from locojax.envs.base import RewardValueError, check_reward


class Outcome(NamedTuple):
    """One row's score: its value (0 unless ok) and, on failure, why."""

    value: float
    status: Literal["ok", "error", "timeout", "none"]
    detail: str = ""


def check_value(v: Any, abstains: bool = False) -> Outcome:
    """`v` as an outcome: a checked number, "none" (an abstaining reward's None), or an error."""
    if v is None and abstains:
        return Outcome(0.0, "none")
    try:
        return Outcome(check_reward(v), "ok")
    except RewardValueError as e:
        return Outcome(0.0, "error", str(e))


ARITY = {"ready": 1, "loaded": 2, "load_error": 2, "ok": 2, "error": 2, "none": 1}
"""The messages a worker sends, and their lengths."""


def well_formed(msg: Any) -> bool:
    return (isinstance(msg, tuple) and len(msg) >= 1 and isinstance(msg[0], str)
            and ARITY.get(msg[0]) == len(msg))


def error_text(e: BaseException) -> str:
    """`Type: message` of an exception, never raising (its `__str__` is the reward's code)."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001
        text = "<unprintable>"
    return f"{type(e).__name__}: {text}"[:500]


def worker_main(conn: Connection) -> None:
    """Loop of a reward worker process: load functions, score items, until told to stop."""
    # Own session, so the parent can kill this worker and anything it spawned as one group.
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    fns: dict[int, Callable] = {}
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        if msg[0] == "load":
            _, key, blob = msg
            try:
                fns[key] = pickle.loads(blob)
                conn.send(("loaded", key))
            except BaseException as e:  # noqa: BLE001
                conn.send(("load_error", error_text(e)))
            continue
        _, key, completion, example = msg
        # Checked here, so only a float or a text crosses back: the parent never unpickles an
        # object the reward made.
        try:
            value = fns[key](completion, example)
            out = check_value(value, getattr(fns[key], "abstains", False))
        except BaseException as e:  # noqa: BLE001
            out = Outcome(0.0, "error", error_text(e))
        conn.send({"ok": ("ok", out.value), "none": ("none",)}.get(out.status,
                                                                   ("error", out.detail)))


CTX = mp.get_context("spawn")  # fork is unsafe in a process running JAX threads


class Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.loaded: set[int] = set()
        self.ready = False
        self.task: int | None = None  # index of the item being scored
        self.deadline = 0.0

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()
