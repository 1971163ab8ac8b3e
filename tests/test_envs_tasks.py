"""Built-in procedural tasks: disjoint splits, determinism, levels, demonstrations, registry."""

import re

import pytest

from locojax.envs.base import Demo
from locojax.envs.registry import make_task, task_names
from locojax.envs.tasks import arith, calc
from locojax.envs.tasks.procedural import ProceduralSplit, is_held_out

CASES = [("arith", lvl) for lvl in arith.LEVELS] + [("calc", lvl) for lvl in calc.LEVELS]


@pytest.mark.parametrize("name,level", CASES)
def test_train_and_test_never_overlap(name, level):
    t0 = make_task(name, level=level, seed=0, test_size=100)
    t1 = make_task(name, level=level, seed=1, test_size=100)
    test_keys = {e.meta["key"] for e in t0.test}
    assert len(test_keys) == len(t0.test) == 100  # held-out problems are distinct
    train_keys = {e.meta["key"] for t in (t0, t1) for e in t.train[:1500]}
    assert not train_keys & test_keys
    assert all(is_held_out(k) for k in test_keys)
    assert not any(is_held_out(k) for k in train_keys)
    # Other seeds sample other problems, but never from the held-out part either.
    assert {e.meta["key"] for e in t1.test} != test_keys


def test_partition_is_about_ten_percent_of_the_space():
    keys = [f"{a}+{b}" for a in range(10, 100) for b in range(10, 100)]
    share = sum(map(is_held_out, keys)) / len(keys)
    assert 0.08 < share < 0.12


def test_examples_are_a_pure_function_of_seed_and_index():
    a, b = arith.task(seed=3), arith.task(seed=3)
    assert a.train[12345] == b.train[12345] and a.train[-1] == a.train[len(a.train) - 1]
    assert [e.prompt for e in a.test] == [e.prompt for e in b.test]
    assert a.train[:3] == [a.train[0], a.train[1], a.train[2]]
    assert a.train[0].id == "train/0" and a.test[7].id == "test/7"
    assert [e.prompt for e in a.train[:20]] != [e.prompt for e in arith.task(seed=4).train[:20]]
    with pytest.raises(IndexError):
        a.train[len(a.train)]


@pytest.mark.parametrize("level", sorted(arith.LEVELS))
def test_arith_levels_demos_and_rewards(level):
    cfg = arith.at_level(level)
    t = arith.task(level=level, test_size=100)
    examples = list(t.train[:300]) + list(t.test)
    for ex in examples:
        nums = [int(n) for n in re.findall(r"\d+", ex.prompt)]
        ops = re.findall(r"[+-]", ex.prompt)
        assert len(nums) == cfg.operands and set(ops) <= set(cfg.ops)
        assert all(cfg.min_digits <= len(str(n)) <= cfg.max_digits for n in nums)
        assert int(ex.answer) == eval(ex.prompt[:-1]) >= 0  # noqa: S307 - our own digits
        demo = t.demo(ex)
        assert isinstance(demo, Demo) and demo.completion == ex.solution
        assert len(ex.prompt) <= 24 and len(demo.completion) <= 36
        assert t.score(demo.completion, ex)[0] == 1.0
        assert t.score(f"#### {int(ex.answer) + 1}", ex)[0] == 0.0
        assert t.score(ex.answer, ex)[0] == 0.0  # strict: the #### line is required
        for line in demo.completion.splitlines()[:-1]:  # chain lines are true and non-negative
            lhs, rhs = line.split("=")
            assert eval(lhs) == int(rhs) >= 0  # noqa: S307
    assert len(t.demos("test")) == 100 and len(t.demos("train", n=5)) == 5


@pytest.mark.parametrize("level", [2, 4])
def test_loose_format_demos_are_right_but_fail_the_strict_reward(level):
    t = arith.task(level=level, test_size=20)
    for ex in t.test:
        loose = arith.loose_format_demo(ex).completion
        gold = t.demo(ex).completion
        assert loose.splitlines()[:-1] == gold.splitlines()[:-1]  # same chain lines
        assert loose.splitlines()[-1] == f"The answer is {ex.answer}"
        assert t.score(loose, ex)[0] == 0.0 and t.score(gold, ex)[0] == 1.0


@pytest.mark.parametrize("level", sorted(calc.LEVELS))
def test_calc_demos(level):
    t = calc.task(level=level, test_size=50)
    assert t.multi_turn and t.max_turns == 3
    for ex in list(t.test) + list(t.train[:100]):
        d = t.demo(ex)
        assert [s.is_model for s in d.segments] == [True, False, True]
        assert all(len(s.text) <= 32 for s in d.segments) and len(ex.prompt) <= 24
        assert d.segments[1].text == f"<result>{ex.answer}</result>\n"
        assert str(eval(ex.meta["expr"])) == ex.answer  # noqa: S307
        # Replaying the demo through the environment earns the reward.
        env = t.make_env()
        assert env.reset(ex) == ex.prompt
        obs, r, done, _ = env.step(d.segments[0].text)
        assert obs == d.segments[1].text and not done
        assert env.step(d.segments[2].text)[1:3] == (1.0, True)


@pytest.mark.parametrize("expr,out", [
    ("374*29", "10846"), ("7/2", "3.5"), ("1/3", "0.333333"), ("(1+2)*-3", "-9"),
    ("1/0", "error: division by zero"), ("2**10", "error: unsupported syntax: BinOp"),
    ("__import__('os').system('x')", "error: unsupported syntax: Call"),
    ("9" * 10 + "*" + "9" * 10, "error: result too large"), ("", "error: empty expression"),
    ("1+", "error: cannot parse expression"),
    ("1" * 101, "error: expression longer than 100 chars"),
])
def test_calculator_is_safe_and_exact(expr, out):
    assert calc.calculator(expr) == out


def test_registry():
    assert task_names() == ["arith", "calc", "gsm8k", "math", "swe"]
    assert make_task("arith", level=1).name == "arith"
    assert make_task("calc").multi_turn and not make_task("arith").multi_turn
    with pytest.raises(ValueError,
                       match="unknown task 'gsm9k'; valid tasks: arith, calc, gsm8k, math, swe"):
        make_task("gsm9k")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['lvl'\]; valid options: level"):
        make_task("arith", lvl=2)
    with pytest.raises(TypeError, match="needs train_path, test_path"):
        make_task("math")
    with pytest.raises(ValueError, match="level must be one of"):
        make_task("arith", level=9)
    ex = make_task("arith").test[0]
    held = ex.meta["key"]
    with pytest.raises(ValueError, match="only 1 distinct held-out problems found, 5 requested"):
        ProceduralSplit(lambda rng: (held, ex), "test", 0, 5)  # one problem, 5 wanted
