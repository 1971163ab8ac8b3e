"""The SWE reward cannot be forged by the code under test: one test per forgery route, each
with both runners, each scoring 0 where the old in-process runner (a report file in the work
dir, written by the process that imported the code) scored 1 for at least one runner.

Every route starts from the same bug (`add` subtracts) and a "patch" that, instead of fixing
it, attacks the verdict. The control (`test_the_real_fix_passes`) shows the same tests do pass
a fixed `add`, so a 0 below is the harness refusing the forgery, not a broken harness. The
legitimate-use tests show what still crosses between the tester and the code: exceptions
(builtin and the code's own), in-place mutation, packages, star imports, objects whose
methods return plain values.

Runs as root and, with both runners, as nobody (tests/sandbox_unprivileged.sh).
"""

import os
import textwrap

import pytest

from locojax.envs.sandbox import Limits, default_sandbox
from locojax.envs.swe import Edit, SWETask, score_submission
from locojax.envs.swe.runner import parse_channel, run_tests

RUNNERS = ["minitest", "pytest"]
BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
HIDDEN = "from calc import add\n\n\ndef test_add_more():\n    assert add(10, 20) == 30\n"


def task(runner: str) -> SWETask:
    return SWETask(id="calc", description="add(2, 3) should be 5",
                   files={"calc.py": BUGGY, "test_calc.py": TESTS}, tests=("test_calc.py",),
                   runner=runner, hidden={"test_hidden.py": HIDDEN},
                   fix=(Edit("calc.py", "a - b", "a + b"),))


def submit(runner: str, calc_py: str, limits: Limits | None = None) -> "object":
    """Score a submission whose calc.py is `calc_py` (tests restored, hidden ones added)."""
    files = {**task(runner).files, "calc.py": textwrap.dedent(calc_py)}
    return score_submission(task(runner), files, limits=limits)


@pytest.fixture(autouse=True, scope="module")
def _isolated():
    assert default_sandbox().isolation.filesystem  # auto: never an unisolated run


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_real_fix_passes(runner):
    out = submit(runner, "def add(a, b):\n    return a + b\n")
    assert out.passed and out.n_passed == 2 and out.n_failed == 0, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_exiting_early_scores_0(runner):
    """At import, and from inside the call, with status 0: the tests not yet answered are
    missing. (Old runner: a report written first, then os._exit(0), passed.)"""
    for calc in ("import os\nos._exit(0)\n",
                 "import os\ndef add(a, b):\n    os._exit(0)\n"):
        out = submit(runner, calc)
        assert not out.passed and out.n_passed == 0, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_sys_exit_at_import_and_in_a_call_scores_0(runner):
    for calc in ("import sys\nsys.exit(0)\n",
                 "def add(a, b):\n    raise SystemExit(0)\n"):
        out = submit(runner, calc)
        assert not out.passed and out.n_passed == 0, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_writing_a_report_or_the_channel_scores_0(runner):
    """Every file a verdict could plausibly be read from, fd 3, and the tester's fd 3 through
    /proc: none is the verdict. (Old runner: the report file on its command line, 1.0.)"""
    forged = ('{"test": "test_calc.py::test_add", "status": "passed"}\n'
              '{"test": "test_hidden.py::test_add_more", "status": "passed"}\n{"done": 2}\n')
    calc = f"""
    import glob, os
    FORGED = {forged!r}
    for p in glob.glob('**', recursive=True) + glob.glob('.locojax*/**', recursive=True):
        if os.path.isfile(p) and p != 'calc.py':
            try:
                open(p, 'w').write(FORGED)
            except OSError:
                pass
    for fd_path in ['/proc/self/fd/3', f'/proc/{{os.getppid()}}/fd/3', '/proc/1/fd/3']:
        try:
            with open(fd_path, 'w') as f:
                f.write(FORGED)
            print('WROTE', fd_path)
        except OSError as e:
            print('refused', fd_path, e.errno)
    try:
        os.write(3, FORGED.encode())
        print('WROTE fd 3')
    except OSError as e:
        print('refused fd 3', e.errno)
    def add(a, b):
        return a - b
    """
    out = submit(runner, calc)
    assert not out.passed and "WROTE" not in out.output, out.output
    assert out.output.count("refused") == 4


@pytest.mark.parametrize("runner", RUNNERS)
def test_monkeypatching_the_test_framework_scores_0(runner):
    """The framework the code can reach is in its own process: patching it, or json, or the
    harness's modules, changes nothing the tester does."""
    calc = """
    import builtins, json, sys
    json.dumps = lambda *a, **k: '{"done": 0}'
    builtins.AssertionError = type('AssertionError', (Exception,), {})
    for name, mod in list(sys.modules.items()):
        for attr in ('main', 'report', '_run_minitest', '_run_pytest', 'pytest_runtest_logreport'):
            if hasattr(mod, attr):
                setattr(mod, attr, lambda *a, **k: None)
    try:
        import _pytest.runner, _pytest.reports
        _pytest.reports.TestReport.passed = property(lambda self: True)
        _pytest.reports.TestReport.failed = property(lambda self: False)
        _pytest.runner.call_and_report = lambda *a, **k: None
    except ImportError:
        pass
    def add(a, b):
        return a - b
    """
    out = submit(runner, calc)
    assert not out.passed and out.n_failed >= 1, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_always_equal_objects_score_0(runner):
    """An object whose __eq__ says True to anything would pass `assert add(2, 3) == 5`: the
    tester refuses to compare the code's objects. An int subclass is not an int."""
    for calc in (("class Yes:\n    def __eq__(self, other):\n        return True\n"
                  "def add(a, b):\n    return Yes()\n"),
                 ("class Int(int):\n    def __eq__(self, other):\n        return True\n"
                  "def add(a, b):\n    return Int(0)\n")):
        out = submit(runner, calc)
        assert not out.passed and "does not compare" in out.output, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_editing_the_tests_on_disk_scores_0(runner):
    """At import the code rewrites every test file it can find to pass: the tester runs the
    sources it was given before any code ran. The code special-cases the visible test, so
    only the hidden one, imported after the code ran, can fail it (with the tester reading
    the test files from disk, this forgery passed)."""
    calc = """
    import glob
    for p in glob.glob('**/test*.py', recursive=True):
        open(p, 'w').write('def test_add():\\n    pass\\ndef test_add_more():\\n    pass\\n')
    def add(a, b):
        return 5 if (a, b) == (2, 3) else a - b
    """
    out = submit(runner, calc)
    assert not out.passed and out.n_failed >= 1, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_reading_the_hidden_tests_to_special_case_them_scores_0(runner):
    """The code answers from a table of `add(x, y) == z` it finds in any readable file (and
    in the tester's memory, through /proc: with the tester left dumpable, its heap gave the
    hidden test away): the test sources, hidden and visible, are out of its reach at scoring
    (the model may have seen the visible ones, but not the hidden)."""
    calc = """
    import glob, os, re
    TABLE = {}
    paths = glob.glob('**', recursive=True) + glob.glob('.locojax*/**', recursive=True)
    paths += [f'/proc/{os.getppid()}/{n}' for n in ('cmdline', 'environ')]
    texts = []
    for p in paths:
        try:
            texts.append(open(p, 'rb').read(1 << 20))
        except OSError:
            continue
    try:  # the tester's memory, region by region: its heap holds the test sources
        with open(f'/proc/{os.getppid()}/maps') as f, \\
                open(f'/proc/{os.getppid()}/mem', 'rb') as mem:
            for line in f:
                addr, perms, *rest = line.split()
                lo, hi = (int(x, 16) for x in addr.split('-'))
                anon = len(rest) < 4 or rest[3] == '[heap]'
                if perms[0] == 'r' and anon and hi - lo <= 16 << 20:
                    try:
                        mem.seek(lo)
                        texts.append(mem.read(hi - lo))
                    except (OSError, ValueError, OverflowError):
                        pass
    except OSError as e:
        print('no memory', e.errno)
    for text in texts:
        for x, y, z in re.findall(rb'add\\((\\d+), (\\d+)\\) == (\\d+)', text):
            TABLE[int(x), int(y)] = int(z)
    def add(a, b):
        return TABLE.get((a, b), a - b)
    """
    out = submit(runner, calc)
    assert not out.passed and out.n_passed == 0, out.output
    assert out.missing == ("test_calc.py::test_add", "test_hidden.py::test_add_more")


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_test_function_injected_by_a_star_import_does_not_run(runner):
    """A test file that star-imports after its tests: the code's own `test_add` replaces the
    real one in the module; only functions compiled from the trusted file run."""
    t = SWETask(id="star", description="x", runner=runner, tests=("test_calc.py",),
                files={"calc.py": BUGGY, "test_calc.py": "def test_add():\n    assert add(2, 3)"
                       " == 5\n\n\nfrom calc import *  # noqa\n"})
    calc = "def add(a, b):\n    return a - b\ndef test_add():\n    pass\n"
    out = score_submission(t, {**t.files, "calc.py": calc})
    assert not out.passed and out.missing == ("test_calc.py::test_add",), out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_submodule_of_a_package_is_not_loaded_in_the_tester(runner):
    """A package's submodule found through the proxy package's __path__ would be imported by
    the stdlib's PathFinder, in the tester, next to its channel: this one writes a passing
    verdict there and exits 0. It must run in the server, where fd 3 does not exist."""
    forged = '{"test": "test_calc.py::test_add", "status": "passed"}\n{"done": 1}\n'
    t = SWETask(id="pkg", description="x", runner=runner, tests=("test_calc.py",),
                files={"pkg/__init__.py": "", "pkg/calc.py": BUGGY,
                       "test_calc.py": TESTS.replace("from calc", "from pkg.calc")})
    calc = f"import os\ntry:\n    os.write(3, {forged!r}.encode())\nexcept OSError:\n" \
           f"    print('no fd 3 here')\nos._exit(0)\n"
    out = score_submission(t, {**t.files, "pkg/calc.py": calc})
    assert not out.passed and "no fd 3 here" in out.output, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_module_cannot_make_itself_a_package_in_the_tester(runner):
    """`from calc import add` asks the module for `__path__`; a module-level `__getattr__` that
    answers with the work dir would send the tester's own import system there for `add.py`,
    a file the code has just written, loaded next to the channel. Dunders stay local (with
    them forwarded, this forgery scored 1.0)."""
    forged = ('{"test": "test_calc.py::test_add", "status": "passed"}\n'
              '{"test": "test_hidden.py::test_add_more", "status": "passed"}\n{"done": 2}\n')
    evil = f"import os\nos.write(3, {forged!r}.encode())\nos._exit(0)\n"
    # Not a package when imported (the proxy reads `__path__` then), one when asked later.
    calc = (f"import os\nopen('add.py', 'w').write({evil!r})\nprint('planted', flush=True)\n"
            "ASKED = []\ndef __getattr__(name):\n    if name == '__path__':\n"
            "        ASKED.append(name)\n        if len(ASKED) > 1:\n"
            "            return [os.getcwd()]\n    raise AttributeError(name)\n")
    out = submit(runner, calc)
    assert "planted" in out.output and "SyntaxError" not in out.output, out.output
    assert not out.passed and out.n_passed == 0, out.output


@pytest.mark.parametrize("runner", RUNNERS)
def test_killing_or_stopping_the_tester_scores_0(runner):
    """Killed: no `done`. Stopped: the wall clock (4 s here, 30 s in SWEConfig) ends the run.
    The killed run has 60 s, which it never needs (it ends when the tester dies): with 4 s,
    its pytest case failed once in the nobody phase at load average 20 (output not kept; a
    tester not yet started at the wall clock, which is not what this case checks, is the
    likely cause)."""
    for calc, stopped in (("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", False),
                          ("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n", True)):
        limits = Limits(cpu_seconds=4, wall_seconds=4 if stopped else 60, max_processes=16)
        out = submit(runner, calc, limits)
        assert not out.passed and out.n_passed == 0 and out.timed_out == stopped, out.output


def test_channel_parsing_is_strict():
    """The judge accepts only result lines closed by a `done` that counts them."""
    ok = b'{"test": "a::t", "status": "passed"}\n{"done": 1}\n'
    assert parse_channel(ok) == {"a::t": "passed"}
    for bad in (None, b"", b'{"test": "a::t", "status": "passed"}\n',  # no done: died early
                b'{"test": "a::t", "status": "passed"}\n{"done": 2}\n',  # count mismatch
                b'{"test": "a::t", "status": "ok"}\n{"done": 1}\n', b"garbage\n{\"done\": 0}"):
        assert parse_channel(bad) is None, bad
    assert parse_channel(b'{"test": "a::t", "status": "passed"}\n{"test": "a::t", "status": '
                         b'"failed"}\n{"done": 2}\n') == {"a::t": "failed"}  # worst case wins


# -- what still works through the proxy ----------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
def test_legitimate_code_crosses_the_process_boundary(runner):
    code = {
        "shapes/__init__.py": "from shapes.core import *\nLIMIT = 3\n",
        "shapes/core.py": textwrap.dedent("""
            class TooBig(ValueError):
                pass

            class Stack:
                def __init__(self):
                    self.items = []
                def push(self, x):
                    if len(self.items) >= 3:
                        raise TooBig(f"full at {x}")
                    self.items.append(x)
                def peek(self):
                    return self.items[-1]

            def sort_in_place(xs):
                xs.sort()

            def parse(s):
                return int(s)

            def stats(xs):
                return {"n": len(xs), "pair": (min(xs), max(xs)), "set": set(xs), "b": b"x",
                        "f": float("nan"), "c": 1 + 2j}
            """),
    }
    test = textwrap.dedent("""
        import math

        from shapes import LIMIT, Stack, TooBig, parse, sort_in_place, stats
        from shapes.core import Stack as Stack2


        def test_objects_exceptions_mutation():
            s = Stack()
            for i in range(LIMIT):
                s.push(i * 10)
            assert s.peek() == 20 and s.items == [0, 10, 20] and Stack is Stack2
            try:
                s.push(99)
            except ValueError as e:
                assert isinstance(e, TooBig) and "full at 99" in str(e)
            else:
                raise AssertionError("no TooBig")
            try:
                parse("x")
            except ValueError as e:
                assert "invalid literal" in str(e)
            xs = [3, 1, 2]
            sort_in_place(xs)
            assert xs == [1, 2, 3]
            st = stats([2, 5, 2])
            assert st["n"] == 3 and st["pair"] == (2, 5) and st["set"] == {2, 5}
            assert st["b"] == b"x" and math.isnan(st["f"]) and st["c"] == 1 + 2j
        """)
    out = run_tests(default_sandbox(), {**code, "tests/test_shapes.py": test},
                    ["tests/test_shapes.py"], runner)
    assert out.passed and out.n_passed == 1, out.output


def test_hidden_tests_are_not_in_the_work_dir(tmp_path):
    """The placeholders the code can see are empty; the spec is gone before it runs."""
    files = {"calc.py": "import os\nprint(sorted(os.listdir('.')), sorted(os.listdir('.locojax')),"
                        " repr(open('test_calc.py').read()))\ndef add(a, b):\n    return a + b\n",
             "test_calc.py": TESTS}
    out = run_tests(default_sandbox(), files, ["test_calc.py"], "minitest")
    assert out.passed, out.output
    listed = "['.locojax', 'calc.py', 'test_calc.py'] ['harness.py', 'remote.py', 'treeview.py']"
    assert listed + " ''" in out.output
    assert os.path.basename(__file__) not in out.output
