"""benchmarks/ uses the library as a user would: through public names only.

A benchmark that reads a `_private` name of a locojax module (`from locojax.engine.extend
import _bucket`, `decode._loop`) breaks when the library changes inside, which is what a
private name says it may do. Checked from the source, as tests/test_import_layers.py checks
locojax itself.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def private_reads(source: str) -> list[str]:
    """`line: module._name` for every private locojax name `source` imports or reads through
    an imported locojax module."""
    tree = ast.parse(source)
    out, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("locojax"):
            for a in node.names:
                if a.name.startswith("_"):
                    out.append(f"{node.lineno}: {node.module}.{a.name}")
                else:  # maybe a module (`from locojax.engine import decode`)
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names
                           if a.name.startswith("locojax"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            out.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return out


def test_benchmarks_read_no_private_library_name():
    bad = [f"{p.relative_to(ROOT)}:{b}" for p in sorted((ROOT / "benchmarks").rglob("*.py"))
           for b in private_reads(p.read_text())]
    assert not bad, "private locojax names read by benchmarks (make them public):\n" + \
        "\n".join(bad)


def test_the_reader_sees_both_ways_of_reading_a_private_name():
    planted = ("from locojax.engine.extend import Conversation, _bucket\n"
               "from locojax.engine import decode\nimport locojax.model.params as p\n"
               "decode._loop(1)\np._init()\ndecode.public()\nx._private  # not a module\n")
    assert private_reads(planted) == ["1: locojax.engine.extend._bucket", "4: decode._loop",
                                      "5: p._init"]
