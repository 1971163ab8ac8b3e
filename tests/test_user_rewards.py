"""User rewards with TRL's signature (`locojax/envs/user.py`): how they are called, and every
bad value a user's reward can return (issue #36, item 9), scored in worker processes as a
run scores them.

Each bad case is either an error naming the reward and the row, counted in `reward/errors`
and scored 0, or (None) the documented "does not apply"; none reaches a total as anything
but a finite number.
"""

import logging
import math
import sys
import textwrap

import pytest

from locojax.envs.base import Example
from locojax.envs.rewards import RewardConfig, RewardRunner
from locojax.envs.user import TRLReward, rewards

MODULE = '''
import time

def matches(prompts, completions, answer, **kwargs):
    """TRL style: 1 where the completion contains the gold answer."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(str(a) in t) for a, t in zip(answer, texts)]

def shape(prompts, completions, **kwargs):
    """Records what it was given, as a number: 1 plain, 2 conversational (+10 per column)."""
    conv = not isinstance(completions[0], str)
    if conv:
        assert completions[0] == [{"role": "assistant", "content": "ok"}], completions
        assert prompts[0][0]["role"] == "user", prompts
    return [(2.0 if conv else 1.0) + 10 * len(kwargs)]

def named_only(completions, level):
    return [float(level[0])]

def raises(prompts, completions, **kwargs):
    raise RuntimeError("user bug")

def hangs(prompts, completions, **kwargs):
    time.sleep(600)

def two_values(prompts, completions, **kwargs):
    return [1.0, 1.0]

def scalar(prompts, completions, **kwargs):
    return 1.0

def none(prompts, completions, **kwargs):
    return [None for _ in completions]

def nan(prompts, completions, **kwargs):
    return [float("nan")]

def inf(prompts, completions, **kwargs):
    return [float("inf")]

def numeric_string(prompts, completions, **kwargs):
    return ["0.5"]

def huge_float(prompts, completions, **kwargs):
    return [1e39]

def huge_int(prompts, completions, **kwargs):
    return [10 ** 400]

def _refuse():
    raise RuntimeError("this object does not unpickle")

class Unreadable:
    """Unpickles nowhere; a number only through __float__ (as a numpy or torch scalar)."""
    def __reduce__(self):
        return (_refuse, ())

class UnreadableNumber(Unreadable):
    def __float__(self):
        return 0.25

def unreadable(prompts, completions, **kwargs):
    return [Unreadable()]

def unreadable_number(prompts, completions, **kwargs):
    return [UnreadableNumber()]
'''


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    """`user_rewards_mod` importable from the current directory, as a TRL user's module is."""
    where = tmp_path_factory.mktemp("user")
    (where / "user_rewards_mod.py").write_text(textwrap.dedent(MODULE))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(where)
        yield where
        sys.modules.pop("user_rewards_mod", None)
        if str(where) in sys.path:
            sys.path.remove(str(where))


@pytest.fixture(scope="module")
def runner(user_module):
    # One worker process, as a run's "auto" isolation puts these (unmarked) rewards there.
    with RewardRunner(RewardConfig(workers=1, timeout_s=20)) as r:
        yield r


PLAIN = Example("rows.jsonl:7", "2+3=", "5", meta={"answer": 5, "level": 3})
CHAT = Example("rows.jsonl:8", ({"role": "user", "content": "2+3="},), "5", meta={})


def ref(name):
    return TRLReward(f"user_rewards_mod:{name}", name)


def test_a_trl_reward_is_called_as_trl_calls_it(runner):
    assert runner.mode(ref("matches")) == "process"
    assert runner.score(ref("matches"), "it is 5", PLAIN) == 1.0
    assert runner.score(ref("matches"), "it is 6", PLAIN) == 0.0
    # plain: strings, every column but the prompt as a keyword list (answer, level)
    assert runner.score(ref("shape"), "ok", PLAIN) == 1.0 + 20
    # conversational prompt: the completion is one assistant message
    assert runner.score(ref("shape"), "ok", CHAT) == 2.0
    # without **kwargs: only the arguments it names
    assert runner.score(ref("named_only"), "ok", PLAIN) == 3.0
    assert runner.metrics()["reward/errors"] == 0


def test_weights_and_names_of_several_rewards(user_module):
    fn = rewards(["user_rewards_mod:matches", "user_rewards_mod:named_only"], [1.0, 0.5])
    assert [(n, w) for n, _, w in fn.parts] == [("matches", 1.0), ("named_only", 0.5)]
    with RewardRunner(RewardConfig(isolation="thread")) as r:
        s = r.score_batch(fn, ["5", "x"], [PLAIN, PLAIN])
    assert s.total.tolist() == [1.0 + 1.5, 1.5]
    with pytest.raises(ValueError, match="2 weights for 1 rewards"):
        rewards(["user_rewards_mod:matches"], [1.0, 2.0])
    with pytest.raises(ValueError, match="has no 'nope'"):
        rewards(["user_rewards_mod:nope"])
    with pytest.raises(ValueError, match="cannot import 'no_such_module_x'"):
        rewards(["no_such_module_x:fn"])


BAD = [  # (reward, what the error says)
    ("raises", "RuntimeError: user bug"),
    ("two_values", "returned 2 values for 1 completion"),
    ("scalar", "returned float, not a list"),
    ("nan", "non-finite nan"),
    ("inf", "non-finite inf"),
    ("numeric_string", "returned the str '0.5', not a number"),
    ("huge_float", "1e\\+39, outside"),
    ("huge_int", "not a number \\(OverflowError\\)"),
    ("unreadable", "not a number"),
]


@pytest.mark.parametrize("name,says", BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_a_counted_zero_naming_reward_and_row(runner, caplog, name, says):
    runner.metrics()
    runner._logged = 0  # each case's first failure is logged
    fn = rewards([f"user_rewards_mod:{name}", "user_rewards_mod:matches"])
    with caplog.at_level(logging.WARNING, logger="locojax.envs.rewards"):
        s = runner.score_batch(fn, ["it is 5"], [PLAIN])
    m = runner.metrics()
    assert m["reward/errors"] == 1 and m["reward/calls"] == 2
    assert s.parts[name].tolist() == [0.0] and s.total.tolist() == [1.0]  # only its own term
    logged = [r.getMessage() for r in caplog.records if "error" in r.getMessage()]
    assert len(logged) == 1
    assert f"reward {name}" in logged[0] and "row rows.jsonl:7" in logged[0]
    import re

    assert re.search(says, logged[0]), logged[0]


def test_a_value_that_does_not_unpickle_never_leaves_the_worker(runner):
    # Its __float__ is taken in the worker; only the float crosses back to the parent.
    assert runner.score(ref("unreadable_number"), "x", PLAIN) == 0.25
    assert runner.metrics()["reward/errors"] == 0


def test_none_does_not_apply_and_all_none_is_an_error(runner):
    runner.metrics()
    both = rewards(["user_rewards_mod:none", "user_rewards_mod:matches"], [1.0, 2.0])
    s = runner.score_batch(both, ["it is 5", "no"], [PLAIN, PLAIN])
    m = runner.metrics()
    assert s.total.tolist() == [2.0, 0.0] and m["reward/errors"] == 0
    # left out of its own mean: no row applied, so its mean is over nothing
    assert m["reward/none/mean"] == 0.0 and m["reward/matches/mean"] == 0.5
    s = runner.score_batch(ref("none"), ["a", "b"], [PLAIN, PLAIN])
    assert s.total.tolist() == [0.0, 0.0] and runner.metrics()["reward/errors"] == 2


def test_none_from_a_builtin_reward_is_still_an_error():
    def builtin(completion, example):
        return None

    with RewardRunner(RewardConfig(isolation="thread")) as r:
        assert r.score(builtin, "x", PLAIN) == 0.0
        assert r.metrics()["reward/errors"] == 1


def test_a_hung_user_reward_is_killed_at_its_deadline(user_module):
    import time

    with RewardRunner(RewardConfig(workers=1, timeout_s=1.0)) as r:
        r.score(ref("matches"), "5", PLAIN)  # the worker is up: time only the hang
        t0 = time.monotonic()
        s = r.score_batch(rewards(["user_rewards_mod:hangs", "user_rewards_mod:matches"]),
                          ["5"], [PLAIN])
        elapsed = time.monotonic() - t0
        m = r.metrics()
    assert s.total.tolist() == [1.0] and m["reward/timeouts"] == 1
    # 1 s deadline + replacing the killed worker (a spawn: a few seconds on a loaded machine)
    assert elapsed < 60
    assert math.isfinite(s.total[0])
