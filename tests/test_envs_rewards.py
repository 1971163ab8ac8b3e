"""Safe reward execution: errors and timeouts score 0, are counted, and never stop the caller."""

import functools
import os
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


def sleepy(completion, example, seconds=30.0):
    time.sleep(seconds)
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
        call_with_timeout(sleepy, ("x", EX), 0.2)
    assert time.monotonic() - t0 < 1.0


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
    scores = run.score_batch(functools.partial(sleepy, seconds=30), ["a", "b"], [EX, EX])
    assert time.monotonic() - t0 < 2.0
    np.testing.assert_array_equal(scores.total, [0, 0])
    assert run.metrics()["reward/timeouts"] == 2


@pytest.mark.slow
def test_process_timeout_kills_hung_worker_and_recovers():
    with RewardRunner(RewardConfig(timeout_s=1.0, isolation="process", workers=2)) as run:
        run.score(exact, "2", EX)  # warm the workers so start-up time is not measured
        pids = {w.proc.pid for w in run._workers}
        t0 = time.monotonic()
        scores = run.score_batch(hang, ["ok", "hang", "ok", "ok"], [EX] * 4)
        assert time.monotonic() - t0 < 8.0
        np.testing.assert_array_equal(scores.total, [1, 0, 1, 1])
        m = run.metrics()
        assert m["reward/timeouts"] == 1 and m["reward/errors"] == 0
        # The hung worker was killed (not abandoned) and replaced.
        dead = pids - {w.proc.pid for w in run._workers}
        assert len(dead) == 1
        assert all(w.proc.is_alive() for w in run._workers)
        np.testing.assert_array_equal(run.score_batch(exact, ["2"], [EX]).total, [1])


def test_process_rejects_unpicklable_reward_clearly():
    with RewardRunner(RewardConfig(isolation="process", workers=1)) as run:
        with pytest.raises(TypeError, match="cannot be pickled"):
            run.score(lambda c, e: 1.0, "x", EX)


def test_combined_parts_are_guarded_separately():
    run = RewardRunner(RewardConfig(timeout_s=2.0))
    r = combine_rewards([(exact, 1.0), (boom, 0.5)])
    s = run.score_batch(r, ["2", "9"], [EX, EX])
    np.testing.assert_array_equal(s.total, [1.0, 0.0])
    np.testing.assert_array_equal(s.parts["exact"], [1.0, 0.0])
    np.testing.assert_array_equal(s.parts["boom"], [0.0, 0.0])
    assert run.metrics()["reward/errors"] == 2


def test_runner_from_non_main_thread():
    out = {}

    def work():
        run = RewardRunner(RewardConfig(timeout_s=0.3))
        out["scores"] = run.score_batch(sleepy, ["x"], [EX]).total
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
