"""The environment protocol: tool-call format, combined rewards, ToolEnv episodes."""

import pytest

from locojax.envs.base import (
    Demo, Example, MultiTurnEnv, Segment, SingleTurnEnv, Task, ToolEnv, combine_rewards,
    format_result, format_tool_call, parse_tool_call, single_turn_demo, truncate_to_tool_call,
)


def test_parse_tool_call_forms():
    assert parse_tool_call("pre <tool>calc 3*4</tool> post") == ("calc", "3*4")
    # Multi-line args are kept verbatim after the single separating whitespace.
    assert parse_tool_call("<tool>replace a.py\nold\n new</tool>") == ("replace", "a.py\nold\n new")
    assert parse_tool_call("<tool>submit</tool>") == ("submit", "")
    assert parse_tool_call("<tool></tool>") == ("", "")
    assert parse_tool_call("#### 12") is None
    assert parse_tool_call("<tool>calc 1+1") is None  # unclosed: not a call
    # Only the first call counts.
    assert parse_tool_call("<tool>a 1</tool><tool>b 2</tool>") == ("a", "1")


def test_format_roundtrip_and_truncation():
    for name, args in [("calc", "12+30"), ("view", "src/x.py"), ("submit", "")]:
        assert parse_tool_call(format_tool_call(name, args)) == (name, args)
    call = "<tool>calc 1+2</tool>"
    assert truncate_to_tool_call(call + "<result>3</result>") == call
    assert truncate_to_tool_call("#### 3") == "#### 3"
    assert format_result("7") == "<result>7</result>\n"
    long = "a" * 50 + "b" * 50
    out = format_result(long, limit=20)
    assert out.startswith("<result>" + "a" * 10) and out.endswith("b" * 10 + "</result>\n")
    assert "80 chars truncated" in out


def test_combine_rewards_weights_and_flattening():
    ex = Example("e", "p", "5")

    def correct(c, e):
        return float(c == e.answer)

    def short(c, e):
        return float(len(c) < 3)

    r = combine_rewards([(correct, 1.0), (short, 0.5)])
    assert r("5", ex) == 1.5 and r("55555", ex) == 0.0 and r("4", ex) == 0.5
    nested = combine_rewards([(r, 2.0)])
    assert [(n, w) for n, _, w in nested.parts] == [("correct", 2.0), ("short", 1.0)]
    with pytest.raises(ValueError, match="unique"):
        combine_rewards([(correct, 1.0), (correct, 1.0)])
    with pytest.raises(TypeError, match="term 0"):
        combine_rewards([correct])
    with pytest.raises(ValueError):
        combine_rewards([])


def test_tool_env_episode():
    ex = Example("e", "3*4=", "12")
    env = ToolEnv({"calc": lambda a: str(eval(a))},
                  lambda c, e: float(c.strip() == "#### " + e.answer), max_tool_calls=2)
    assert isinstance(env, MultiTurnEnv)
    assert env.reset(ex) == "3*4="
    obs, r, done, info = env.step("<tool>calc 3*4</tool>")
    assert (obs, r, done) == ("<result>12</result>\n", 0.0, False) and info["tool"] == "calc"
    obs, r, done, _ = env.step("<tool>nope 1</tool>")
    assert "unknown tool 'nope'" in obs and "calc" in obs and not done
    obs, r, done, info = env.step("<tool>calc 1</tool>")  # third call > max_tool_calls
    assert done and r == 0.0 and info["error"] == "too many calls"
    env.reset(ex)
    assert env.step("#### 12") == ("", 1.0, True, {"tool_calls": 0})
    env.reset(ex)
    assert env.step("#### 13").reward == 0.0
    with pytest.raises(RuntimeError, match="before reset"):
        ToolEnv({}, lambda c, e: 0.0).step("x")


def test_task_is_a_single_turn_env_with_demos():
    exs = [Example(f"e{i}", f"{i}+1=", str(i + 1), f"#### {i + 1}") for i in range(3)]

    def correct(c, e):
        return float(c == e.solution)

    def brief(c, e):
        return float(len(c) <= 6)

    t = Task("t", exs, exs[:1], combine_rewards([(correct, 1.0), (brief, 0.25)]),
             demo=single_turn_demo)
    assert isinstance(t, SingleTurnEnv) and not t.multi_turn
    assert t.prompt(exs[0]) == "0+1="
    assert t.score("#### 1", exs[0]) == (1.25, {"reward/correct": 1.0, "reward/brief": 1.0})
    assert t.score("#### 22", exs[0]) == (0.0, {"reward/correct": 0.0, "reward/brief": 0.0})
    assert t.demos("train", n=2) == [Demo("0+1=", (Segment("#### 1", True),)),
                                     Demo("1+1=", (Segment("#### 2", True),))]
    assert len(t.demos("test")) == 1 and t.demos()[2].completion == "#### 3"
    with pytest.raises(ValueError, match="split"):
        t.demos("val")
    with pytest.raises(ValueError, match="no demonstration"):
        Task("t", exs, exs, correct).demos()
    with pytest.raises(ValueError, match="no solution"):
        single_turn_demo(Example("x", "p", "1"))
