"""docs/pod_scale.md's tables are the commands' output: each block between
`<!-- locojax predict WHAT: begin -->` and `<!-- locojax predict WHAT: end -->` is rerun
(`locojax predict WHAT`) and must equal it. To refresh the doc after a change to the model:

    .venv/bin/python -m tests.test_pod_scale_doc

The output is deterministic (the DA simulation is seeded; no measurement runs), and its
figures are printed to 2-3 significant digits of sums of a few dozen float64 terms, far
coarser than the rounding differences between CPUs.
"""

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from locojax.commands import predict

DOC = Path(__file__).resolve().parent.parent / "docs" / "pod_scale.md"
BLOCK = re.compile(r"(<!-- locojax predict (\w+): begin -->\n)(.*?)(\n<!-- locojax predict "
                   r"\2: end -->)", re.S)


def output(what: str) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert predict.main([what]) == 0
    return buf.getvalue().rstrip("\n")


def blocks() -> list[tuple[str, str]]:
    return [(m.group(2), m.group(3)) for m in BLOCK.finditer(DOC.read_text())]


def test_the_doc_has_the_blocks():
    assert {w for w, _ in blocks()} >= {"fields", "paper"}


@pytest.mark.parametrize("what", ["fields", "paper"])
def test_a_block_is_the_commands_output(what):
    doc = dict(blocks())[what]
    assert doc == output(what), (f"docs/pod_scale.md's `locojax predict {what}` block differs "
                                 "from the command's output; refresh it: .venv/bin/python -m "
                                 "tests.test_pod_scale_doc")


def refresh() -> None:
    text = DOC.read_text()
    DOC.write_text(BLOCK.sub(lambda m: m.group(1) + output(m.group(2)) + m.group(4), text))


if __name__ == "__main__":
    refresh()
