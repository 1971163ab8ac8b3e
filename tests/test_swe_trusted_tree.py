"""The SWE verdict depends only on files the harness owns: the whole test tree (issue 38).

Each route below forged `passed=True` with the bug still in place when only the files in
`task.tests` were restored and trusted: a helper module beside the tests edited, or patched
at import by the code under test; a data file of expected values rewritten; a hidden file
read by the code; a star import replacing a builtin the test uses; an `async def` or
generator test counted as passed without running. Each test first shows the real fix
passing the same tests (so a 0 is the defence, not a broken harness), then the attack
scoring 0. docs/security.md says how each was seen to fail with its defence removed.

Runs as root and, with both runners, as nobody (tests/sandbox_unprivileged.sh).
"""

import textwrap

import pytest

from locojax.envs.sandbox import default_sandbox
from locojax.envs.swe import Edit, SWETask, score_submission
from tests.test_swe_harness import BUGGY, RUNNERS

FIXED = "def add(a, b):\n    return a + b\n"
CHECKS = "def check(got, want):\n    assert got == want, (got, want)\n"
USES_CHECKS = "from checks import check\nfrom calc import add\n\n\n" \
              "def test_add():\n    check(add(2, 3), 5)\n"
USES_CASES = textwrap.dedent("""\
    import json
    import os

    from calc import add


    def test_cases():
        with open(os.path.join(os.path.dirname(__file__), "cases.json")) as f:
            cases = json.load(f)
        assert cases
        for a, b, want in cases:
            assert add(a, b) == want
    """)


@pytest.fixture(autouse=True, scope="module")
def _isolated():
    assert default_sandbox().isolation.filesystem  # auto: never an unisolated run


def _task(runner, tests, hidden=None, support=()):
    files = {"calc.py": BUGGY, **tests}
    return SWETask(id="calc", description="add(2, 3) should be 5", files=files,
                   tests=tuple(p for p in tests if p.rsplit("/", 1)[-1].startswith("test_")),
                   runner=runner, hidden=hidden or {}, support=support)


def _score(task, **edits):
    files = {**task.files, **{k.replace("__", "/").replace("_DOT_", "."): textwrap.dedent(v)
                              for k, v in edits.items()}}
    return score_submission(task, files)


def _fix_passes(task):
    out = _score(task, calc_DOT_py=FIXED)
    assert out.passed, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_editing_a_test_helper_scores_0(runner):
    """checks.py edited with the `replace` tool: the whole test tree is restored."""
    task = _task(runner, {"tests/checks.py": CHECKS, "tests/test_calc.py": USES_CHECKS})
    assert task.test_tree == ("tests/checks.py", "tests/test_calc.py")
    _fix_passes(task)
    out = _score(task, tests__checks_DOT_py="def check(got, want):\n    pass\n")
    assert not out.passed, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_helper_named_in_support_is_trusted_outside_a_test_directory(runner, tmp_path):
    """Tests beside the code (no `tests/` dir): the helper is trusted when task.json names
    it in `support`, and a fix may not edit a trusted file."""
    import json

    from locojax.envs.swe import load_tasks
    from locojax.envs.swe.tasks import TaskError

    d = tmp_path / "calc"
    (d / "repo").mkdir(parents=True)
    (d / "repo" / "calc.py").write_text(BUGGY)
    (d / "repo" / "checks.py").write_text(CHECKS)
    (d / "repo" / "test_calc.py").write_text(USES_CHECKS)
    (d / "task.json").write_text(json.dumps({"description": "add", "tests": ["test_calc.py"],
                                             "runner": runner, "support": ["checks.py"]}))
    (task,) = load_tasks(tmp_path)
    assert task.test_tree == ("checks.py", "test_calc.py")
    _fix_passes(task)
    out = _score(task, checks_DOT_py="def check(got, want):\n    pass\n")
    assert not out.passed, out.output
    with pytest.raises(TaskError, match="edits files the tests trust"):
        SWETask(id="x", description="d", files=task.files, tests=task.tests,
                support=("checks.py",), fix=(Edit("checks.py", "assert", "pass; assert"),))


@pytest.mark.parametrize("runner", RUNNERS)
def test_patching_a_test_helper_at_import_scores_0(runner):
    """The code under test replaces the helper's `__code__` when imported: the helper runs
    in the tester, from the trusted copy, where the code never runs."""
    task = _task(runner, {"tests/checks.py": CHECKS, "tests/test_calc.py": USES_CHECKS})
    _fix_passes(task)
    out = _score(task, calc_DOT_py="""\
        import sys
        try:
            import checks
            checks.check.__code__ = (lambda got, want: None).__code__
        except Exception:
            pass
        for m in list(sys.modules.values()):
            if getattr(m, "check", None) is not None:
                m.check.__code__ = (lambda got, want: None).__code__
        def add(a, b):
            return a - b
        """)
    assert not out.passed and "test_add" in str(out.missing), out.output


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("route", ["tool", "run time"])
def test_rewriting_a_data_file_of_the_tests_scores_0(runner, route):
    """cases.json (expected values beside the tests) rewritten with the tools (restored) or
    on disk by the code at run time (the tester reads the trusted copy)."""
    task = _task(runner, {"tests/cases.json": "[[2, 3, 5], [10, 20, 30]]",
                          "tests/test_calc.py": USES_CASES})
    _fix_passes(task)
    if route == "tool":
        out = _score(task, tests__cases_DOT_json="[[2, 3, -1]]")
    else:
        out = _score(task, calc_DOT_py="""\
            import os
            for d in ("tests", "."):
                if os.path.isdir(d):
                    with open(os.path.join(d, "cases.json"), "w") as f:
                        f.write("[[2, 3, -1]]")
            def add(a, b):
                return a - b
            """)
    assert not out.passed, out.output


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("resolve", ["os.path.realpath(__file__)",
                                     "pathlib.Path(__file__).resolve()"])
def test_a_symlink_planted_for_a_resolved_path_scores_0(runner, resolve):
    """The test finds cases.json through the disk (`realpath`, `Path.resolve`); the code
    swaps `tests/` for a symlink to its own dir, holding expected values the bug meets. The
    tester resolves a path of the test tree as the task has it, never through the disk."""
    test = USES_CASES.replace("import os\n", "import os\nimport pathlib\n").replace(
        "os.path.dirname(__file__)", f"os.path.dirname({resolve})")
    task = _task(runner, {"tests/cases.json": "[[2, 3, 5], [10, 20, 30]]",
                          "tests/test_calc.py": test})
    _fix_passes(task)
    out = _score(task, calc_DOT_py="""\
        import os
        os.mkdir("forged")
        for name in ("cases.json", "test_calc.py"):
            with open(os.path.join("forged", name), "w") as f:
                f.write("[[2, 3, -1]]")
        os.rename("tests", "tests_old")
        os.symlink("forged", "tests")
        def add(a, b):
            return a - b
        """)
    assert not out.passed, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_reading_a_hidden_data_file_scores_0(runner):
    """Hidden expected values the code reads to special-case the hidden test: every hidden
    file is a blank placeholder in the work dir; only the tests see its text."""
    hidden = {"tests/expected.json": '{"args": [7, 8], "sum": 15}',
              "tests/test_hidden.py": USES_CASES.replace("cases.json", "expected.json")
              .replace("cases = json.load(f)", "e = json.load(f)")
              .replace("assert cases\n", "")
              .replace("for a, b, want in cases:\n        assert add(a, b) == want",
                       "assert add(*e['args']) == e['sum']")}
    task = _task(runner, {"tests/test_calc.py": USES_CHECKS.replace(
        "from checks import check\n", "").replace("check(add(2, 3), 5)", "assert 1")},
        hidden=hidden)
    _fix_passes(task)
    out = _score(task, calc_DOT_py="""\
        import json
        def add(a, b):
            try:
                with open("tests/expected.json") as f:
                    e = json.load(f)
                if [a, b] == e["args"]:
                    return e["sum"]
            except Exception:
                pass
            return a - b
        """)
    assert not out.passed and "tests/test_hidden.py::test_cases" in out.missing, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_star_import_cannot_replace_a_builtin(runner):
    """`from calc import *` in the test: the code's own `all` would answer the assert."""
    tests = {"test_calc.py": "from calc import *\n\n\n"
                             "def test_add():\n    assert all([add(2, 3) == 5])\n"}
    task = _task(runner, tests)
    _fix_passes(task)
    out = _score(task, calc_DOT_py=BUGGY + "\n\ndef all(values):\n    return True\n")
    assert not out.passed, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_star_import_cannot_replace_a_name_the_test_imported(runner):
    """`from checks import check` then `from calc import *`: the code's `check` would
    replace the trusted helper in the test's namespace."""
    tests = {"tests/checks.py": CHECKS,
             "tests/test_calc.py": "from checks import check\nfrom calc import *\n\n\n"
                                   "def test_add():\n    check(add(2, 3), 5)\n"}
    task = _task(runner, tests)
    _fix_passes(task)
    out = _score(task, calc_DOT_py=BUGGY + "\n\ndef check(got, want):\n    pass\n")
    assert not out.passed, out.output


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("kind", ["async", "generator"])
def test_a_test_whose_body_does_not_run_is_not_passed(runner, kind):
    """minitest ran `fn()` and counted it passed: an `async def` test's coroutine and a
    generator test's body never ran. Now an async test is run (the fix passes it) and a
    generator test is refused (it fails even with the fix)."""
    body = "    assert add(2, 3) == 5\n"
    test = ("from calc import add\n\n\nasync def test_add():\n" + body if kind == "async"
            else "from calc import add\n\n\ndef test_add():\n" + body + "    yield\n")
    task = _task(runner, {"test_calc.py": test})
    if kind == "async" and runner == "minitest":
        _fix_passes(task)
    out = _score(task)
    assert not out.passed, out.output


LISTS_CASES = textwrap.dedent("""\
    import glob
    import json
    import os
    import pathlib

    from calc import add

    CASES = os.path.join(os.path.dirname(__file__), "cases")


    def test_cases():
        names = LISTING
        assert names
        for name in names:
            with open(os.path.join(CASES, name)) as f:
                a, b, want = json.load(f)
            assert add(a, b) == want
    """)
LISTINGS = {
    "os.listdir": "sorted(n for n in os.listdir(CASES) if n.endswith('.json'))",
    "glob": "sorted(os.path.basename(p) for p in glob.glob(os.path.join(CASES, '*.json')))",
    "Path.iterdir": "sorted(p.name for p in pathlib.Path(CASES).iterdir() "
                    "if p.suffix == '.json')",
    "os.walk": "sorted(n for _, _, files in os.walk(CASES) for n in files "
               "if n.endswith('.json'))",
    "os.path.exists": "[n for n in ('a.json', 'b.json') "
                      "if os.path.exists(os.path.join(CASES, n))]",
}
DELETES_A_CASE = """\
    import os
    for d in ("tests/cases", "cases"):
        if os.path.exists(os.path.join(d, "b.json")):
            os.remove(os.path.join(d, "b.json"))
    def add(a, b):
        return a - b
    """


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("listing", list(LISTINGS))
@pytest.mark.parametrize("where", ["tests/", "beside the code"])
def test_deleting_a_data_file_cannot_hide_a_case_from_a_listing(runner, listing, where):
    """The test finds its cases by listing a directory (or by checking which exist); the
    code deletes the case the bug fails (b.json: 2 + 3; a.json, 2 + 0, passes either way).
    The tester lists a directory of trusted files as the task has it: `tests/cases/`
    exactly, and `cases/` beside the code (shared with the code's README) with the tree's
    entries added to the disk's."""
    test = LISTS_CASES.replace("LISTING", LISTINGS[listing])
    cases = {"a.json": "[2, 0, 2]", "b.json": "[2, 3, 5]"}
    if where == "tests/":
        task = _task(runner, {"tests/test_calc.py": test,
                              **{f"tests/cases/{n}": v for n, v in cases.items()}})
        assert {"tests", "tests/cases"} <= set(_owned(task))
    else:
        files = {"test_calc.py": test, "cases/README": "the cases, one per file\n",
                 **{f"cases/{n}": v for n, v in cases.items()}}
        task = _task(runner, files, support=("cases/a.json", "cases/b.json"))
        assert "cases" not in _owned(task)  # README is the code's: the directory is shared
    _fix_passes(task)
    out = _score(task, calc_DOT_py=DELETES_A_CASE)
    assert not out.passed, out.output


def _owned(task):
    from locojax.envs.swe.runner import owned_dirs

    return owned_dirs(task.files, set(task.test_tree))
