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
    share = t0.test.test_permille
    assert all(is_held_out(k, share) for k in test_keys)
    assert not any(is_held_out(k, share) for k in train_keys)
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
    assert task_names() == ["arith", "calc", "data", "gsm8k", "math", "swe"]
    assert make_task("arith", level=1).name == "arith"
    assert make_task("calc").multi_turn and not make_task("arith").multi_turn
    with pytest.raises(ValueError,
                       match="unknown task 'gsm9k'; valid tasks: arith, calc, data, gsm8k, math, swe"):
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


def test_chat_arith_asks_an_instruct_model_in_words():
    """Level 0 with the chat template: one user message per problem, the flexible reward
    reads the last number, and the format check wants the reply to end with it."""
    t = arith.task(level=0, template="chat", mode="flexible")
    assert len(t.test) == 200 and t.test.test_permille == 350
    for ex in list(t.train[:200]) + list(t.test):
        (msg,) = ex.prompt
        m = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\? Give only the final number\.",
                         msg["content"])
        assert msg["role"] == "user" and m, msg
        a, op, b = int(m[1]), m[2], int(m[3])
        assert 0 <= a <= 20 and 0 <= b <= 20 and int(ex.answer) == (a + b if op == "+" else a - b)
    ex = t.test[0]
    assert t.score(f"{ex.meta['key']} = {ex.answer}", ex)[0] == 1.0
    assert t.score(f"The answer is {ex.answer}.", ex)[0] == 1.0
    assert t.score(f"{ex.answer} is not it, {int(ex.answer) + 1}", ex)[0] == 0.0
    assert t.format_check(f"It is {ex.answer}.", ex)
    assert not t.format_check(f"{ex.answer}, because I said so", ex)
    assert not t.format_check("no number", ex)


def test_arith_options_are_checked():
    with pytest.raises(ValueError, match="template must be 'plain' or 'chat'"):
        arith.task(level=0, template="qwen")
    with pytest.raises(ValueError, match="'\\*' needs exactly 2 operands"):
        arith.ArithConfig(operands=3, ops="+*")
    times = arith.task(config=arith.ArithConfig(operands=2, min_digits=1, max_digits=1,
                                                 ops="*"), template="chat", mode="flexible",
                       test_size=5)
    ex = times.test[0]
    a, b = map(int, ex.meta["key"].split("*"))
    assert int(ex.answer) == a * b and " * " in ex.prompt[0]["content"]


def test_the_reward_is_chosen_from_the_config_or_refused():
    from pathlib import Path

    from locojax.envs.registry import TaskConfig, build

    data = str(Path(__file__).parent / "data" / "gsm8k_small.jsonl")
    ex_text = "so the total is 42"
    for name, extra in (("arith", {"level": 0}), ("gsm8k", {"data": data})):
        strict = build(TaskConfig(name=name, **extra), seed=0)
        flexible = build(TaskConfig(name=name, reward="flexible", **extra), seed=0)
        ex = flexible.test[0]
        said = ex_text.replace("42", ex.answer)
        assert flexible.score(said, ex)[0] == 1.0 and strict.score(said, ex)[0] == 0.0
        weighted = build(TaskConfig(name=name, format_weight=0.5, **extra), seed=0)
        assert weighted.score(f"{said}\n#### {ex.answer}", ex)[0] == 1.5
    with pytest.raises(ValueError, match="task.reward must be one of strict, flexible"):
        TaskConfig(reward="lenient")
    with pytest.raises(ValueError, match="task.format_weight must be >= 0"):
        TaskConfig(format_weight=-1.0)
    with pytest.raises(ValueError, match="task 'calc' has its own reward"):
        build(TaskConfig(name="calc", reward="flexible"), seed=0)
    with pytest.raises(ValueError, match="task 'math' scores"):
        build(TaskConfig(name="math", data=data, reward="flexible"), seed=0)


def test_a_preset_reward_is_replaced_from_the_command_line_not_added_to():
    """real-demo's preset reward is flexible: --task.reward replaces it (an appending flag
    made it ("flexible", "strict"), refused as a list of built-ins)."""
    import tyro

    from locojax.train.config import PRESETS

    def reward(*argv):
        return tyro.extras.overridable_config_cli(PRESETS, args=["real-demo", *argv]).task.reward

    assert reward() == ("flexible",)
    assert reward("--task.reward", "strict") == ("strict",)
    assert reward("--task.reward", "m:a", "m:b") == ("m:a", "m:b")
