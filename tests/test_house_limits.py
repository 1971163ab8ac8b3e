"""The house limits on size: no file in locojax/ or benchmarks/ over 450 lines, no function
over 80.

A file is one concept read top to bottom, and a function one idea held in the head at once
(/work/shared/STYLE.md 1; issue 39). Counted from the source: a file's lines as `wc -l` counts
them; a function's from its `def` (decorators included) to its last line, nested functions
counted inside their parent.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    """The library's and the benchmarks' (issue 60: a benchmark is read as the library is)."""
    return sorted(p for top in ("locojax", "benchmarks") for p in (ROOT / top).rglob("*.py"))


def long_functions(text: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function in `text` longer than `limit` lines."""
    out = []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    lines = child.end_lineno - first + 1
                    if lines > limit:
                        out.append((name, lines))
                visit(child, name + ".")

    visit(ast.parse(text), "")
    return out


def test_no_file_over_the_limit():
    over = {str(p.relative_to(ROOT)): n for p in sources()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not over, f"files over {MAX_FILE_LINES} lines: {over}"


def test_no_function_over_the_limit():
    over = {f"{p.relative_to(ROOT)}:{name}": n for p in sources()
            for name, n in long_functions(p.read_text())}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def test_the_function_count_sees_decorators_methods_and_nesting():
    """The counter itself, on a planted source: it must flag what is long, wherever it is."""
    body = "\n".join(["    x = 1"] * 79)
    src = (f"@dec\ndef top():\n{body}\n\n"                      # 1 + 1 + 79 = 81 lines
           f"class C:\n    def short(self):\n        return 1\n\n"
           f"    def long(self):\n" + "\n".join(["        x = 1"] * 80) + "\n\n"
           f"def outer():\n    def inner():\n" + "\n".join(["        x = 1"] * 80) + "\n")
    assert dict(long_functions(src)) == {"top": 81, "C.long": 81, "outer": 82,
                                         "outer.inner": 81}
