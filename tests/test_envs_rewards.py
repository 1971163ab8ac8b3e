"""Safe reward execution: errors and timeouts score 0, are counted, and never stop the caller.

Hangs here hold the GIL, as real ones do (a pure-Python loop yields it only at the
interpreter's switch interval; a regex or a big-integer power never does), never
`time.sleep`, which releases it and so proves nothing about a deadline.
"""

import functools
import logging
import os
import re
import threading
import time

import numpy as np
import pytest

from locojax.envs.base import Example, combine_rewards
from locojax.envs.rewards import Deadline, RewardConfig, RewardRunner, call_with_timeout

EX = Example("e0", "1+1=", "2")


def exact(completion, example):
    return float(completion == example.answer)


def boom(completion, example):
    raise ValueError("reward bug")


def hang(completion, example):
    if completion == "hang":
        while True:  # pure-Python infinite loop: only a process kill stops it
            pass
    return 1.0


def busy(completion, example, seconds=2.0):
    """A pure-Python loop for `seconds` (bounded, so an abandoned thread ends by itself)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return 1.0


def gil_hang(completion, example):
    """Catastrophic backtracking: `re` holds the GIL for the whole match, 2^40 steps."""
    if completion == "hang":
        re.match(r"(a+)+$", "a" * 40 + "b")
    return 1.0


def crash(completion, example):
    if completion == "crash":
        os._exit(3)  # takes the worker process down with it
    return 1.0


def not_a_number(completion, example):
    return {"nan": float("nan"), "str": "high"}.get(completion, 1.0)


def test_call_with_timeout_value_error_deadline():
    assert call_with_timeout(lambda a: a + 1, (1,), 1.0) == 2
    with pytest.raises(ValueError, match="reward bug"):
        call_with_timeout(boom, ("x", EX), 1.0)
    t0 = time.monotonic()
    with pytest.raises(Deadline):
        call_with_timeout(busy, ("x", EX), 0.2)
    assert 0.2 <= time.monotonic() - t0 < 1.0  # at the deadline: not before, not much after


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_raise_scores_zero_and_counts(isolation):
    with RewardRunner(RewardConfig(timeout_s=5.0, isolation=isolation, workers=1)) as run:
        scores = run.score_batch(boom, ["2", "3"], [EX, EX])
        np.testing.assert_array_equal(scores.total, [0.0, 0.0])
        # The runner keeps working after failures.
        np.testing.assert_array_equal(run.score_batch(exact, ["2", "3"], [EX, EX]).total, [1, 0])
        np.testing.assert_array_equal(
            run.score_batch(not_a_number, ["nan", "str", "ok"], [EX] * 3).total, [0, 0, 1])
        m = run.metrics()
        assert m["reward/errors"] == 4 and m["reward/timeouts"] == 0 and m["reward/calls"] == 7
        assert m["reward/exact/mean"] == 0.5
        assert run.metrics()["reward/errors"] == 0  # reset after reading


def test_thread_timeout_returns_promptly():
    run = RewardRunner(RewardConfig(timeout_s=0.3, isolation="thread"))
    t0 = time.monotonic()
    scores = run.score_batch(functools.partial(busy, seconds=2.0), ["a", "b"], [EX, EX])
    assert 0.6 <= time.monotonic() - t0 < 2.0  # two deadlines of 0.3 s, one after the other
    np.testing.assert_array_equal(scores.total, [0, 0])
    assert run.metrics()["reward/timeouts"] == 2


@pytest.mark.slow
def test_process_timeout_kills_hung_worker_and_recovers():
    with RewardRunner(RewardConfig(timeout_s=1.0, isolation="process", workers=2)) as run:
        run.score(exact, "2", EX)  # warm the workers so start-up time is not measured
        pids = {w.proc.pid for w in run._workers}
        t0 = time.monotonic()
        scores = run.score_batch(hang, ["ok", "hang", "ok", "ok"], [EX] * 4)
        assert 1.0 <= time.monotonic() - t0 < 8.0  # the hung row's deadline, not before
        np.testing.assert_array_equal(scores.total, [1, 0, 1, 1])
        m = run.metrics()
        assert m["reward/timeouts"] == 1 and m["reward/errors"] == 0
        # The hung worker was killed (not abandoned) and replaced.
        dead = pids - {w.proc.pid for w in run._workers}
        assert len(dead) == 1
        assert all(w.proc.is_alive() for w in run._workers)
        np.testing.assert_array_equal(run.score_batch(exact, ["2"], [EX]).total, [1])


def test_gil_holding_hang_is_killed_at_its_deadline_by_default():
    """The default isolation runs an unmarked reward in a worker process: a hang that holds
    the GIL (which no thread-based deadline can even notice) is killed at the deadline, scored
    0 and counted, and the other rows are scored."""
    with RewardRunner(RewardConfig(timeout_s=1.0, workers=1)) as run:
        assert run.mode(gil_hang) == "process"
        run.score(gil_hang, "ok", EX)  # start and load the worker: not part of the deadline
        t0 = time.monotonic()
        scores = run.score_batch(gil_hang, ["ok", "hang", "ok"], [EX] * 3)
        elapsed = time.monotonic() - t0
        assert 1.0 <= elapsed < 6.0, elapsed  # the deadline, then a kill and a fresh worker
        np.testing.assert_array_equal(scores.total, [1, 0, 1])
        m = run.metrics()
        assert m["reward/timeouts"] == 1 and m["reward/errors"] == 0


def test_auto_isolation_per_reward(caplog):
    """Threads for rewards marked @bounded (the built-in checks, the sandboxed SWE reward),
    processes for other picklable ones (math-verify among them), threads with a warning for a
    reward no worker can receive."""
    from locojax.envs import gsm8k, math_boxed
    from locojax.envs.swe import TranscriptReward
    from locojax.envs.tasks import calc

    run = RewardRunner()
    assert RewardConfig().isolation == "auto"
    for fn in (gsm8k.correct_strict, gsm8k.format_ok, math_boxed.boxed_format,
               TranscriptReward("none"), calc.task(level=1).reward):
        assert run.mode(fn) == "thread", fn
    assert [run.mode(f) for _, f, _ in math_boxed.reward(format_weight=0.1).parts] == \
        ["process", "thread"]
    assert run.mode(exact) == "process"
    with caplog.at_level(logging.WARNING, logger="locojax.envs.rewards"):
        assert run.mode(lambda c, e: 1.0) == "thread"
        assert run.mode(lambda c, e: 1.0) == "thread"
    assert len([r for r in caplog.records if "cannot be pickled" in r.getMessage()]) == 1
    assert RewardRunner(RewardConfig(isolation="thread")).mode(exact) == "thread"
    with pytest.raises(ValueError, match="'auto', 'thread' or 'process'"):
        RewardRunner(RewardConfig(isolation="fork"))


def test_process_rejects_unpicklable_reward_clearly():
    with RewardRunner(RewardConfig(isolation="process", workers=1)) as run:
        with pytest.raises(TypeError, match="cannot be pickled"):
            run.score(lambda c, e: 1.0, "x", EX)


def test_combined_parts_are_guarded_separately():
    run = RewardRunner(RewardConfig(timeout_s=2.0, isolation="thread"))
    r = combine_rewards([(exact, 1.0), (boom, 0.5)])
    s = run.score_batch(r, ["2", "9"], [EX, EX])
    np.testing.assert_array_equal(s.total, [1.0, 0.0])
    np.testing.assert_array_equal(s.parts["exact"], [1.0, 0.0])
    np.testing.assert_array_equal(s.parts["boom"], [0.0, 0.0])
    assert run.metrics()["reward/errors"] == 2


def test_runner_from_non_main_thread():
    out = {}

    def work():
        run = RewardRunner(RewardConfig(timeout_s=0.3, isolation="thread"))
        out["scores"] = run.score_batch(busy, ["x"], [EX]).total
        out["exact"] = run.score(exact, "2", EX)
        out["m"] = run.metrics()

    t = threading.Thread(target=work)
    t.start()
    t.join(5)
    assert not t.is_alive()
    assert out["exact"] == 1.0 and out["scores"][0] == 0.0 and out["m"]["reward/timeouts"] == 1


def test_bad_config_and_shapes():
    with pytest.raises(ValueError, match="timeout_s"):
        RewardRunner(RewardConfig(timeout_s=0))
    with pytest.raises(ValueError, match="2 completions but 1 examples"):
        RewardRunner().score_batch(exact, ["a", "b"], [EX])


@pytest.mark.slow
def test_process_worker_crash_and_unpicklable_example():
    bad = Example("e1", "p", "2", meta={"lock": threading.Lock()})
    with RewardRunner(RewardConfig(timeout_s=5.0, isolation="process", workers=1)) as run:
        scores = run.score_batch(crash, ["ok", "crash", "ok"], [EX, EX, EX])
        np.testing.assert_array_equal(scores.total, [1, 0, 1])
        np.testing.assert_array_equal(run.score_batch(crash, ["ok", "ok"], [bad, EX]).total, [0, 1])
        m = run.metrics()
        assert m["reward/errors"] == 2 and m["reward/timeouts"] == 0
