"""The README's example output is what the demo prints: every example
block that quotes the demo suite (fixtures/demo) appears, line for line and
in order, in the output of a run of that suite."""

import pathlib
import subprocess
import sys

from conftest import requires_torch

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _demo_blocks() -> list[list[str]]:
    """The README's plain (untagged) code blocks that quote the demo."""
    blocks, block, tag = [], None, ""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            if block is None:
                block, tag = [], line[3:].strip()
            else:
                if not tag and any("test_demo_budgets.py" in b for b in block):
                    blocks.append(block)
                block = None
        elif block is not None:
            block.append(line)
    return blocks


@requires_torch
def test_the_readme_shows_what_the_demo_prints(tmp_path):
    blocks = _demo_blocks()
    assert len(blocks) >= 2, "the README quotes the demo's budget regression and its leak"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:randomly",
                           f"--junitxml={tmp_path / 'j.xml'}"], cwd=ROOT / "fixtures" / "demo",
                          capture_output=True, text=True, env={**__import__("os").environ, "MEMLAB_CORE": "bridge"})
    out = proc.stdout.splitlines()
    for block in blocks:
        start = next((i for i, line in enumerate(out) if line == block[0]), None)
        assert start is not None, f"the demo does not print the README's line {block[0]!r}"
        assert out[start:start + len(block)] == block, "\n".join(out[start:start + len(block)])
    import torch

    if not torch.cuda.is_available():   # the committed baseline has every test the CPU runs
        assert "new (not in the baseline)" not in proc.stdout
