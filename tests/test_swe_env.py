"""The SWE-style environment: tools, episode rules, rewards, generated tasks and user task loading.

An oracle policy (knows the fix) earns 1; wrong policies (no fix, a wrong fix, editing the tests,
killing the test runner, special-casing the visible test against hidden ones) earn 0; invalid
calls and path escapes give error observations and never crash.
"""

import json
import logging
import os
import random

import pytest

from locojax.envs.base import Example, MultiTurnEnv, format_tool_call
from locojax.envs.sandbox import default_sandbox
from locojax.envs.swe import (
    Edit, SWEConfig, SWEEnv, SWETask, TaskError, generate_tasks, load_task, load_tasks,
    oracle_actions, run_tests, task, to_example, transcript_reward, validate_task,
)
from locojax.envs.swe import tools
from locojax.envs.swe.generate import KINDS, TEMPLATES, make_task
from locojax.envs.swe.runner import expected_tests
from locojax.envs.swe.tasks import replace_action

CALC = {
    "calc.py": '"""Arithmetic."""\n\n\ndef add(a, b):\n    return a - b\n\n\n'
               'def double(x):\n    return x + x\n',
    "test_calc.py": "from calc import add, double\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
                    "\n\ndef test_double():\n    assert double(4) == 8\n",
}


def calc_task(**kw) -> SWETask:
    args = dict(id="calc", description="add(2, 3) should be 5", files=CALC,
                tests=("test_calc.py",), runner="minitest",
                fix=(Edit("calc.py", "    return a - b", "    return a + b"),))
    return SWETask(**{**args, **kw})


def play(env: SWEEnv, example: Example, actions):
    obs = env.reset(example)
    steps = []
    for a in actions:
        steps.append(env.step(a))
        if steps[-1].done:
            break
    return obs, steps


# -- tools ----------------------------------------------------------------------------------------


def test_paths_are_normalised_or_rejected():
    assert tools.check_path(" ./pkg//m.py ") == "pkg/m.py"
    for bad in ("", "../x.py", "/etc/passwd", "pkg/../../x", "a\\b", "a\x00b"):
        with pytest.raises(tools.ToolError):
            tools.check_path(bad)


def test_replace_argument_forms():
    assert tools.parse_replace("a.py\n<old>\nx = 1\n</old>\n<new>\nx = 2\n</new>") == \
        ("a.py", "x = 1", "x = 2")
    assert tools.parse_replace("a.py <old>1</old><new>2</new>") == ("a.py", "1", "2")
    # only one newline next to each tag is syntax; further ones are text
    assert tools.parse_replace("a.py\n<old>\n\nx\n\n</old><new></new>") == ("a.py", "\nx\n", "")
    path, text, msg = tools.replace(CALC, "calc.py\n<old>\n    return a - b\n</old>\n<new>\n"
                                          "    return a + b\n</new>")
    assert path == "calc.py" and text == CALC["calc.py"].replace("a - b", "a + b")
    assert "5|     return a + b" in msg
    # the demonstration text for an Edit parses back to the same edit
    e = Edit("calc.py", "    return a - b", "    return a + b\n")
    call = replace_action(e)
    assert tools.parse_replace(call[len("<tool>replace "):-len("</tool>")]) == tuple(e)


# -- episode rules --------------------------------------------------------------------------------


def test_oracle_policy_gets_reward_1_on_every_level():
    for level in (1, 2, 3):
        t = generate_tasks(1, seed=11, level=level)[0]
        env = SWEEnv()
        assert isinstance(env, MultiTurnEnv)
        prompt, steps = play(env, to_example(t), oracle_actions(t))
        assert t.description in prompt and all(p in prompt for p in t.files)
        assert [s.done for s in steps] == [False] * (len(steps) - 1) + [True]
        run = steps[-2]
        assert run.info["tests_passed"] and "[all tests passed]" in run.observation
        assert steps[-1].reward == 1.0 and steps[-1].info["submitted"]
        assert sum(s.reward for s in steps) == 1.0


def test_wrong_policies_get_reward_0(tmp_path):
    ex = to_example(calc_task())
    submit = format_tool_call("submit")

    # 1. submit without fixing
    _, steps = play(SWEEnv(), ex, [submit])
    assert steps[-1].done and steps[-1].reward == 0.0 and not steps[-1].info["tests_passed"]

    # 2. a wrong fix
    wrong = replace_action(Edit("calc.py", "    return a - b", "    return a * b"))
    _, steps = play(SWEEnv(), ex, [wrong, submit])
    assert steps[-1].reward == 0.0

    # 3. "fixing" the test instead of the code: run_tests passes, but scoring restores the test
    cheat = replace_action(Edit("test_calc.py", "assert add(2, 3) == 5", "assert add(2, 3) == -1"))
    _, steps = play(SWEEnv(), ex, [cheat, format_tool_call("run_tests"), submit])
    assert steps[1].info["tests_passed"]
    assert steps[-1].reward == 0.0 and not steps[-1].info["tests_passed"]

    # 4. killing the runner with exit status 0 before it can report (and poking the host)
    marker = tmp_path / "marker"
    kill = replace_action(Edit("calc.py", '"""Arithmetic."""',
                               f'import os\ntry:\n    open({str(marker)!r}, "w")\n'
                               f'except OSError:\n    pass\nos._exit(0)'))
    _, steps = play(SWEEnv(), ex, [kill, format_tool_call("run_tests"), submit])
    assert "[tests FAILED]" in steps[1].observation
    assert steps[-1].reward == 0.0
    if default_sandbox().isolation.filesystem:
        assert not marker.exists()


def test_runs_under_the_text_episode_driver():
    from text_episodes import episode_metrics, run_episodes

    tasks = generate_tasks(2, seed=7)
    examples = [to_example(t) for t in tasks]
    plans = {examples[0].prompt: oracle_actions(tasks[0], run_tests=False),  # knows the fix
             examples[1].prompt: ["<tool>view</tool>", "<tool>submit</tool>"]}  # does not

    def policy(transcripts):
        out = []
        for tr in transcripts:
            prompt = next(p for p in plans if tr.startswith(p))
            out.append(plans[prompt][tr[len(prompt):].count("<tool>")] + " trailing text")
        return out

    episodes = run_episodes(policy, lambda: SWEEnv(), examples, max_turns=6)
    assert [ep.reward for ep in episodes] == [1.0, 0.0]
    assert all(ep.done and not ep.error for ep in episodes)
    model = [s.text for s in episodes[0].segments if s.is_model]
    assert model == plans[examples[0].prompt]  # text after </tool> was cut by the driver
    assert episode_metrics(episodes)["env/reward/mean"] == 0.5


def test_invalid_calls_and_escapes_are_error_observations():
    ex = to_example(calc_task())
    env = SWEEnv(SWEConfig(max_turns=50))
    env.reset(ex)
    bad = [
        "I think the bug is in add.",                        # no tool call
        "<tool></tool>",                                      # empty call
        "<tool>rm -rf /</tool>",                              # unknown tool
        "<tool>view nothere.py</tool>",
        "<tool>view ../../etc/passwd</tool>",
        "<tool>view /etc/passwd</tool>",
        "<tool>view sub/../../secret</tool>",
        "<tool>replace calc.py return a + b</tool>",         # no <old>/<new>
        "<tool>replace calc.py <old>return a * b</old><new>x</new></tool>",   # not found
        "<tool>replace calc.py <old>return</old><new>x</new></tool>",         # ambiguous
        "<tool>replace calc.py <old></old><new>x</new></tool>",               # empty old
        "<tool>replace ../calc.py <old>a - b</old><new>a + b</new></tool>",   # escape
        "<tool>replace /work/x.py <old>a</old><new>b</new></tool>",           # absolute
        "<tool>replace new.py <old>a</old><new>b</new></tool>",               # no such file
        "<tool>replace <old>a - b</old><new>a + b</new></tool>",              # no path
    ]
    for i, action in enumerate(bad):
        step = env.step(action)
        assert not step.done and step.reward == 0.0, action
        assert step.observation.startswith("<result>error:"), (action, step.observation)
        assert step.info["error"] in ("no_tool_call", "bad_call") and step.info["turn"] == i + 1
    for action in bad[4:7] + bad[11:13]:
        assert "outside the repository" in env.step(action).observation
    assert env.files == CALC  # nothing was changed by the failed calls
    listing = env.step("<tool>view</tool>").observation
    assert "calc.py" in listing and "test_calc.py" in listing
    assert "return a - b" in env.step("<tool>view calc.py</tool>").observation


def test_max_turns_autosubmit_and_misuse():
    ex = to_example(calc_task())
    view = format_tool_call("view", "calc.py")
    env = SWEEnv(SWEConfig(max_turns=3))
    _, steps = play(env, ex, [view] * 5)
    assert len(steps) == 3 and steps[-1].done and steps[-1].reward == 0.0
    assert steps[-1].info["truncated"] and steps[-1].observation == ""
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(view)

    fix = replace_action(calc_task().fix[0])
    _, steps = play(SWEEnv(SWEConfig(max_turns=2, autosubmit=True)), ex, [fix, view])
    assert steps[-1].done and steps[-1].reward == 1.0 and steps[-1].info["truncated"]
    assert not steps[-1].info["submitted"]

    with pytest.raises(RuntimeError, match="before reset"):
        SWEEnv().step(view)
    with pytest.raises(TypeError, match="swe_task"):
        SWEEnv().reset(Example("x", "prompt", "1"))
    with pytest.raises(ValueError, match="max_turns"):
        SWEConfig(max_turns=0)


def test_observations_are_truncated():
    big = {**CALC, "data.py": "".join(f"X{i} = {i}\n" for i in range(5000))}
    env = SWEEnv(SWEConfig(result_limit=500))
    env.reset(to_example(calc_task(files=big)))
    obs = env.step("<tool>view data.py</tool>").observation
    assert len(obs) < 600 and "chars truncated" in obs
    assert "X0 = 0" in obs and "X4999 = 4999" in obs  # head and tail kept


def test_task_record_validation():
    with pytest.raises(TaskError, match="not in the repository"):
        calc_task(tests=("test_other.py",))
    with pytest.raises(TaskError, match="outside the repository"):
        calc_task(files={**CALC, "../x.py": ""})
    with pytest.raises(TaskError, match="runner"):
        calc_task(runner="nose")
    with pytest.raises(TaskError, match="exactly once"):
        calc_task(fix=(Edit("calc.py", "return", "x"),)).fixed_files()


# -- generated tasks ------------------------------------------------------------------------------


def _check_values(src: str, checks) -> list[bool]:
    ns: dict = {}
    exec(src, ns)  # our own template code (trusted), not model output
    ok = []
    for call, want in checks:
        try:
            ok.append(eval(call, ns) == want)
        except Exception:  # noqa: BLE001 - e.g. the ZeroDivisionError of a missing case
            ok.append(False)
    return ok


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_templates_fix_is_right_and_bug_is_caught(name):
    for seed in range(25):
        bug = TEMPLATES[name](random.Random(seed))
        assert bug.kind in KINDS and bug.good != bug.bad
        assert all(_check_values(bug.good, bug.checks)), (name, seed)
        assert not _check_values(bug.bad, bug.checks)[0], (name, seed)  # first check exposes it


def test_generated_tasks_are_consistent():
    rng = random.Random(5)
    for level in (1, 2, 3):
        for _ in range(20):
            t = make_task(rng, level)
            assert t.runner == "minitest" and len(t.fix) == 1
            edit = t.fix[0]
            # the oracle's edit goes through the real replace tool and yields the fixed repo
            path, text, _ = tools.replace(t.files, replace_action(edit)[len("<tool>replace "):
                                                                        -len("</tool>")])
            assert {**t.files, path: text} == t.fixed_files()
            want = expected_tests(t.files, t.tests, "minitest")
            assert len(want) == {1: 1, 2: 3, 3: 4}[level]
            assert any(f"::test_" in w for w in want)
            assert t.meta["kind"] in KINDS and t.meta["level"] == level


def test_generation_is_seeded_and_splits_never_overlap():
    a = generate_tasks(40, seed=3, level=2)
    assert [t.id for t in a] == [t.id for t in generate_tasks(40, seed=3, level=2)]
    assert len({t.id for t in a}) == 40
    assert {t.meta["kind"] for t in a} == set(KINDS)
    b = generate_tasks(40, seed=4, level=2)
    assert len({t.id for t in a} & {t.id for t in b}) < 5
    test = generate_tasks(15, seed=3, level=2, split="test")
    assert all(t.meta["split"] == "test" for t in test)
    assert not {t.id for t in a + b} & {t.id for t in test}
    only = generate_tasks(10, seed=0, kinds=("missing_case",))
    assert {t.meta["kind"] for t in only} == {"missing_case"}
    with pytest.raises(ValueError, match="split"):
        generate_tasks(1, split="valid")
    with pytest.raises(ValueError, match="level"):
        generate_tasks(1, level=7)


def test_task_refuses_to_start_without_isolation(monkeypatch):
    """The task runs model code: building it resolves its sandbox, and `auto` with nothing to
    isolate with is an error that says how to get isolation, or how to ask for none."""
    from locojax.envs.sandbox import HOW_TO_ISOLATE, SandboxError
    from locojax.envs.swe import workload

    def nothing_works(mode="auto"):
        raise SandboxError("no sandbox isolation works here (namespaces: unshare: EPERM). "
                           + HOW_TO_ISOLATE)

    monkeypatch.setattr(workload, "default_sandbox", nothing_works)
    with pytest.raises(SandboxError, match=r"--task\.sandbox none"):
        task(level=1, train_size=10, test_size=2)
    with pytest.raises(ValueError, match="sandbox must be one of"):
        task(sandbox="docker")
    asked = []  # by name: the task, its env and its reward all use the mode asked for
    monkeypatch.setattr(workload, "default_sandbox", asked.append)
    t = task(level=1, train_size=10, test_size=2, sandbox="none")
    assert asked == ["none"] and t.reward.sandbox == "none"
    assert t.make_env().config.sandbox == "none" and t.reward.name == "transcript_reward"
    # From a run's config (--task.sandbox): the pre-flight check (before any process or actor
    # starts) resolves it, then the registry passes it to the task.
    from locojax.envs import registry, sandbox

    monkeypatch.setattr(sandbox, "default_sandbox", asked.append)
    t = registry.build(registry.TaskConfig(name="swe", level=1, train_size=10, sandbox="none"),
                       seed=0)
    assert asked == ["none"] * 3 and t.make_env().config.sandbox == "none"
    with pytest.raises(ValueError, match="task.sandbox must be one of"):
        registry.TaskConfig(name="swe", sandbox="docker")
    monkeypatch.setattr(sandbox, "default_sandbox", nothing_works)
    with pytest.raises(ValueError, match="task swe: no sandbox isolation works here"):
        registry.check(registry.TaskConfig(name="swe"))


def test_registry_task_demo_and_transcript_reward():
    t = task(level=1, train_size=100, test_size=10)
    assert t.name == "swe" and t.multi_turn and len(t.train) == 100 and len(t.test) == 10
    train_keys = {t.train[i].meta["key"] for i in range(100)}
    assert not train_keys & {e.meta["key"] for e in t.test}
    ex = t.train[3]
    demo = t.demo(ex)
    model_text = "".join(s.text for s in demo.segments if s.is_model)
    assert model_text.endswith(format_tool_call("submit"))
    assert any(not s.is_model and s.text.startswith("<result>") for s in demo.segments)
    assert t.reward(demo.completion, ex) == 1.0
    assert transcript_reward(format_tool_call("submit"), ex) == 0.0
    assert transcript_reward(model_text.replace("<tool>submit</tool>", ""), ex) == 0.0
    assert isinstance(t.make_env(), SWEEnv)


@pytest.mark.slow
def test_every_template_validates_in_the_sandbox():
    seen: dict[str, SWETask] = {}
    rng = random.Random(0)
    while len(seen) < len(TEMPLATES):
        t = make_task(rng, 1)
        seen.setdefault(t.meta["template"], t)
    for name, t in sorted(seen.items()):
        assert validate_task(t) == [], name


# -- user tasks -----------------------------------------------------------------------------------

STATS = '"""Statistics."""\n\n\ndef median(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]\n'
STATS_FIXED = ('"""Statistics."""\n\n\ndef median(xs):\n    xs = sorted(xs)\n    n = len(xs)\n'
               '    if n % 2 == 0:\n        return (xs[n // 2 - 1] + xs[n // 2]) / 2\n'
               '    return xs[n // 2]\n')
VISIBLE = ("import pytest\n\nfrom stats import median\n\n\n"
           "@pytest.mark.parametrize('xs, m', [([3, 1, 2], 2), ([4, 1, 3, 2], 2.5)])\n"
           "def test_median(xs, m):\n    assert median(xs) == m\n\n\n"
           "class TestEdges:\n    def test_single(self):\n        assert median([7]) == 7\n")
HIDDEN = "from stats import median\n\n\ndef test_more_even():\n    assert median([1, 2, 3, 10]) == 2.5\n"


def write_task(root, name="fix-median", spec=None, hidden=True, solution=True):
    d = root / name
    (d / "repo" / "tests").mkdir(parents=True)
    (d / "repo" / "stats.py").write_text(STATS)
    (d / "repo" / "tests" / "test_stats.py").write_text(VISIBLE)
    spec = spec if spec is not None else {"description": "median is wrong for even lengths",
                                          "tests": ["tests/test_stats.py"]}
    (d / "task.json").write_text(json.dumps(spec))
    if hidden:
        (d / "hidden" / "tests").mkdir(parents=True)
        (d / "hidden" / "tests" / "test_hidden.py").write_text(HIDDEN)
    if solution:
        (d / "solution").mkdir()
        (d / "solution" / "stats.py").write_text(STATS_FIXED)
    return d


def test_user_task_with_pytest_hidden_tests_and_solution(tmp_path):
    d = write_task(tmp_path)
    t = load_task(d)
    assert t.id == "fix-median" and t.runner == "pytest"
    assert t.score_tests == ("tests/test_stats.py", "tests/test_hidden.py")
    assert t.fixed_files()["stats.py"] == STATS_FIXED
    assert expected_tests(t.files, t.tests, "pytest") == {
        "tests/test_stats.py::test_median", "tests/test_stats.py::TestEdges::test_single"}
    assert validate_task(t) == []  # fails as given, passes with the solution
    ex = to_example(t)
    _, steps = play(SWEEnv(), ex, oracle_actions(t, run_tests=False))
    assert steps[-1].reward == 1.0

    # special-casing the visible test passes run_tests but not the hidden test at submit
    hack = replace_action(Edit("stats.py", "    return xs[len(xs) // 2]",
                               "    if xs == [1, 2, 3, 4]:\n        return 2.5\n"
                               "    return xs[len(xs) // 2]"))
    _, steps = play(SWEEnv(), ex, [hack, "<tool>run_tests</tool>", "<tool>submit</tool>"])
    assert steps[1].info["tests_passed"] and steps[-1].reward == 0.0
    assert steps[-1].info["missing_tests"] == ["tests/test_hidden.py::test_more_even"]


def test_skipped_or_vanished_tests_do_not_count_as_passing():
    files = {"m.py": "X = 1\n",
             "test_m.py": "import pytest\nfrom m import X\n\n\ndef test_x():\n    assert X == 1\n"
                          "\n\n@pytest.mark.skip\ndef test_skipped():\n    assert X == 1\n"}
    sb = default_sandbox()
    out = run_tests(sb, files, ["test_m.py"], "pytest")
    assert not out.passed and out.missing == ("test_m.py::test_skipped",) and out.n_failed == 0
    files["test_m.py"] = "from m import X\n\n\ndef test_x():\n    assert X == 1\n"
    assert run_tests(sb, files, ["test_m.py"], "pytest").passed
    # a module that exits the interpreter with status 0 during collection does not pass
    files["m.py"] = "import os\nos._exit(0)\n"
    out = run_tests(sb, files, ["test_m.py"], "minitest")
    assert not out.passed and out.missing == ("test_m.py::test_x",)


def test_loader_errors_name_the_problem(tmp_path):
    def expect(match, **kw):
        root = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        d = write_task(root, **kw)
        return d, match

    cases = [
        expect("invalid JSON", spec=None),
        expect("'description'", spec={"tests": ["tests/test_stats.py"]}),
        expect("'tests'", spec={"description": "x", "tests": "tests/test_stats.py"}),
        expect("not found", spec={"description": "x", "tests": ["tests/test_nope.py"]}),
        expect("unknown keys", spec={"description": "x", "tests": ["tests/test_stats.py"],
                                     "timeout": 3}),
        expect("runner", spec={"description": "x", "tests": ["tests/test_stats.py"],
                               "runner": "nose"}),
    ]
    (cases[0][0] / "task.json").write_text('{"description": "x",\n "tests": [}')
    for d, match in cases:
        with pytest.raises(TaskError, match=match) as e:
            load_task(d)
        assert str(d) in str(e.value)
    with pytest.raises(TaskError, match=r"task.json:2: invalid JSON"):
        load_task(cases[0][0])

    d = write_task(tmp_path / "binary")
    (d / "repo" / "blob.py").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TaskError, match=r"blob.py is not UTF-8"):
        load_task(d)
    d = write_task(tmp_path / "link")
    os.symlink("/etc/passwd", d / "repo" / "passwd")
    with pytest.raises(TaskError, match="symlinks are not allowed"):
        load_task(d)
    d = write_task(tmp_path / "extra")
    (d / "solution" / "new.py").write_text("x = 1\n")
    with pytest.raises(TaskError, match="not in repo"):
        load_task(d)
    d = write_task(tmp_path / "nojson")
    (d / "task.json").unlink()
    with pytest.raises(TaskError, match="missing task.json"):
        load_task(d)
    with pytest.raises(TaskError, match="does not exist"):
        load_tasks(tmp_path / "nowhere")


def test_load_tasks_skip_invalid(tmp_path, caplog):
    write_task(tmp_path, "a-good")
    write_task(tmp_path, "b-bad", spec={"description": "", "tests": ["tests/test_stats.py"]})
    with pytest.raises(TaskError, match="b-bad"):
        load_tasks(tmp_path)
    with caplog.at_level(logging.WARNING):
        got = load_tasks(tmp_path, skip_invalid=True)
    assert [t.id for t in got] == ["a-good"]
    assert "skipped 1 invalid SWE task" in caplog.text


def test_registry_task_from_user_dirs(tmp_path):
    write_task(tmp_path / "train", "t1")
    write_task(tmp_path / "test", "t2", spec={"description": "other", "tests":
                                              ["tests/test_stats.py"], "runner": "pytest"})
    with pytest.raises(TaskError, match="share 1 task"):
        task(train_dir=str(tmp_path / "train"), test_dir=str(tmp_path / "test"))
    t = task(train_dir=str(tmp_path / "train"))
    assert [e.id for e in t.train] == ["t1"] and len(t.test) == 0
    assert t.demo(t.train[0]).completion.endswith("<tool>submit</tool>")
