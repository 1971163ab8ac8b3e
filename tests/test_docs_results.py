"""The manual and the results apart (issue 60 item 3).

`docs/*.md` is the manual: a subject's method and its current figure with the command that
printed it. Dated logs (each run with its day, load and seeds, development checks, the sets
before the current one) live in `docs/results/`, one page per claim, each linked from the
README's "Measured" table and linking back to its manual page. Read from the files:
- no heading of the manual (or the README) carries a date: a dated section is a log;
- the README's "Measured" table links results pages only, and every results page;
- a results page opens with its title and links the manual page it reports for.
"""

from __future__ import annotations

import re

from tests.test_docs_refs import LINK, MANUAL, RESULTS, ROOT

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def headings(text: str) -> list[tuple[int, str]]:
    """(line, heading) of every markdown heading outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append((number, line))
    return out


def dated_headings(text: str) -> list[str]:
    return [f"{n}: {h}" for n, h in headings(text) if DATE.search(h)]


def measured_links(readme: str) -> list[str]:
    """The link targets in the rows of the README's "Measured" table."""
    section = ("\n" + readme).split("\n## Measured\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [m.group(1) for row in rows for m in LINK.finditer(row)]


def test_the_manual_holds_no_dated_section():
    bad = [f"{p.relative_to(ROOT)}:{d}" for p in [ROOT / "README.md", *MANUAL]
           for d in dated_headings(p.read_text())]
    assert not bad, "dated sections in the manual (move them to docs/results/):\n" + \
        "\n".join(bad)


def test_the_readme_measured_table_links_every_results_page():
    links = measured_links((ROOT / "README.md").read_text())
    assert links and all(t.startswith("docs/results/") for t in links), links
    assert sorted(set(links)) == sorted(str(p.relative_to(ROOT)) for p in RESULTS)


def test_each_results_page_names_its_claim_and_links_its_manual_page():
    for page in RESULTS:
        text = page.read_text()
        assert text.startswith("# "), page.name
        opening = text.split("\n## ", 1)[0]
        back = [t for t in (m.group(1) for m in LINK.finditer(opening))
                if t.startswith("../") and t.endswith(".md")]
        assert back and all((page.parent / t).resolve().is_file() for t in back), page.name


def test_the_checks_catch_a_dated_section_and_a_stray_link():
    text = ("# Page\n\n## Method\n\n```\n# 2026-12-01: a comment in code\n```\n"
            "## The run of 2026-12-04 (main at 577a241)\n### Per step\n")
    assert dated_headings(text) == ["8: ## The run of 2026-12-04 (main at 577a241)"]
    readme = ("## Measured\n\n| a | [x](docs/results/x.md) |\n| b | [y](docs/y.md) |\n\n"
              "More: [w](docs/w.md)\n## Next\n[z](docs/results/z.md)\n")
    assert measured_links(readme) == ["docs/results/x.md", "docs/y.md"]
