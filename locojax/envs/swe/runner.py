"""Run a repository's tests in the sandbox and decide, from a report file, whether they passed.

"Passed" means all of: the runner exited 0, it wrote its report (so the interpreter was not
killed or `os._exit`ed by the code under test), there is no failing test in the report, and
every test function that the parent finds by parsing the test files (`ast`, no execution)
appears in the report as passed. The last rule stops a patch from passing by making tests
vanish, e.g. by breaking collection or skipping.

Two runners: "minitest" (the bundled `minitest.py`, ~10x faster to start, plain top-level
`test*` functions only) and "pytest" (full pytest, plugins from the environment not
auto-loaded, JUnit XML report).

References: the SWE-bench harness also decides from the per-test log, not the exit code alone.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import secrets
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from locojax.envs.sandbox import Limits, Sandbox

RUNNERS = ("minitest", "pytest")
_MINITEST = Path(__file__).with_name("minitest.py")
RESERVED_PREFIX = ".locojax"
"""Repository paths may not start with this: the runner's own files use it."""


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
            tree = ast.parse(files[path], filename=path)
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


def _command(runner: str, report: str, paths: Sequence[str]) -> list[str]:
    if runner == "minitest":
        return [sys.executable, f"{RESERVED_PREFIX}_minitest.py", report, *paths]
    return [sys.executable, "-m", "pytest", "-q", "--tb=short", "-p", "no:cacheprovider",
            "--rootdir=.", f"--junitxml={report}", *paths]


_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def _parse_junit(text: str, paths: Sequence[str]) -> dict[str, str]:
    """JUnit testcases -> {"path::[Class::]name": "passed" | "skipped" | "failed"}; the cases of
    a parametrized test fold into one entry, with the worst status."""
    modules = {str(PurePosixPath(p).with_suffix("")).replace("/", "."): p for p in paths}
    results: dict[str, bool] = {}
    for case in ET.fromstring(text).iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "").split("[")[0]
        path, cls = modules.get(classname), ""
        if path is None and "." in classname:
            mod, cls = classname.rsplit(".", 1)
            path = modules.get(mod)
        if path is None:
            key = f"{classname}::{name}"
        else:
            key = f"{path}::{cls}::{name}" if cls else f"{path}::{name}"
        status = ("failed" if case.find("failure") is not None or case.find("error") is not None
                  else "skipped" if case.find("skipped") is not None else "passed")
        if _RANK[status] >= _RANK[results.get(key, "passed")]:
            results[key] = status
    return results


def run_tests(
    sandbox: Sandbox,
    files: Mapping[str, str],
    test_paths: Sequence[str],
    runner: str = "pytest",
    limits: Limits | None = None,
) -> TestOutcome:
    """Write `files` into a fresh sandbox, run `test_paths` with `runner`, judge the report."""
    if runner not in RUNNERS:
        raise ValueError(f"unknown test runner {runner!r}; choose from {RUNNERS}")
    missing_paths = [p for p in test_paths if p not in files]
    if missing_paths:
        raise ValueError(f"test files not in the repository: {missing_paths}")
    report = f"{RESERVED_PREFIX}_report_{secrets.token_hex(4)}." + (
        "json" if runner == "minitest" else "xml")
    work = dict(files)
    if runner == "minitest":
        work[f"{RESERVED_PREFIX}_minitest.py"] = _MINITEST.read_text()
    res = sandbox.run(_command(runner, report, test_paths), files=work, limits=limits,
                      read_back=[report], env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    output = (res.stdout + res.stderr).replace(report, "report")
    if res.timed_out:
        output += f"\n[killed: tests exceeded the {res.killed_reason} limit]"
    elif res.killed_reason:
        output += f"\n[killed: {res.killed_reason}]"
    results: dict[str, str] = {}
    if report in res.files:
        try:
            results = ({str(k): "passed" if v is True else "failed"
                        for k, v in json.loads(res.files[report]).items()}
                       if runner == "minitest" else _parse_junit(res.files[report], test_paths))
        except (ValueError, AttributeError, ET.ParseError):
            results = {}
    want = expected_tests(files, test_paths, runner)
    missing = tuple(sorted(k for k in want if results.get(k) != "passed"))
    n_pass = sum(v == "passed" for v in results.values())
    n_fail = sum(v == "failed" for v in results.values())
    passed = (res.returncode == 0 and not res.timed_out and bool(results) and n_fail == 0
              and not missing)
    return TestOutcome(passed, output, n_pass, n_fail, missing, res.timed_out)
