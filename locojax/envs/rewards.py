"""Safe reward execution: every call has a deadline, and no reward can kill the run.

A reward function is user code (or math-verify, or code the model wrote running in the
sandbox). It may raise, hang, or return garbage. `RewardRunner` calls it so that:

- an exception, or a value the trainer cannot train on, scores 0 and counts `reward/errors`:
  every part's value and every weighted total is checked by `base.check_reward` (a number,
  finite, |r| <= `base.REWARD_LIMIT` = 1e6, so finite in the trainer's float32). This is the
  policy for bad values, here and in docs/security.md: a counted 0, never a NaN advantage and
  never a stopped run (1e39 used to become inf in float32 and stop the run at step 0);
- a call that exceeds `timeout_s` scores 0, counts `reward/timeouts`, and returns promptly;
- nothing a reward does in a worker process reaches the caller as an exception: the worker
  checks the value and sends back a plain float or an error text, and a message the parent
  cannot read (a result that fails to unpickle) is that row's error, the worker replaced;
- it works from any thread. Signal-based timeouts (`signal.alarm`, which math-verify uses)
  only work in the main thread, and the trainer scores rewards from worker threads.

Isolation levels:

- "thread": a batch's rows run one after another on one daemon thread (`_Rows`), and the
  caller waits on each row up to its deadline, counted from that row's start. Cheap and
  works with any callable, but a timed-out call cannot be stopped: its thread is abandoned
  (the rows after it go on in a new one) and keeps its CPU until it finishes on its own,
  and a call that holds the GIL (catastrophic regex backtracking, a huge integer power, C
  code that does not release it) keeps the caller from even noticing its deadline. One
  thread per batch, not per row: at the real demo's 64 rows a thread per row cost ten
  times the rewards themselves (5.9 ms against 0.53 ms on this 2-core CPU,
  docs/results/host_overlap.md).
- "process": a small pool of spawned worker processes (`reward_worker.py`), each in its
  own session. A timed-out call's worker is killed along with its process group and
  replaced, so the deadline holds against anything. The reward must be picklable (a module-level function,
  `functools.partial`, or `CombinedReward` of those).
- "auto" (the default), per reward part: "thread" for rewards marked `@bounded` (their own
  code ends quickly without holding the GIL: the built-in format and exact-match checks, the
  sandboxed SWE reward), "process" for every other picklable reward (math-verify and sympy
  among them), and "thread" with a warning for an unpicklable one (a lambda, a closure).

A `CombinedReward` is run part by part, so one failing part zeroes only its own term and each
part is logged as `reward/<name>/mean`. A failure is logged naming the part and the row
(`Example.id`).

A part marked `abstains` (the user rewards of `envs/user.py`, TRL's convention) may return
None, meaning "does not apply to this row": it contributes 0 to the total and is left out of
its part's mean, and a row where every part abstained is a counted error scored 0. For any
other reward None is a bad value like any other.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any, Literal, NamedTuple

import numpy as np

from locojax.envs.base import CombinedReward, Example, Reward, reward_name
from locojax.envs.reward_worker import (CTX, Outcome, Worker, check_value, error_text,
                                        well_formed)

log = logging.getLogger(__name__)


def bounded(fn):
    """Mark a reward whose own code ends quickly and never holds the GIL for long (no regex
    that can backtrack, no big-number arithmetic, no solver; waiting on a subprocess is fine):
    isolation="auto" runs it in a thread. Returns `fn`."""
    fn.bounded = True
    return fn


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """How rewards are executed."""

    timeout_s: float = 5.0
    """Deadline for one reward call; past it the call scores 0 and counts `reward/timeouts`."""
    isolation: Literal["auto", "thread", "process"] = "auto"
    """'thread': cheap, hung calls are abandoned (and one holding the GIL is not noticed).
    'process': hung calls are killed. 'auto': thread for `@bounded` rewards, else process."""
    workers: int = 2
    """Worker processes for isolation='process' (calls in a batch run concurrently)."""
    load_timeout_s: float = 120.0
    """Deadline for a worker process to start and import the reward's module."""


class Deadline(Exception):
    """Raised by `call_with_timeout` when the call did not finish in time."""


def call_with_timeout(fn: Callable[..., Any], args: tuple, timeout_s: float) -> Any:
    """fn(*args) in a daemon thread; its result, its exception re-raised, or `Deadline`.

    Works from any thread. A call that times out keeps running in its abandoned thread.
    """
    box: dict[str, Any] = {}
    finished = threading.Event()

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - the caller decides what an error means
            box["error"] = e
        finally:
            finished.set()

    threading.Thread(target=run, daemon=True, name=f"reward-{reward_name(fn)}").start()
    if not finished.wait(timeout_s):
        raise Deadline(f"{reward_name(fn)} exceeded {timeout_s}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class RewardRunner:
    """Guarded reward execution with error/timeout counters. Not itself thread-safe per batch:
    use one runner per scoring thread, or serialise `score_batch` calls."""

    def __init__(self, config: RewardConfig = RewardConfig()):
        if config.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {config.timeout_s}")
        if config.isolation not in ("auto", "thread", "process"):
            raise ValueError(f"isolation must be 'auto', 'thread' or 'process', got "
                             f"{config.isolation!r}")
        self.config = config
        self._counts = {"calls": 0, "errors": 0, "timeouts": 0}
        self._sums: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._workers: list[Worker] = []
        self._process_lock = threading.Lock()  # one batch at a time uses the worker pool
        self._unpicklable_warned: set[str] = set()
        self._logged = 0

    # -- public API ---------------------------------------------------------------------------

    def score(self, fn: Reward, completion: str, example: Example) -> float:
        """One guarded call (all parts, if `fn` is a CombinedReward)."""
        return float(self.score_batch(fn, [completion], [example]).total[0])

    def score_batch(self, fn: Reward, completions: Sequence[str],
                    examples: Sequence[Example]) -> Scores:
        """Score each (completion, example) pair; returns totals [B] and per-part rewards [B]."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
        parts = fn.parts if isinstance(fn, CombinedReward) else ((reward_name(fn), fn, 1.0),)
        total = np.zeros(len(completions), np.float64)
        per_part: dict[str, np.ndarray] = {}
        applied = np.zeros(len(completions), bool)  # some part did not abstain
        for name, part, weight in parts:
            outcomes = self._run(part, completions, examples)
            values = np.array([o.value for o in outcomes], np.float64)
            per_part[name] = values
            total += weight * values
            counted = np.array([o.status != "none" for o in outcomes], bool)
            applied |= counted
            with self._lock:
                acc = self._sums.setdefault(name, [0.0, 0])
                acc[0] += float(values[counted].sum())
                acc[1] += int(counted.sum())
                for o, ex in zip(outcomes, examples):
                    self._counts["calls"] += 1
                    if o.status in ("error", "timeout"):
                        self._counts[o.status + "s"] += 1
                        self._log(name, o, ex)
        # Each part is within range, but a weighted sum of them need not be.
        for i, t in enumerate(total):
            o = (check_value(t) if applied[i] else
                 Outcome(0.0, "error", "every reward returned None (does not apply)"))
            if o.status != "ok":
                total[i] = 0.0
                with self._lock:
                    self._counts["errors"] += 1
                    self._log("total", o._replace(detail="weighted total: " + o.detail),
                              examples[i])
        return Scores(total, per_part)

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """`reward/errors`, `reward/timeouts`, `reward/calls` and `reward/<part>/mean` since the
        last reset."""
        with self._lock:
            out = {f"reward/{k}": float(v) for k, v in self._counts.items()}
            out.update({f"reward/{n}/mean": s / max(c, 1) for n, (s, c) in self._sums.items()})
            if reset:
                self._counts = dict.fromkeys(self._counts, 0)
                self._sums = {}
        return out

    def close(self) -> None:
        """Stop worker processes (no-op for thread isolation)."""
        for w in self._workers:
            try:
                w.conn.send(("stop",))
            except (OSError, ValueError):
                pass
            w.proc.join(timeout=2)
            if w.proc.is_alive():
                w.kill()
        self._workers = []

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- internals ----------------------------------------------------------------------------

    def _log(self, name: str, o: Outcome, example: Example) -> None:
        # The first few failures are logged in full so a broken reward is easy to diagnose;
        # after that only the counters move.
        if self._logged < 5:
            self._logged += 1
            log.warning("reward %s %s on row %s -> 0: %s", name, o.status,
                        getattr(example, "id", "?"), o.detail)

    def mode(self, fn: Reward) -> Literal["thread", "process"]:
        """Where one reward part runs (see the module docstring for "auto")."""
        if self.config.isolation != "auto":
            return self.config.isolation
        if getattr(fn, "bounded", False):
            return "thread"
        try:
            pickle.dumps(fn)
        except Exception:  # noqa: BLE001 - any reason it cannot reach a worker
            name = reward_name(fn)
            if name not in self._unpicklable_warned:
                self._unpicklable_warned.add(name)
                log.warning("reward %s cannot be pickled, so it runs in a thread: its deadline "
                            "cannot stop it if it hangs holding the GIL; make it a module-level "
                            "function to run it in a worker process", name)
            return "thread"
        return "process"

    def _run(self, fn: Reward, completions: Sequence[str],
             examples: Sequence[Example]) -> list[Outcome]:
        if self.mode(fn) == "thread":
            results: list[Outcome | None] = [None] * len(completions)
            first = 0
            while first < len(completions):  # a new thread only after a row timed out
                first = _Rows(fn, completions, examples, first).collect(results,
                                                                        self.config.timeout_s)
            return results  # type: ignore[return-value]
        with self._process_lock:
            return self._run_process(fn, completions, examples)

    def _run_process(self, fn: Reward, completions: Sequence[str],
                     examples: Sequence[Example]) -> list[Outcome]:
        try:
            blob = pickle.dumps(fn)
        except Exception as e:  # a configuration error, not a reward failure
            raise TypeError(
                f"reward {reward_name(fn)!r} cannot be pickled for isolation='process' ({e}); "
                "use a module-level function or functools.partial, or isolation='thread'"
            ) from e
        key = hash(blob)
        for w in [w for w in self._workers if not w.proc.is_alive()]:
            self._replace(w)  # died while idle (e.g. OOM-killed between batches)
        while len(self._workers) < max(1, self.config.workers):
            self._workers.append(Worker(CTX))
        n = len(completions)
        results: list[Outcome | None] = [None] * n
        todo = list(range(n))[::-1]
        now = time.monotonic()
        for w in self._workers:
            if not w.ready:
                w.deadline = now + self.config.load_timeout_s
        while any(r is None for r in results):
            now = time.monotonic()
            for w in list(self._workers):
                if not (w.ready and w.task is None and todo):
                    continue
                if key not in w.loaded:
                    msg, task, deadline = ("load", key, blob), -1, self.config.load_timeout_s
                else:
                    j = todo.pop()
                    msg, task, deadline = ("score", key, completions[j], examples[j]), j, \
                        self.config.timeout_s
                try:
                    data = pickle.dumps(msg)
                except Exception as e:  # noqa: BLE001 - an example the worker cannot receive
                    results[task] = Outcome(0.0, "error", f"cannot pickle the example: {e}")
                    continue
                try:
                    w.conn.send_bytes(data)
                except OSError:  # died while idle: retry the item elsewhere
                    if task >= 0:
                        todo.append(task)
                    self._replace(w)
                    continue
                w.task, w.deadline = task, now + deadline
            busy = [w for w in self._workers if not w.ready or w.task is not None]
            if not busy:
                if not todo:  # nothing left to send and nothing running: cannot happen
                    raise RuntimeError("reward worker pool stalled")
                continue  # every item just sent failed to pickle: dispatch the next ones
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready_conns = wait([w.conn for w in busy], timeout=timeout)
            for w in list(busy):
                if w.conn in ready_conns:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        msg = ("died", f"worker exited with code {w.proc.exitcode}")
                    except Exception as e:  # noqa: BLE001 - a message that fails to unpickle
                        msg = ("unreadable", f"its result cannot be read ({error_text(e)})")
                    if not well_formed(msg):
                        msg = ("unreadable", "it sent a malformed message")
                    self._handle(w, msg, results, todo)
                elif time.monotonic() >= w.deadline:
                    self._handle(w, ("timeout", ""), results, todo)
        return results  # type: ignore[return-value]

    def _replace(self, w: Worker) -> None:
        w.kill()
        new = Worker(CTX)
        new.deadline = time.monotonic() + self.config.load_timeout_s
        self._workers[self._workers.index(w)] = new

    def _handle(self, w: Worker, msg: tuple, results: list, todo: list[int]) -> None:
        kind = msg[0]
        if kind == "ready":
            w.ready = True
            return
        if kind == "loaded":
            w.loaded.add(msg[1])
            w.task = None
            return
        task = w.task
        if kind == "ok" and task is not None and task >= 0:
            results[task] = check_value(msg[1])
            w.task = None
            return
        if kind == "none" and task is not None and task >= 0:
            results[task] = Outcome(0.0, "none")
            w.task = None
            return
        if kind == "error" and task is not None and task >= 0:
            results[task] = Outcome(0.0, "error", msg[1])
            w.task = None
            return
        # A load failure, a dead worker or a timeout: replace the worker.
        if kind == "load_error" or (task == -1 and kind != "timeout"):
            raise RuntimeError(f"reward worker could not load the reward function: {msg[1:]}")
        if not w.ready or task == -1:
            raise RuntimeError(f"reward worker failed to start or load within "
                               f"{self.config.load_timeout_s}s: {msg}")
        self._replace(w)
        if kind == "timeout":
            results[task] = Outcome(0.0, "timeout", f"exceeded {self.config.timeout_s}s")
        else:
            results[task] = Outcome(0.0, "error", str(msg[1] if len(msg) > 1 else msg))


class _Rows:
    """Rows [first, n) of a batch scored in order on one daemon thread (isolation="thread");
    `collect` waits for each up to its own deadline."""

    def __init__(self, fn: Reward, completions: Sequence[str], examples: Sequence[Example],
                 first: int):
        self.fn, self.changed = fn, threading.Condition()
        self.started: dict[int, float] = {}  # row -> when the thread began it (monotonic)
        self.outcomes: dict[int, Outcome] = {}
        self.abandoned = False  # set by `collect` at a timeout: the thread writes no more
        self.first, self.n = first, len(completions)
        threading.Thread(target=self._work, args=(completions, examples), daemon=True,
                         name=f"reward-{reward_name(fn)}").start()

    def _work(self, completions: Sequence[str], examples: Sequence[Example]) -> None:
        abstains = getattr(self.fn, "abstains", False)
        for j in range(self.first, self.n):
            with self.changed:
                if self.abandoned:
                    return
                self.started[j] = time.monotonic()
            try:
                out = check_value(self.fn(completions[j], examples[j]), abstains)
            except BaseException as e:  # noqa: BLE001 - a reward's failure is its row's 0
                out = Outcome(0.0, "error", f"{type(e).__name__}: {e}")
            with self.changed:
                if self.abandoned:
                    return
                self.outcomes[j] = out
                self.changed.notify()

    def collect(self, results: list, timeout_s: float) -> int:
        """Fill `results` from row `first` on; the first row left unscored: `n`, or the row
        after one that passed its deadline (which scores a timeout)."""
        with self.changed:
            for j in range(self.first, self.n):
                while j not in self.outcomes:
                    began = self.started.get(j)  # None: the thread has not reached it yet
                    left = timeout_s if began is None else began + timeout_s - time.monotonic()
                    if began is not None and left <= 0:
                        self.abandoned = True
                        results[j] = Outcome(0.0, "timeout", f"{reward_name(self.fn)} "
                                             f"exceeded {timeout_s}s")
                        return j + 1
                    self.changed.wait(left)
                results[j] = self.outcomes[j]
        return self.n


class Scores(NamedTuple):
    total: np.ndarray
    """[B] weighted sum of the parts."""
    parts: dict[str, np.ndarray]
    """part name -> [B] unweighted reward of that part."""
