"""The manual's example output is what the code prints.

Every fenced block of output in the manual (docs/*.md) and the README
(language ``text``, ``markdown``, ``json`` or none) carries a marker on the
line before it, an HTML comment that Sphinx and GitHub do not show:

- ``<!-- checked: SCENARIO/STEP -->``: the block appears, line for line and
  in order, in what that step printed (``SCENARIO/STEP file NAME``: in the
  file NAME it wrote).  A line ``...`` in the block stands for any lines.
- ``<!-- checked: source PATH -->``: the block is a part of the file PATH of
  this repository, line for line (an example's source, shown whole or cut).
- ``<!-- unchecked: WHY -->``: output this CPU machine cannot produce (an
  H100's out-of-memory), said so on the page; kept few.

A scenario is one of docs/examples/ (or the demo suite, fixtures/demo),
copied into a temporary folder, and its steps are the commands the page
shows, run in order there: ``pytest ...`` with this Python (other plugins of
this environment off: pytest-randomly, pytest-asyncio), ``python ...``, and
``NAME=VALUE`` before a command for its environment.  CUDA is hidden from
every step, so that the output is the CPU machine's everywhere.  Before
comparing, both sides have their tabs expanded and trailing blanks cut, the
scenario's folder reads ``/path/to/project``, a process id reads ``pid N``,
and the machine's free memory and capacity (in an out-of-memory's
section) read ``free SIZE``, ``capacity SIZE``.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import sys
from dataclasses import dataclass

import pytest

import forked_pytest
from conftest import requires_torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"

# scenario -> (the folder copied, [(step, command), ...])
SCENARIOS = {
    "demo": (ROOT / "fixtures" / "demo", [
        ("verbose", "pytest -v --memlab-report"),
        ("reports", "pytest -q --memlab-report=term,json:report.json,html:report.html"),
    ]),
    "phases": (EXAMPLES / "phases", [("run", "pytest")]),
    "baselines": (EXAMPLES / "baselines", [
        ("write", "pytest --memlab-baseline=memlab-baseline.json --memlab-update-baseline"),
        ("regressed", "GROW=1 pytest --memlab-baseline=memlab-baseline.json --memlab-json=new.json"),
        ("compare", "python -m pytest_memlab compare memlab-baseline.json new.json"),
        ("markdown", "python -m pytest_memlab compare memlab-baseline.json new.json --format markdown"),
    ]),
    "dashboards": (EXAMPLES / "dashboards", [("run", "pytest --memlab-report=bmf:bmf.json,gab:gab.json")]),
    "summary": (EXAMPLES / "summary", [
        ("write", "pytest --memlab-baseline=memlab-baseline.json --memlab-update-baseline --memlab-summary=off"),
        ("regressed", "GROW=1 pytest --memlab-baseline=memlab-baseline.json --memlab-summary=summary.md"),
    ]),
    "leaks": (EXAMPLES / "leaks", [
        ("warn", "pytest --memlab test_leaks.py"),
        ("repeat", "pytest --memlab-leak-repeat=3 test_repeat.py"),
    ]),
    "ranks": (EXAMPLES / "ranks", [
        ("spawn", "pytest test_spawn.py --memlab-report"),
        ("write", "pytest test_ranks.py --memlab-baseline=memlab-baseline.json --memlab-update-baseline "
                  "--memlab-report"),
        ("changed", "WIDE=2 pytest test_ranks.py --memlab-baseline=memlab-baseline.json"),
    ]),
    "oom": (EXAMPLES / "oom", [("run", "pytest --memlab")]),
    "commands": (EXAMPLES / "dashboards", [
        ("compare-help", "python -m pytest_memlab compare --help"),
        ("merge-help", "python -m pytest_memlab merge --help"),
    ]),
    "lab": (EXAMPLES / "lab", [
        ("profile", "python line_profile.py"),
        ("reporter", "python reporter.py"),
    ]),
}

# Blocks of these languages are output (a directive, ```{toctree}, is not;
# nor is a diagram, ```none).
# The torch the pages' outputs come from: the one ci/install pins for the CPU
# lanes.  Another torch (the GPU machine's) may allocate a few bytes
# otherwise, and its version is in memlab's head line: its runs skip.
DOCS_TORCH = "2.13."

OUTPUT_LANGUAGES = {"", "text", "markdown", "json", "console"}
MARKER = re.compile(r"^<!--\s*(checked|unchecked):\s*(.*?)\s*-->$")
PLACE = "/path/to/project"


@dataclass
class Block:
    page: pathlib.Path
    line: int                   # of the opening fence, 1-based
    language: str
    lines: list[str]
    marker: tuple[str, str] | None   # ("checked", what) or ("unchecked", why)

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[pathlib.Path]:
    return sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]


def blocks(page: pathlib.Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the marker of each
    (the comment on the nearest non-blank line before its fence)."""
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(`{3,}|~{3,})\s*([^\s`]*)", lines[i])
        if fence is None:
            i += 1
            continue
        ticks, language = fence.group(1), fence.group(2)
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = MARKER.match(lines[j].strip()) if j >= 0 else None
        end = i + 1
        while end < len(lines) and not (lines[end].startswith(ticks[0] * len(ticks))
                                        and not lines[end].strip(ticks[0]).strip()):
            end += 1
        found.append(Block(page, i + 1, language, lines[i + 1:end],
                           (marker.group(1), marker.group(2)) if marker else None))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]


def normalized(lines, place: str | None = None) -> list[str]:
    out = []
    for line in lines:
        if place:
            line = line.replace(place, PLACE)
        line = re.sub(r"\bpid \d+", "pid N", line.expandtabs())
        line = re.sub(r"\b(free|capacity) \d+(\.\d+)? [KMGTP]?i?B\b", r"\1 SIZE", line)
        out.append(line.rstrip())
    return out


def find(block: list[str], text: list[str]) -> bool:
    """Whether block's lines appear in text, contiguous and in order, where
    a block line '...' stands for any lines (none included)."""
    parts, part = [], []
    for line in block:
        if line.strip() == "...":
            parts.append(part)
            part = []
        else:
            part.append(line)
    parts.append(part)
    parts = [p for p in parts if p]

    def at(k: int, start: int, anchored: bool) -> bool:
        if k == len(parts):
            return True
        n = len(parts[k])
        for s in range(start, len(text) - n + 1):
            if text[s:s + n] == parts[k] and at(k + 1, s + n, False):
                return True
            if anchored:
                return False
        return False

    return at(0, 0, False)


def clean_env(**extra) -> dict:
    """The environment a user's run would have: none of this run's pytest,
    xdist, CI or memlab variables (CI makes pytest print whole messages in
    its short summary), no CUDA, 80 columns."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MEMLAB_", "COV_CORE_", "COVERAGE_", "TORCHELASTIC_"))
           and k not in ("CI", "BUILD_NUMBER", "GITHUB_STEP_SUMMARY", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                         "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COLUMNS", "LINES", "FORCE_COLOR",
                         "PY_COLORS", "NO_COLOR")}
    env.update(MEMLAB_CORE="bridge", CUDA_VISIBLE_DEVICES="", COLUMNS="80", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def argv(command: str) -> tuple[list[str], dict]:
    """A page's command as this Python runs it, and its environment."""
    words, env = shlex.split(command), {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[0] == "pytest":
        words = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:asyncio", *words[1:]]
    elif words[0] == "python":
        words = [sys.executable, *words[1:]]
    return words, env


_RUN: dict[str, dict[str, tuple[str, pathlib.Path]]] = {}   # a scenario run once a process


def run_scenario(name: str, where: pathlib.Path) -> dict[str, tuple[str, pathlib.Path]]:
    """Each step's output (stdout and stderr), after the steps before it.
    Run once a process (the README's test and the pages' share the demo's
    run: both are in xdist group "scenario-demo"); where is the first
    caller's folder."""
    if name in _RUN:
        return _RUN[name]
    import torch

    if not torch.__version__.startswith(DOCS_TORCH):
        pytest.skip(f"the manual's outputs are torch {DOCS_TORCH}x's; this is torch {torch.__version__}")
    source, steps = SCENARIOS[name]
    folder = where / name
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    outputs = {}
    for step, command in steps:
        words, env = argv(command)
        proc = forked_pytest.run_captured(words, folder, clean_env(**env), timeout=600)
        outputs[step] = (proc.stdout + proc.stderr, folder)
    _RUN[name] = outputs
    return outputs


def checked(name: str) -> list[tuple[Block, str, str | None]]:
    """The blocks checked against scenario name: (block, step, file)."""
    out = []
    for block in all_blocks():
        if block.marker and block.marker[0] == "checked" and not block.marker[1].startswith("source "):
            what = block.marker[1].split()
            scenario, _, step = what[0].partition("/")
            if scenario == name:
                out.append((block, step, what[2] if len(what) == 3 and what[1] == "file" else None))
    return out


def test_every_output_block_says_where_it_comes_from():
    """No example output without its marker, and each marker names a step
    or a file that exists: output a page shows is checked, or says why not."""
    problems = []
    for block in all_blocks():
        if block.marker is None:
            if block.language in OUTPUT_LANGUAGES:
                problems.append(f"{block.where()}: a ```{block.language} block without a marker")
            continue
        kind, what = block.marker
        if kind == "unchecked":
            if not what:
                problems.append(f"{block.where()}: unchecked, but it does not say why")
            continue
        if what.startswith("source "):
            if not (ROOT / what.split(None, 1)[1]).is_file():
                problems.append(f"{block.where()}: no file {what.split(None, 1)[1]}")
            continue
        words = what.split()
        scenario, _, step = words[0].partition("/")
        if scenario not in SCENARIOS or step not in dict(SCENARIOS[scenario][1]):
            problems.append(f"{block.where()}: no scenario step {words[0]!r}")
        elif len(words) not in (1, 3) or (len(words) == 3 and words[1] != "file"):
            problems.append(f"{block.where()}: expected 'checked: SCENARIO/STEP [file NAME]', got {what!r}")
    assert not problems, "\n".join(problems)


def test_sources_shown_are_the_files_run():
    for block in all_blocks():
        if block.marker and block.marker[0] == "checked" and block.marker[1].startswith("source "):
            path = ROOT / block.marker[1].split(None, 1)[1]
            text = normalized(path.read_text().splitlines())
            assert find(normalized(block.lines), text), f"{block.where()}: not a part of {path.relative_to(ROOT)}"


def test_every_scenario_is_shown_somewhere():
    """A scenario that no page quotes is dead weight (or a marker is missing)."""
    for name in SCENARIOS:
        assert checked(name), f"no page quotes the scenario {name}"


@requires_torch
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xdist_group("scenario-demo"))
                                  if name == "demo" else name for name in sorted(SCENARIOS)])
def test_the_pages_show_what_the_code_prints(name, tmp_path):
    outputs = run_scenario(name, tmp_path)
    problems = []
    for block, step, file in checked(name):
        output, folder = outputs[step]
        if file is None:
            text = normalized(output.splitlines(), str(folder))
            what = f"the output of {name}/{step} ({SCENARIOS[name][1][[s for s, _ in SCENARIOS[name][1]].index(step)][1]})"
        else:
            written = folder / file
            if not written.is_file():
                problems.append(f"{block.where()}: {name}/{step} wrote no {file}\n{output}")
                continue
            text = normalized(written.read_text().splitlines(), str(folder))
            what = f"{file} as {name}/{step} wrote it"
        if not find(normalized(block.lines), text):
            problems.append(f"{block.where()}: the block is not in {what}:\n" + "\n".join(text))
    assert not problems, "\n\n".join(problems)


def test_the_finder_reads_its_wildcard():
    text = ["a", "b", "c", "d"]
    assert find(["b", "c"], text) and find(["a", "...", "d"], text) and find(["a", "...", "b"], text)
    assert not find(["a", "c"], text) and not find(["d", "...", "a"], text)


class _Recorder:
    """pytest's parser as pytest_memlab.options.add_options sees it."""

    def __init__(self):
        self.options, self.inis = [], []

    def getgroup(self, *args, **kwargs):
        return self

    def addoption(self, *names, **attrs):
        self.options.append(names[0])

    def addini(self, name, *args, **kwargs):
        self.inis.append(name)


def _task_pages() -> str:
    return "\n".join(p.read_text() for p in DOCS.glob("*.md") if p.name != "options.md")


def test_every_option_is_explained_on_a_task_page():
    """The reference lists every option (docs/_ext generates it); a page by
    task must also say what each is for."""
    from pytest_memlab.options import add_options

    recorder = _Recorder()
    add_options(recorder)
    assert len(recorder.options) > 10, "the recorder reads add_options wrongly"
    text = _task_pages()
    missing = [name for name in recorder.options if not re.search(re.escape(name) + r"(?![\w-])", text)]
    assert not missing, f"options no page explains: {missing}"


def test_every_marker_keyword_is_described():
    """Each keyword the markers accept is named (in backticks) by a heading
    of docs/budgets.md, which the generated table links to (the docs build
    fails on a keyword without one, and so does this test, without Sphinx)."""
    from pytest_memlab.markers import _KEYWORDS

    headings = " ".join(line for line in (DOCS / "budgets.md").read_text().splitlines() if line.startswith("#"))
    named = set(re.findall(r"`([a-z_]+)(?:=[^`]*)?`", headings))
    keywords = {k for names in _KEYWORDS.values() for k in names}
    missing = sorted(keywords - named)
    assert not missing, f"marker keywords no heading of docs/budgets.md names: {missing}"


def test_every_environment_variable_is_in_the_reference():
    read = set()
    for path in [*(ROOT / "pytest_memlab").rglob("*.py"), *(ROOT / "csrc").glob("*.[ch]"),
                 *(ROOT / "csrc").glob("*.cpp")]:
        read |= set(re.findall(r"\"(MEMLAB_[A-Z_]+)\"", path.read_text()))
    assert read, "no variable found: the search reads the sources wrongly"
    reference = (DOCS / "options.md").read_text()
    missing = sorted(v for v in read if f"`{v}`" not in reference)
    assert not missing, f"environment variables the options reference does not list: {missing}"
