"""Run a repository's tests in the sandbox and decide, from the harness's channel, whether
they passed.

The tests run in `harness.py`'s tester process and the code under test in its server
process; the tester sends one line per test result on the sandbox's private channel (fd 3),
which the code under test does not hold. The trusted test tree (`run_tests(trusted=...)`:
test files, helpers, data and hidden files) reaches the tester in a spec file it deletes
before any repository code runs; its files in the work dir are empty placeholders, so hidden
files stay hidden and rewriting one changes nothing. Nothing in the work dir is read back.

"Passed" means all of: the harness exited 0 within the limits, its channel ends with a
`done` line counting every result line before it, no result failed, and every test function
that the parent finds by parsing the test files (`ast`, no execution) was reported passed.
The last rule stops a patch from passing by making tests vanish, e.g. by breaking
collection, skipping or exiting early. See docs/security.md for each forgery route.

Two runners: "minitest" (plain top-level `test*` functions, ~10x faster to start) and
"pytest" (full pytest in the tester: plugins from the environment not auto-loaded, no
conftest.py, no ini file from the repository).

References: the SWE-bench harness also decides from per-test results, not the exit code.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import subprocess
import sys
import sysconfig
from collections.abc import Container, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath

from locojax.envs.pyast import parse
from locojax.envs.sandbox import Limits, Sandbox

RUNNERS = ("minitest", "pytest")
RESERVED_PREFIX = ".locojax"
"""Repository paths may not start with this: the harness's own files use it."""
_HARNESS = {f"{RESERVED_PREFIX}/{n}": (Path(__file__).parent / n).read_text()
            for n in ("harness.py", "remote.py", "treeview.py")}
_SPEC = f"{RESERVED_PREFIX}/spec.json"


@dataclasses.dataclass(frozen=True)
class TestOutcome:
    """The result of one test run."""

    __test__ = False  # not a pytest test class, despite the name

    passed: bool
    """True when every expected test passed (see the module docstring)."""
    output: str
    """The runner's stdout + stderr, truncated by the sandbox limits."""
    n_passed: int
    """Tests reported as passed."""
    n_failed: int
    """Tests reported as failed or errored (skipped ones count in neither)."""
    missing: tuple[str, ...]
    """Expected tests that did not report a pass (absent, skipped or failed)."""
    timed_out: bool
    """The run hit the wall-clock limit."""


def expected_tests(files: Mapping[str, str], paths: Sequence[str], runner: str) -> set[str]:
    """Test ids `path::name` (pytest also `path::Class::name`) found by parsing `paths`."""
    out: set[str] = set()
    for path in paths:
        try:
            tree = parse(files[path], filename=path)  # env pool threads parse at once
        except SyntaxError:
            out.add(f"{path}::<import>")  # cannot pass: the runner will fail to import it
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.name.startswith("test"):
                out.add(f"{path}::{node.name}")
            elif runner == "pytest" and isinstance(node, ast.ClassDef) and \
                    node.name.startswith("Test"):
                out.update(f"{path}::{node.name}::{m.name}" for m in node.body
                           if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and m.name.startswith("test"))
    return out


_RANK = {"passed": 0, "skipped": 1, "failed": 2}


@functools.cache
def _site_dirs(python: str) -> list[str]:
    """The interpreter's site-packages: the harness runs with -S (no .pth files, which cost
    ~0.1 s a start) and puts these on its path instead."""
    code = "import json, sysconfig; print(json.dumps([sysconfig.get_paths()[k] for k in " \
           "('purelib', 'platlib')]))"
    paths = ([sysconfig.get_paths()[k] for k in ("purelib", "platlib")] if python == sys.executable
             else json.loads(subprocess.run([python, "-I", "-c", code], capture_output=True,
                                            check=True, text=True, timeout=60).stdout))
    return list(dict.fromkeys(paths))


def parse_channel(data: bytes | None) -> dict[str, str] | None:
    """The harness's results, {"path::[Class::]name": worst status}, or None unless the
    channel holds only result lines and then a `done` line that counts them."""
    if data is None:
        return None
    results: dict[str, str] = {}
    lines = data.decode("utf-8", "replace").splitlines()
    try:
        msgs = [json.loads(line) for line in lines]
    except ValueError:
        return None
    if not msgs or not isinstance(msgs[-1], dict) or msgs[-1].get("done") != len(msgs) - 1:
        return None
    for m in msgs[:-1]:
        if not (isinstance(m, dict) and isinstance(m.get("test"), str)
                and m.get("status") in _RANK):
            return None
        key, status = m["test"], m["status"]  # parametrized cases fold into their worst
        if _RANK[status] >= _RANK[results.get(key, "passed")]:
            results[key] = status
    return results


def owned_dirs(files: Iterable[str], tree: Container[str]) -> list[str]:
    """The directories above a trusted file that hold only trusted files (`tests/` of a
    task whose test tree is all of it): the tester lists them exactly as the task has them,
    so the code can neither hide a trusted file from a listing nor add one."""
    files = list(files)
    above = {str(p) for t in files if t in tree for p in PurePosixPath(t).parents} - {"."}
    return sorted(d for d in above if all(f in tree for f in files if f.startswith(d + "/")))


def run_tests(
    sandbox: Sandbox,
    files: Mapping[str, str],
    test_paths: Sequence[str],
    runner: str = "pytest",
    limits: Limits | None = None,
    trusted: Sequence[str] = (),
) -> TestOutcome:
    """Write `files` into a fresh sandbox, run `test_paths` with `runner`, judge the report.

    `trusted` (with `test_paths`): the files only the tests may see (`SWETask.test_tree`).
    They reach the tester in its spec, which it deletes before any code runs; the work dir
    holds empty placeholders. The tester imports the `.py` ones from that copy and serves
    the others to `open` from it, so the code can neither read nor replace them."""
    if runner not in RUNNERS:
        raise ValueError(f"unknown test runner {runner!r}; choose from {RUNNERS}")
    missing_paths = [p for p in (*test_paths, *trusted) if p not in files]
    if missing_paths:
        raise ValueError(f"test files not in the repository: {missing_paths}")
    tree = dict.fromkeys((*test_paths, *trusted))
    work = {p: ("" if p in tree else text) for p, text in files.items()}
    work.update(_HARNESS)
    work[_SPEC] = json.dumps({"runner": runner, "tests": list(test_paths),
                              "trusted": {p: files[p] for p in tree},
                              "owned": owned_dirs(files, tree),
                              "site": _site_dirs(sandbox.python)})
    res = sandbox.run([sandbox.python, "-I", "-S", "-B", "-u", f"{RESERVED_PREFIX}/harness.py",
                       _SPEC], files=work, limits=limits, channel=True)
    output = res.stdout + res.stderr
    if res.timed_out:
        output += f"\n[killed: tests exceeded the {res.killed_reason} limit]"
    elif res.killed_reason:
        output += f"\n[killed: {res.killed_reason}]"
    results = parse_channel(res.channel) or {}
    want = expected_tests(files, test_paths, runner)
    missing = tuple(sorted(k for k in want if results.get(k) != "passed"))
    n_pass = sum(v == "passed" for v in results.values())
    n_fail = sum(v == "failed" for v in results.values())
    passed = (res.returncode == 0 and not res.timed_out and bool(results) and n_fail == 0
              and not missing)
    return TestOutcome(passed, output, n_pass, n_fail, missing, res.timed_out)
