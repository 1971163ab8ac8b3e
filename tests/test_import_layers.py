"""Imports run one way: no arrow back up between locojax's layers (issue 39).

Read from the source with `ast`, nothing imported, so it takes well under a second:
- train/ never imports fleet/: the Ray modes (fleet/) are built from train/'s parts, so the
  run config's placement flags live in train/placement_config.py, not in fleet/;
- engine/engine.py and engine/extend.py do not import each other: engine.py imports
  extend.py (`Engine.conversation`), and what both need (`check_prompts`) is in decode.py;
- no module reads a `_private` name of another locojax module, whether imported by name
  (`from m import _f`) or through the module (`m._f`): what another module needs is public,
  with a docstring (rl/split_step.py uses train_step's `prepare`, `apply`, ...);
- no import cycle among locojax's modules, nor among its packages (train/, fleet/, ...).

benchmarks/ is held to the same graph (issue 60): run as `python -m benchmarks.x`, so no
module edits `sys.path`; no cycle among its modules; and no module imports a script (a
module with a `__main__` block) unless that script is a leaf, importing no benchmarks module
itself: what two scripts share lives in a leaf (`engine_work.py`, `real_runs.py`,
`workloads.py`, ...), so a script is read, and changed, without its importers in mind.
locojax never imports benchmarks/.

Imports inside functions count for every rule, the cycle check included. A deferred import
breaks a cycle for Python at import time, not for the reader: the engine <-> extend cycle
ran through one (`Engine.conversation` imported extend.py late), and a train/ module that
imported fleet/ inside a function would still be train/ depending on fleet/. `importlib`
calls with computed names (the CLI's subcommands, the task registry) are not read: their
targets are data, not imports.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


PACKAGES = ("locojax", "benchmarks")


@functools.cache
def modules() -> dict[str, Path]:
    """Every module and package under locojax/ and benchmarks/, by dotted name."""
    out = {}
    for file in sorted(f for p in PACKAGES for f in (ROOT / p).rglob("*.py")):
        parts = file.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def _package(name: str) -> str:
    return name if modules()[name].name == "__init__.py" else name.rpartition(".")[0]


def _target(name: str) -> str | None:
    """The locojax module `name` loads: itself, or its longest prefix that is a module."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def imports(name: str) -> tuple[tuple[str, str | None, int], ...]:
    """(imported module, name taken from it or None, line) of every locojax or benchmarks
    import in module `name`, at any depth (functions included)."""
    out = []
    for node in ast.walk(ast.parse(modules()[name].read_text())):
        if isinstance(node, ast.Import):
            out += [(t, None, node.lineno) for a in node.names if (t := _target(a.name))]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                pkg = _package(name).split(".")
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in modules():  # `from locojax.rl import train_step`: the module
                    out.append((sub, None, node.lineno))
                elif (t := _target(base)) is not None:
                    out.append((t, a.name, node.lineno))
    return tuple(out)


def _where(name: str, line: int) -> str:
    return f"{modules()[name].relative_to(ROOT)}:{line}"


def private_uses(name: str) -> list[str]:
    """`file:line: module._name` for every private name of another locojax module that
    module `name` imports or reads through an imported module."""
    out = [f"{_where(name, line)}: from {t} import {n}" for t, n, line in imports(name)
           if n is not None and n.startswith("_") and t != name]
    tree = ast.parse(modules()[name].read_text())
    aliases = {}  # local name -> locojax module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                PACKAGES):
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                            if f"{node.module}.{a.name}" in modules()})
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names
                            if a.asname and a.name in modules()})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__") and aliases[node.value.id] != name):
            out.append(f"{_where(name, node.lineno)}: {aliases[node.value.id]}.{node.attr}")
    return out


def graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in imports(m) if t != m} for m in modules()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on_stack.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_reader_sees_the_package():
    """Guards the rules below against passing on nothing read."""
    g = graph()
    assert len(g) > 100 and sum(map(len, g.values())) > 300
    assert "locojax.train.build" in g["locojax.train.loop"]
    assert "locojax.rl.train_step" in g["locojax.rl.split_step"]  # `import ... as ts`


def test_train_never_imports_fleet():
    bad = sorted({f"{_where(m, line)}: imports {t}" for m in modules()
                  if m.startswith("locojax.train.") for t, _, line in imports(m)
                  if t == "locojax.fleet" or t.startswith("locojax.fleet.")})
    assert not bad, "train/ is below fleet/:\n" + "\n".join(bad)


def test_engine_and_extend_do_not_import_each_other():
    engine, extend = "locojax.engine.engine", "locojax.engine.extend"
    g = graph()
    assert not (extend in g[engine] and engine in g[extend]), \
        "engine.py and extend.py import each other: one direction only"


def test_no_private_names_across_modules():
    """locojax's; benchmarks/' reads of locojax: tests/test_house_benchmarks.py."""
    bad = [b for m in modules() if m.startswith("locojax") for b in private_uses(m)]
    assert not bad, "private names used from another module (make them public):\n" + \
        "\n".join(bad)


def test_no_import_cycles():
    """In locojax and in benchmarks/ alike."""
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_cycles_among_packages():
    """The same at the level of packages (`locojax.train`, `locojax.fleet`, ...; a top-level
    module such as `locojax.profiler` is its own): a layer may import only layers below it,
    which is what makes train/ -> fleet/ -> train/ a cycle even where no two modules form
    one."""
    def layer(m):
        return ".".join(m.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for m, targets in graph().items():
        packages.setdefault(layer(m), set()).update(
            layer(t) for t in targets if layer(t) != layer(m))
    found = cycles(packages)
    assert not found, "cycles between packages:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_cycles_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def is_script(name: str) -> bool:
    return '__name__ == "__main__"' in modules()[name].read_text()


def script_imports(edges: dict[str, set[str]], scripts: set[str]) -> list[str]:
    """`a -> b` for every import of a script `b` that is not a leaf (imports no module of
    `edges` under benchmarks)."""
    leaf = {m for m in scripts
            if not any(t.startswith("benchmarks") for t in edges.get(m, ()))}
    return sorted(f"{m} -> {t}" for m, targets in edges.items() for t in targets
                  if t in scripts - leaf)


def sys_path_edits(text: str) -> list[int]:
    """Lines of `text` that touch `sys.path` (`sys.path.insert(...)`, `sys.path[0] = ...`)."""
    return sorted({node.lineno for node in ast.walk(ast.parse(text))
                   if isinstance(node, ast.Attribute) and node.attr == "path"
                   and isinstance(node.value, ast.Name) and node.value.id == "sys"})


def test_benchmarks_are_read_too():
    g = graph()
    assert "benchmarks.engine_work" in g["benchmarks.bench_engine"]
    assert "benchmarks.peers.common" in g["benchmarks.peers.trl_worker"]


def test_benchmarks_do_not_edit_sys_path():
    """Every benchmark runs as `python -m benchmarks.x` from the repository root, which puts
    the root on sys.path; a script that edits it imports differently run as a file."""
    bad = [f"{modules()[m].relative_to(ROOT)}:{line}" for m in modules()
           if m.startswith("benchmarks") for line in sys_path_edits(modules()[m].read_text())]
    assert not bad, "sys.path edited (run it as `python -m benchmarks.x`):\n" + "\n".join(bad)


def test_benchmarks_import_no_script_but_a_leaf():
    g = {m: t for m, t in graph().items() if m.startswith("benchmarks")}
    bad = script_imports(g, {m for m in g if is_script(m)})
    assert not bad, "a script imported (move what is shared into a leaf):\n" + "\n".join(bad)


def test_locojax_never_imports_benchmarks():
    bad = sorted(f"{_where(m, line)}: imports {t}" for m in modules() if m.startswith("locojax")
                 for t, _, line in imports(m) if t.startswith("benchmarks"))
    assert not bad, "\n".join(bad)


def test_the_benchmark_rules_catch_planted_violations():
    assert sys_path_edits("import sys\nsys.path.insert(0, '.')\nx = 1\nsys.path[0] = 'a'\n"
                          "import os.path\nos.path.join('a')\n") == [2, 4]
    edges = {"benchmarks.a": {"benchmarks.b", "locojax.x"}, "benchmarks.b": {"benchmarks.h"},
             "benchmarks.c": {"benchmarks.leaf"}, "benchmarks.leaf": {"locojax.y"},
             "benchmarks.h": set()}
    assert script_imports(edges, {"benchmarks.a", "benchmarks.b", "benchmarks.leaf"}) == [
        "benchmarks.a -> benchmarks.b"]
