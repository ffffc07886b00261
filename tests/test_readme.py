"""The README's example output is what the demo prints: every block of
output in the README that quotes the demo suite (fixtures/demo) appears,
line for line and in order, in a run of that suite with the command the
README shows (tests/test_docs.py checks the manual's pages, and the
README's markers, the same way)."""

import pathlib

import pytest

from conftest import requires_torch
from test_docs import ROOT, blocks, find, normalized, run_scenario

README = ROOT / "README.md"


def _demo_blocks() -> list:
    """The README's blocks of output (text or untagged) that quote the demo."""
    return [b for b in blocks(README)
            if b.language in ("", "text") and any("test_demo_budgets.py" in line for line in b.lines)]


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "the README is the front page: at most 200 lines, the rest in docs/"
    for page in pathlib.Path(ROOT / "docs").glob("*.md"):
        if page.name != "index.md":
            assert f"(docs/{page.name})" in text, f"the README links no docs/{page.name}"


@requires_torch
@pytest.mark.xdist_group("scenario-demo")   # shares the pages' run of the demo (test_docs.run_scenario)
def test_the_readme_shows_what_the_demo_prints(tmp_path):
    quoted = _demo_blocks()
    assert len(quoted) >= 2, "the README quotes the demo's budget failure and its table"
    output, folder = run_scenario("demo", tmp_path)["verbose"]
    out = normalized(output.splitlines(), str(folder))
    for block in quoted:
        assert find(normalized(block.lines), out), f"{block.where()}: not in the demo's output:\n{output}"
    import torch

    if not torch.cuda.is_available():   # the committed baseline has every test the CPU runs
        assert "new (not in the baseline)" not in output
