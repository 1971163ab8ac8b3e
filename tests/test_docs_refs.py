"""The README, docs/*.md and docs/results/*.md cite only what exists: paths, names, links.

Three kinds of citation are checked, each read so that prose does not trip it:
- a repository path, `locojax/...`, `benchmarks/...`, `tests/...` or `docs/...`, starting a
  word (so `~/.cache/locojax/peers` and a URL's `.../tpu/docs/v5e` are not paths): it must
  exist as a file or directory, or as a glob (`benchmarks/peers/*_worker.py`) match one;
- a dotted name `locojax.a.b` (a logger name, or a module named in prose): its longest
  prefix that is a module or package under locojax/ must be followed by at most one more
  name, defined at the top of that module (`locojax.envs.pyast.parse`). A file name like
  `locojax.json` (the last part a file extension) is not a dotted name;
- a relative markdown link `[text](target)`: the target exists beside the document, inside
  the repository (a clone has nothing outside it).

Nothing is imported or run: it reads files, so it takes well under a second.
"""

from __future__ import annotations

import ast
import functools
import glob
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANUAL = sorted((ROOT / "docs").glob("*.md"))
"""The manual: each page the method and the current figure with its command."""
RESULTS = sorted((ROOT / "docs" / "results").glob("*.md"))
"""The results: one page per claim, its runs dated (`tests/test_docs_results.py`)."""
DOCS = [ROOT / "README.md", *MANUAL, *RESULTS]

PATH = re.compile(r"(?<![\w./~-])((?:locojax|benchmarks|tests|docs)/[\w./*{},-]*[\w*}])")
"""A repository path: a top-level directory at the start of a word, then path characters,
not ending in punctuation (`tests/test_eval.py,` is `tests/test_eval.py`)."""
DOTTED = re.compile(r"(?<![\w./-])locojax((?:\.[A-Za-z_]\w*)+)(?![\w/-])")
FILE_EXTENSIONS = {"json", "jsonl", "py", "md", "txt", "toml", "yaml", "npz", "png", "sh"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _expand(path: str) -> list[str]:
    """`a/{b,c}/d` as `a/b/d` and `a/c/d` (shell brace expansion, one level at a time)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [p for alt in m.group(1).split(",")
            for p in _expand(path[:m.start()] + alt + path[m.end():])]


def path_exists(path: str) -> bool:
    return all(glob.glob(str(ROOT / p)) if "*" in p else (ROOT / p).exists()
               for p in _expand(path))


@functools.cache
def _modules() -> dict[str, Path]:
    """Every importable module and package under locojax/, by dotted name."""
    out = {}
    for file in (ROOT / "locojax").rglob("*.py"):
        parts = file.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


@functools.cache
def _top_names(module: str) -> frozenset[str]:
    """Names a module defines or imports at its top level (functions, classes, constants)."""
    tree = ast.parse(_modules()[module].read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def dotted_name_resolves(name: str) -> bool:
    """`locojax.x.y` is a module or package, or one name defined at the top of one."""
    modules, parts = _modules(), name.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in modules:
            rest = parts[cut:]
            return not rest or (len(rest) == 1 and rest[0] in _top_names(prefix))
    return False


def link_exists(doc: Path, target: str) -> bool:
    """A relative link's target exists beside `doc`, inside the repository."""
    where = (doc.parent / target).resolve()
    return where.exists() and where.is_relative_to(ROOT)


def references(text: str):
    """(kind, reference, line number) of every citation in a markdown text."""
    for number, line in enumerate(text.splitlines(), 1):
        for m in PATH.finditer(line):
            yield "path", m.group(1), number
        for m in DOTTED.finditer(line):
            if m.group(1).rsplit(".", 1)[-1] not in FILE_EXTENSIONS:
                yield "name", "locojax" + m.group(1), number
        for m in LINK.finditer(line):
            target = m.group(1)
            if not re.match(r"[a-z]+:|#", target):
                yield "link", target.split("#")[0], number


def broken(doc: Path, text: str | None = None) -> list[str]:
    """`doc:line: kind ref` for every citation in `doc` (or in `text`, as if it were
    `doc`) that does not resolve."""
    text = doc.read_text() if text is None else text
    out = []
    for kind, ref, number in references(text):
        ok = {"path": path_exists, "name": dotted_name_resolves,
              "link": lambda r: link_exists(doc, r)}[kind](ref)
        if not ok:
            out.append(f"{doc.relative_to(ROOT)}:{number}: {kind} {ref}")
    return out


def test_docs_cite_only_what_exists():
    assert DOCS[0].name == "README.md" and len(MANUAL) > 5 and len(RESULTS) > 5
    missing = [b for doc in DOCS for b in broken(doc)]
    assert not missing, "stale references:\n" + "\n".join(missing)


def test_the_reader_catches_stale_citations_and_not_prose():
    """The reader itself: what it must flag, and prose and outside paths it must not."""
    doc = ROOT / "docs" / "example.md"
    stale = ("see `locojax/train/nope.py`, benchmarks/bench_nope.py and tests/test_nope.py,\n"
             "docs/nope.md, INFO locojax.train.modes.workers: ready, `locojax.rl.nope_fn`\n"
             "and [a link](nope.png), [outside the repository](../..)")
    assert [b.split(": ", 1)[1] for b in broken(doc, stale)] == [
        "path locojax/train/nope.py", "path benchmarks/bench_nope.py",
        "path tests/test_nope.py", "path docs/nope.md", "name locojax.train.modes.workers",
        "name locojax.rl.nope_fn", "link nope.png", "link ../.."]
    prose = ("`locojax/train/loop.py`, tests/test_eval.py, (docs/demo.md), benchmarks/peers/"
             "*_worker.py, locojax/assets/tiny-arith, ~/.cache/locojax/peers,\n"
             "https://cloud.google.com/tpu/docs/v5e. INFO locojax.fleet.dispatcher: begin,\n"
             "`locojax.json`, locojax.envs.pyast.parse, locojax.train.config.RunConfig, the\n"
             "locojax train command, runs/demo/{metrics.jsonl, tb/}, [security](security.md),\n"
             "[section](#validation), [web](https://example.com/x.md)")
    assert broken(doc, prose) == []
