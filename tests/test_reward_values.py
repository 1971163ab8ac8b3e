"""One reward value never stops a run (issue 38): every value is checked in the trainer's
precision, and a bad one scores 0 and counts in `reward/errors` (envs/base.check_reward).

1e39 is finite in float64 but inf in float32 (it stopped the demo at step 0 with
NonFiniteError); 1e300 squares to inf (NaN advantages); `float(10**400)` raises
OverflowError; a result that fails to unpickle in the parent raised out of the process pool.
"""

import gc
import math
import pickle
from multiprocessing.connection import Connection

import jax.numpy as jnp
import numpy as np
import pytest

from locojax.envs.base import (REWARD_LIMIT, Example, RewardValueError, ToolEnv, check_reward,
                               combine_rewards)
from locojax.envs.rewards import RewardConfig, RewardRunner
from locojax.rl import advantages

EX = Example("e0", "1+1=", "2")


class Unfloatable:
    def __float__(self):
        raise RuntimeError("no float for you")


def _refuse_to_unpickle():
    raise TypeError("this object cannot be rebuilt")


class FailsToUnpickle:
    """Pickles fine in the worker; rebuilding it anywhere raises TypeError."""

    def __reduce__(self):
        return _refuse_to_unpickle, ()


BAD_VALUES = {
    "1e39": 1e39,  # inf after the cast to float32
    "1e300": 1e300,  # inf in float32 too, and its square overflows even float64
    "-1e7": -1e7,  # finite everywhere, but outside the documented range
    "int 10**400": 10**400,  # float() raises OverflowError
    "int 10**5000": 10**5000,  # not even a repr (Python's int-string limit)
    "nan": math.nan,
    "inf": math.inf,
    "str": "high",
    "unfloatable": Unfloatable(),
    "fails to unpickle": FailsToUnpickle(),
}


def bad_value(completion, example):
    """A module-level reward, so the process workers can load it: the value named by the
    completion, else 1."""
    return BAD_VALUES.get(completion, 1.0)


def scribble_on_the_pipe(completion, example):
    """A reward that writes straight to its worker's pipe a message the parent cannot
    unpickle, then returns normally: what a hostile reward could do."""
    conns = [o for o in gc.get_objects() if isinstance(o, Connection)]
    assert len(conns) == 1, conns  # the worker's end of its pipe
    conns[0].send_bytes(pickle.dumps(("ok", FailsToUnpickle())))
    return 1.0


def test_check_reward_refuses_every_value_the_trainer_cannot_use():
    assert check_reward(1) == 1.0 and check_reward(np.float32(0.5)) == 0.5
    assert check_reward(REWARD_LIMIT) == REWARD_LIMIT and check_reward(-REWARD_LIMIT) == -1e6
    # Within the range a value is finite after the cast to float32, the trainer's precision.
    assert np.isfinite(np.float32(REWARD_LIMIT))
    for name, v in BAD_VALUES.items():
        if name == "fails to unpickle":
            continue  # float() of it raises TypeError: covered by "unfloatable"'s path
        with pytest.raises(RewardValueError):
            check_reward(v)
    with pytest.raises(RewardValueError, match="outside"):
        check_reward(1e39)
    with pytest.raises(RewardValueError, match="int .*not a number"):
        check_reward(10**400)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_bad_value_scores_zero_and_counts(isolation):
    names = list(BAD_VALUES)
    with RewardRunner(RewardConfig(timeout_s=30.0, isolation=isolation, workers=1)) as run:
        scores = run.score_batch(bad_value, ["ok", *names, "ok"], [EX] * (len(names) + 2))
        np.testing.assert_array_equal(scores.total, [1.0] + [0.0] * len(names) + [1.0])
        m = run.metrics()
        assert m["reward/errors"] == len(names) and m["reward/calls"] == len(names) + 2
        # The runner (its worker) goes on scoring.
        np.testing.assert_array_equal(run.score_batch(bad_value, ["ok"], [EX]).total, [1.0])


@pytest.mark.slow
def test_a_result_the_parent_cannot_unpickle_is_that_rows_error():
    """The worker never sends the reward's object (it sends the checked float), so this
    writes the object on the pipe itself: the parent's failed unpickle is the row's error,
    the worker is replaced, and the next batch is scored."""
    with RewardRunner(RewardConfig(timeout_s=30.0, isolation="process", workers=1)) as run:
        run.score(bad_value, "ok", EX)  # start the worker
        pid = run._workers[0].proc.pid
        scores = run.score_batch(scribble_on_the_pipe, ["x"], [EX])
        np.testing.assert_array_equal(scores.total, [0.0])
        m = run.metrics()
        assert m["reward/errors"] == 1
        assert run._workers[0].proc.pid != pid  # replaced: its pipe is out of step
        np.testing.assert_array_equal(run.score_batch(bad_value, ["ok", "1e39"], [EX, EX]).total,
                                      [1.0, 0.0])


def half(completion, example):
    return 0.5 * REWARD_LIMIT


def test_a_weighted_total_out_of_range_scores_zero_and_counts():
    """Each part within range, their weighted sum not: the row's total is 0 and counted."""
    r = combine_rewards([(half, 4.0), (bad_value, 1.0)])
    with RewardRunner(RewardConfig(isolation="thread")) as run:
        s = run.score_batch(r, ["ok"], [EX])
        np.testing.assert_array_equal(s.total, [0.0])
        np.testing.assert_array_equal(s.parts["half"], [0.5 * REWARD_LIMIT])
        assert run.metrics()["reward/errors"] == 1
    for weight in (math.inf, math.nan, "heavy"):
        with pytest.raises(ValueError, match="weight must be a finite number"):
            combine_rewards([(half, weight)])


def test_tool_env_checks_its_final_reward():
    """Unrouted through a RewardRunner, a ToolEnv's final reward is still checked: it
    raises, which the env pool counts as an env error (the trajectory scores 0)."""
    env = ToolEnv({}, bad_value)
    env.reset(EX)
    assert env.step("ok").reward == 1.0
    env.reset(EX)
    with pytest.raises(RewardValueError):
        env.step("1e39")


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e39 -> inf
@pytest.mark.parametrize("name", ["grpo", "rloo", "batch"])
@pytest.mark.parametrize("bad", [1e39, 1e300, math.inf, -math.inf, math.nan, 2 * REWARD_LIMIT])
def test_advantages_stay_finite_whatever_the_rewards(name, bad):
    """A reward that came another way than the RewardRunner (a custom env's step reward)
    counts as 0 in the estimators too: advantages are exactly those of the batch with that
    row's reward 0 (the same float32 ops on the same values), and it is counted."""
    group = jnp.asarray([0, 0, 0, 1, 1, 1])
    rewards = np.asarray([1.0, 0.0, bad, 1.0, 0.0, 0.0], np.float64)
    zeroed = np.where(np.arange(6) == 2, 0.0, rewards)
    fn = advantages.ESTIMATORS[name]
    adv, m = fn(jnp.asarray(rewards, jnp.float32), group)
    want, _ = fn(jnp.asarray(zeroed, jnp.float32), group)
    assert np.isfinite(np.asarray(adv)).all(), adv
    np.testing.assert_array_equal(np.asarray(adv), np.asarray(want))
    assert float(m["rollout/bad_rewards"]) == 1.0 and np.isfinite(float(m["rollout/frac_zero_std"]))


def test_scored_rewards_give_finite_advantages():
    """The demo's failure, end to end on the host side: scores of a batch with 1e39 in it,
    cast to float32 as the rollout does, make finite GRPO advantages."""
    with RewardRunner(RewardConfig(isolation="thread")) as run:
        total = run.score_batch(bad_value, ["ok", "1e39", "1e300", "ok"], [EX] * 4).total
    adv, _ = advantages.ESTIMATORS["grpo"](jnp.asarray(total.astype(np.float32)),
                                           jnp.asarray([0, 0, 0, 0]))
    assert np.isfinite(np.asarray(adv)).all()


class _StepEnv:
    """A custom env whose step returns `value` as its reward (no RewardRunner in between)."""

    def __init__(self, value):
        self.value = value

    def step(self, action):
        return "obs", self.value, True, {}


@pytest.mark.parametrize("bad", [1e39, 1e300, math.nan, 10**400, "x"],
                         ids=["1e39", "1e300", "nan", "10**400", "text"])
def test_a_multi_turn_step_reward_is_checked(bad):
    """multi_turn's `_step` routes an env's step reward through check_reward: a bad value
    raises RewardValueError naming it, which the env pool makes an env error (the trajectory
    scores 0, counted in env/errors), where `float(reward)` let 1e39 through as inf."""
    from locojax.rollout.multi_turn import _step

    assert _step(_StepEnv(0.5), "a").reward == 0.5
    with pytest.raises(RewardValueError, match="reward returned"):
        _step(_StepEnv(bad), "a")
