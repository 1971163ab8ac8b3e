"""Each package's docstring names every module beside it: the map a newcomer reads first.

Issue 60: the maps had drifted (`predict/__init__.py` named 13 of its 39 modules,
`fleet/__init__.py` left out the controller, five packages had none). Every `__init__.py`
under locojax/ and benchmarks/ is read with `ast`: each `.py` file beside it and each
subpackage must appear in its docstring as a whole name (`decode` or `decode.py`; a prose
word of the same spelling counts too, which a map in a list makes rare).
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def packages() -> list[Path]:
    return sorted(p for top in ("locojax", "benchmarks") for p in (ROOT / top).rglob(
        "__init__.py"))


def unnamed(init: Path, doc: str | None = None) -> list[str]:
    """The modules and subpackages beside `init` that its docstring (or `doc`) leaves out."""
    doc = ast.get_docstring(ast.parse(init.read_text())) if doc is None else doc
    here = init.parent
    names = {p.stem for p in here.glob("*.py") if p.name != "__init__.py"}
    names |= {p.name for p in here.iterdir() if (p / "__init__.py").is_file()}
    return sorted(n for n in names if not re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)",
                                                   doc or ""))


def test_every_package_docstring_names_its_modules():
    assert len(packages()) > 10
    missing = {str(p.relative_to(ROOT)): m for p in packages() if (m := unnamed(p))}
    assert not missing, f"package docstrings leave out modules beside them: {missing}"


def test_the_check_catches_a_module_left_out():
    init = ROOT / "locojax" / "engine" / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert unnamed(init) == []
    assert unnamed(init, doc.replace("refill.py", "")) == ["refill"]
    assert unnamed(init, "") == ["decode", "engine", "extend", "generation", "refill",
                                  "sampling", "waves"]
    # `decoder` or `sampling_x` in prose does not name `decode` or `sampling`.
    assert "decode" in unnamed(init, "decoder, sampling_x, engine.py extend refill")
