"""docs/pod_scale.md's tables are the commands' output: each block between
`<!-- COMMAND: begin -->` and `<!-- COMMAND: end -->` is rerun and must equal it, for the
two commands of `COMMANDS` (`locojax predict fields`, and the paper's studies,
`python -m benchmarks.paper_report`, run as a user starts it). To refresh the doc after a
change to the model:

    .venv/bin/python -m tests.test_pod_scale_doc

The output is deterministic (the DA simulation is seeded; no measurement runs), and its
figures are printed to 2-3 significant digits of sums of a few dozen float64 terms, far
coarser than the rounding differences between CPUs.
"""

import io
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from locojax.commands import predict

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "pod_scale.md"
FIELDS, PAPER = "locojax predict fields", "python -m benchmarks.paper_report"
COMMANDS = (FIELDS, PAPER)
BLOCK = re.compile(r"(<!-- (" + "|".join(map(re.escape, COMMANDS)) + r"): begin -->\n)(.*?)"
                   r"(\n<!-- \2: end -->)", re.S)


def output(command: str) -> str:
    if command == FIELDS:
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert predict.main(["fields"]) == 0
        return buf.getvalue().rstrip("\n")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.paper_report"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.rstrip("\n")


def blocks() -> list[tuple[str, str]]:
    return [(m.group(2), m.group(3)) for m in BLOCK.finditer(DOC.read_text())]


def test_the_doc_has_the_blocks():
    assert {w for w, _ in blocks()} >= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_block_is_the_commands_output(command):
    doc = dict(blocks())[command]
    assert doc == output(command), (f"docs/pod_scale.md's `{command}` block differs from the "
                                    "command's output; refresh it: .venv/bin/python -m "
                                    "tests.test_pod_scale_doc")


def refresh() -> None:
    text = DOC.read_text()
    DOC.write_text(BLOCK.sub(lambda m: m.group(1) + output(m.group(2)) + m.group(4), text))


if __name__ == "__main__":
    refresh()
