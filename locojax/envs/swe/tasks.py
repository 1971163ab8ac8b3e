"""SWE tasks: the `SWETask` record, its prompt and oracle, and a loader for a directory of tasks.

A task is a small Python repository (`{path: text}`) with at least one failing test, the
issue text the model reads, which files are the tests (they are restored from the task before
scoring, so editing them cannot earn reward), optional hidden test files that only the final
scoring sees, and optionally the fix (used by the oracle policy and by `validate_task`).

User task directories (one sub-directory per task; the sub-directory name is the task id):

    my_tasks/
      fix-median/
        task.json      {"description": "median() is wrong for even-length lists ...",
                        "tests": ["tests/test_stats.py"],          # paths inside repo/
                        "runner": "pytest",                         # optional: or "minitest"
                        "support": ["checks.py"]}                   # optional, see below
        repo/          the repository the model sees and edits (UTF-8 text files only)
        hidden/        optional: files added at the same relative paths when scoring `submit`;
                       the `test*.py` ones among them are run too
        solution/      optional: fixed versions of files in repo/ (oracle + validation)

The verdict trusts the task's test tree (`SWETask.test_tree`): the test files, every hidden
file, everything under the outermost `test*` directory above a test file, and the files
`support` names (helpers or data files the tests use outside such a directory). It is
restored at scoring and only the tests see it: the code under test cannot read or edit it.

References: SWE-bench task instances (problem statement, FAIL_TO_PASS tests, gold patch);
SWE-Gym / R2E-Gym's executable repositories for RL.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from locojax.envs.base import Example, format_tool_call
from locojax.envs.swe.runner import RESERVED_PREFIX, RUNNERS
from locojax.envs.swe.tools import ToolError, check_path

log = logging.getLogger(__name__)

MAX_REPO_FILES = 200
MAX_FILE_BYTES = 200_000
_TASK_KEYS = {"description", "tests", "runner", "support"}


class TaskError(ValueError):
    """A malformed task; the message names the task and the offending file or field."""


class Edit(NamedTuple):
    """Replace the unique occurrence of `old` in `path` with `new` (what the `replace` tool does)."""

    path: str
    old: str
    new: str


@dataclasses.dataclass(frozen=True)
class SWETask:
    """One bug-fix task."""

    id: str
    """Stable identifier (directory name, or generator split/level/content hash)."""
    description: str
    """The issue text shown to the model."""
    files: Mapping[str, str]
    """The repository as {relative posix path: text}, tests included."""
    tests: tuple[str, ...]
    """Paths in `files` of the test files to run; restored from `files` before scoring."""
    runner: str = "pytest"
    """"pytest" or "minitest" (the bundled plain-assert runner; much faster to start)."""
    hidden: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Extra files added only when scoring `submit`; the `test*.py` ones are run as well."""
    fix: tuple[Edit, ...] = ()
    """A known fix, as edits on `files` (empty when unknown)."""
    support: tuple[str, ...] = ()
    """Other files of `files` the tests trust (helpers, data files) outside a test
    directory: part of `test_tree`, so restored at scoring and never shown to the code."""
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Generator details (kind of bug, level, split) or anything a user adds."""

    def __post_init__(self):
        def bad(msg):
            raise TaskError(f"task {self.id!r}: {msg}")

        if not isinstance(self.description, str) or not self.description.strip():
            bad("description must be a non-empty string")
        if self.runner not in RUNNERS:
            bad(f"runner must be one of {RUNNERS}, got {self.runner!r}")
        for group, paths in (("files", self.files), ("hidden", self.hidden)):
            for p in paths:
                try:
                    norm = check_path(p)
                except ToolError as e:
                    bad(f"{group} path {p!r}: {e}")
                if norm != p or norm.startswith(RESERVED_PREFIX):
                    bad(f"{group} path {p!r} must be normalised and not start with "
                        f"{RESERVED_PREFIX!r}")
                if not isinstance(paths[p], str):
                    bad(f"{group}[{p!r}] must be text, got {type(paths[p]).__name__}")
        if not self.tests:
            bad("needs at least one test file")
        for t in self.tests:
            if t not in self.files:
                bad(f"test file {t!r} is not in the repository")
        for p in self.support:
            if p not in self.files:
                bad(f"support file {p!r} is not in the repository")
        edited = sorted({e.path for e in self.fix} & set(self.test_tree))
        if edited:
            bad(f"the fix edits files the tests trust (test_tree): {edited}")
        clash = sorted(set(self.hidden) & set(self.files))
        if clash:
            bad(f"hidden files must not replace repository files: {clash}")

    @property
    def score_tests(self) -> tuple[str, ...]:
        """The test files run when scoring: the visible ones, then hidden `test*.py` files."""
        hidden = sorted(p for p in self.hidden
                        if PurePosixPath(p).name.startswith("test") and p.endswith(".py"))
        return tuple(self.tests) + tuple(hidden)

    @property
    def test_dirs(self) -> tuple[str, ...]:
        """The test directories, as prefixes ending in "/": for each test file, the
        outermost directory named `test*` above it (`tests/`, `pkg/tests/`), if any."""
        roots = set()
        for t in self.score_tests:
            parts = PurePosixPath(t).parts[:-1]
            top = next((i for i, d in enumerate(parts) if d.startswith("test")), None)
            if top is not None:
                roots.add("/".join(parts[:top + 1]) + "/")
        return tuple(sorted(roots))

    @property
    def test_tree(self) -> tuple[str, ...]:
        """The files the verdict trusts: restored from the task when scoring, shown to the
        tests only (never to the code under test). The test files, every hidden file, and
        every file under `test_dirs`, so helpers (`checks.py`, `__init__.py`) and data files
        (`cases.json`) beside the tests are trusted too. A test file outside any test
        directory brings only itself: its neighbours are the code under test."""
        under = {p for p in (*self.files, *self.hidden) if p.startswith(self.test_dirs)}
        return tuple(sorted({*self.score_tests, *self.hidden, *self.support, *under}))

    def fixed_files(self) -> dict[str, str]:
        """`files` with `fix` applied; raises TaskError if an edit does not apply exactly once."""
        out = dict(self.files)
        for e in self.fix:
            n = out.get(e.path, "").count(e.old) if e.old else 0
            if n != 1:
                raise TaskError(f"task {self.id!r}: fix for {e.path!r} must match exactly once, "
                                f"matches {n} times")
            out[e.path] = out[e.path].replace(e.old, e.new, 1)
        return out


TOOL_HELP = """\
Tools (call exactly one per turn, written as <tool>name arguments</tool>):
  <tool>view</tool>             list the files
  <tool>view PATH</tool>        show a file
  <tool>replace PATH
<old>
exact text to replace (must occur once)
</old>
<new>
replacement text
</new></tool>                   edit a file
  <tool>run_tests</tool>        run the tests
  <tool>submit</tool>           finish; you succeed if all tests pass"""


def render_prompt(task: SWETask) -> str:
    files = "\n".join(f"  {p}" for p in sorted(task.files))
    return (f"Fix the bug in this Python repository.\n\nIssue: {task.description.strip()}\n\n"
            f"Files:\n{files}\n\n{TOOL_HELP}\n")


def replace_action(edit: Edit) -> str:
    """The model text for one `replace` call."""
    return format_tool_call("replace", f"{edit.path}\n<old>\n{edit.old}\n</old>\n<new>\n"
                                       f"{edit.new}\n</new>")


def oracle_actions(task: SWETask, run_tests: bool = True) -> list[str]:
    """Model turns that solve the task: view each edited file, edit, (run tests,) submit."""
    if not task.fix:
        raise TaskError(f"task {task.id!r} has no known fix")
    actions = [format_tool_call("view", p) for p in dict.fromkeys(e.path for e in task.fix)]
    actions += [replace_action(e) for e in task.fix]
    return actions + [format_tool_call("run_tests")] * run_tests + [format_tool_call("submit")]


def to_example(task: SWETask) -> Example:
    """The protocol's `Example`: the prompt to show, the gold fix as `answer`."""
    answer = "\n".join(f"{e.path}: {e.old!r} -> {e.new!r}" for e in task.fix)
    return Example(id=task.id, prompt=render_prompt(task), answer=answer,
                   meta={"swe_task": task, **dict(task.meta)})


# ---------------------------------------------------------------------------------------------
# Loading user tasks.


def _read_tree(root: Path, where: str) -> dict[str, str]:
    if not root.is_dir():
        raise TaskError(f"{where}: {root} is not a directory")
    out: dict[str, str] = {}
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root).as_posix()
        if f.is_symlink():
            raise TaskError(f"{where}: {f}: symlinks are not allowed")
        if f.is_dir() or "__pycache__" in f.parts or f.suffix == ".pyc":
            continue
        if len(out) >= MAX_REPO_FILES:
            raise TaskError(f"{where}: more than {MAX_REPO_FILES} files under {root}")
        data = f.read_bytes()
        if len(data) > MAX_FILE_BYTES:
            raise TaskError(f"{where}: {f} is larger than {MAX_FILE_BYTES} bytes")
        try:
            out[rel] = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TaskError(f"{where}: {f} is not UTF-8 text ({e.reason} at byte {e.start})")
    return out


def load_task(task_dir: str | Path) -> SWETask:
    """Load and validate one task directory (see the module docstring for the layout)."""
    d = Path(task_dir)
    spec_path = d / "task.json"
    if not spec_path.is_file():
        raise TaskError(f"{d}: missing task.json")
    try:
        spec = json.loads(spec_path.read_text())
    except json.JSONDecodeError as e:
        raise TaskError(f"{spec_path}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(spec, dict):
        raise TaskError(f"{spec_path}: must hold a JSON object")
    unknown = sorted(set(spec) - _TASK_KEYS)
    if unknown:
        raise TaskError(f"{spec_path}: unknown keys {unknown}; allowed: {sorted(_TASK_KEYS)}")
    desc = spec.get("description")
    if not isinstance(desc, str) or not desc.strip():
        raise TaskError(f"{spec_path}: 'description' must be a non-empty string")
    tests = spec.get("tests")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise TaskError(f"{spec_path}: 'tests' must be a non-empty list of paths inside repo/")
    runner = spec.get("runner", "pytest")
    if runner not in RUNNERS:
        raise TaskError(f"{spec_path}: 'runner' must be one of {RUNNERS}, got {runner!r}")
    support = spec.get("support", [])
    if not isinstance(support, list) or not all(isinstance(p, str) for p in support):
        raise TaskError(f"{spec_path}: 'support' must be a list of paths inside repo/")
    files = _read_tree(d / "repo", str(d))
    if not files:
        raise TaskError(f"{d}: repo/ is empty")
    for t in tests:
        if t not in files:
            raise TaskError(f"{spec_path}: test file {t!r} not found in {d / 'repo'}")
    hidden = _read_tree(d / "hidden", str(d)) if (d / "hidden").exists() else {}
    fix: tuple[Edit, ...] = ()
    if (d / "solution").exists():
        solution = _read_tree(d / "solution", str(d))
        extra = sorted(set(solution) - set(files))
        if extra:
            raise TaskError(f"{d / 'solution'}: files not in repo/: {extra}")
        fix = tuple(Edit(p, files[p], text) for p, text in solution.items()
                    if text != files[p] and files[p])
    try:
        return SWETask(id=d.name, description=desc, files=files, tests=tuple(tests),
                       runner=runner, hidden=hidden, fix=fix, support=tuple(support),
                       meta={"source": str(d)})
    except TaskError as e:
        raise TaskError(f"{d}: {e}") from None


def load_tasks(root: str | Path, skip_invalid: bool = False) -> list[SWETask]:
    """Every task directory under `root`, sorted by name. A bad task raises a `TaskError`
    naming it, unless `skip_invalid`, which logs it, skips it and counts the skips."""
    root = Path(root)
    if not root.is_dir():
        raise TaskError(f"task directory does not exist: {root}")
    tasks, skipped = [], 0
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            tasks.append(load_task(d))
        except TaskError as e:
            if not skip_invalid:
                raise
            skipped += 1
            log.warning("skipping invalid SWE task: %s", e)
    if skipped:
        log.warning("skipped %d invalid SWE task(s) under %s", skipped, root)
    if not tasks:
        raise TaskError(f"no valid tasks under {root} (each task is a sub-directory with "
                        f"task.json and repo/)")
    return tasks


def validate_task(task: SWETask, sandbox=None, limits=None) -> list[str]:
    """Run the task's tests in the sandbox: they must fail as given and, when a fix is known,
    pass with it. Returns the problems found (empty when the task is usable)."""
    from locojax.envs.sandbox import default_sandbox
    from locojax.envs.swe.runner import run_tests

    sandbox = sandbox or default_sandbox()
    problems = []
    before = run_tests(sandbox, {**task.files, **task.hidden}, task.score_tests, task.runner,
                       limits, trusted=task.test_tree)
    if before.passed:
        problems.append(f"task {task.id!r}: tests already pass before any fix")
    if task.fix:
        after = run_tests(sandbox, {**task.fixed_files(), **task.hidden}, task.score_tests,
                          task.runner, limits, trusted=task.test_tree)
        if not after.passed:
            problems.append(f"task {task.id!r}: tests fail with the known fix:\n"
                            f"{after.output[-1500:]}")
    return problems
