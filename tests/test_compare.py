"""``python -m pytest_memlab compare OLD NEW``: two real runs of a small
CPU suite, the second allocating 8 MiB more on one line of one test, 4 MiB
less in another and 2 MiB more in a module cache (first use), with one test
gone, one new and one broken; their baselines and JSON reports compared, as
text and as Markdown; lanes; files from before sites; bad input."""

import json
import re
import subprocess
import sys

import pytest

from conftest import has_cuda, requires_torch

# one worker runs the two runs once (the runs fixture) for all the tests here
pytestmark = [requires_torch, pytest.mark.xdist_group("compare-runs")]

MiB = 2**20

SUITE = """
import os
import pytest, torch

MiB = 2**20
NEW = os.environ.get("PHASE") == "new"
EXTRA = (12 if NEW else 4) * MiB     # test_grows: 8 MiB more in the new run, on one line
SPARE = (2 if NEW else 6) * MiB      # test_shrinks: 4 MiB less
TABLE = (6 if NEW else 2) * MiB      # test_steady's first use: 4 MiB more, its peak the same
DEV = "cuda" if torch.cuda.is_available() else "cpu"   # where --memlab measures an unmarked test
_TABLES = {}                         # a module cache, filled once for the process
cpu = pytest.mark.cpu_memory()


def test_steady():   # unmarked: its cache is judged by the session's leak policy, as first use
    if "t" not in _TABLES:
        _TABLES["t"] = torch.ones(TABLE, dtype=torch.uint8, device=DEV)
    x = torch.empty(4 * MiB, dtype=torch.uint8, device=DEV)
    del x


@cpu
def test_grows():
    a = torch.empty(16 * MiB, dtype=torch.uint8)
    b = torch.empty(EXTRA, dtype=torch.uint8)
    del a, b


@cpu
@pytest.mark.parametrize("mode", ["a|b"])
def test_shrinks(mode):
    c = torch.empty(SPARE, dtype=torch.uint8)
    del c


@cpu
def test_breaks():
    x = torch.empty(2 * MiB, dtype=torch.uint8)
    assert not NEW, "broken in the new run"


if NEW:
    @cpu
    def test_new():
        x = torch.empty(MiB, dtype=torch.uint8)
        del x
else:
    @cpu
    def test_gone():
        x = torch.empty(MiB, dtype=torch.uint8)
        del x
"""

GROWS = "test_suite.py::test_grows"
SHRINKS = "test_suite.py::test_shrinks[a|b]"
STEADY = "test_suite.py::test_steady"
STEADY_DEV = "cuda" if has_cuda() else "cpu"   # (--memlab's device for an unmarked test)
# test_grows: 16 MiB + 4 MiB live at once, then 16 MiB + 12 MiB
OLD_PEAK, NEW_PEAK = 20 * MiB, 28 * MiB
GROWN_LINE = "test_grows: b = torch.empty(EXTRA, dtype=torch.uint8)"
SHRUNK_LINE = "test_shrinks: c = torch.empty(SPARE, dtype=torch.uint8)"
# test_breaks fails in the new run: the new baseline keeps no entry of it
# (gone), and the report's figures of it are left out
SUMMARY = "pytest-memlab compare: 1 regressed, 1 improved, 1 unchanged, 1 new, 2 gone"
REPORT_SUMMARY = "pytest-memlab compare: 1 regressed, 1 improved, 1 unchanged, 1 new, 1 gone"


@pytest.fixture
def runs(inner, monkeypatch, made_once):
    """old.json (a baseline) from the old run; new.json (a baseline) and
    r.json (its JSON report) from the new one, in the cpu lane (also on a
    machine with CUDA); --memlab measures the unmarked test_steady.  In
    subprocesses: in-process, pytester's hook recorder would hold the module
    cache too (a list's element: a leak).  Run once a session, each test
    given its own copy of the files."""
    inner.makepyfile(test_suite=SUITE)

    def make():
        monkeypatch.setenv("PHASE", "old")
        inner.runpytest_subprocess("--memlab", "--memlab-baseline=old.json", "--memlab-update-baseline",
                                   "--memlab-baseline-env=cpu").assert_outcomes(passed=5)
        monkeypatch.setenv("PHASE", "new")
        inner.runpytest_subprocess("--memlab", "--memlab-baseline=new.json", "--memlab-update-baseline",
                                   "--memlab-baseline-env=cpu", "--memlab-json=r.json").assert_outcomes(passed=4, failed=1)

    made_once("compare-runs", inner.path, ("old.json", "new.json", "r.json"), make)
    monkeypatch.setenv("PHASE", "new")
    return inner


def memlab(cwd, *args):
    """The command as CI runs it."""
    return subprocess.run([sys.executable, "-m", "pytest_memlab", *args], cwd=cwd, capture_output=True, text=True)


def main(capsys, *args):
    from pytest_memlab.__main__ import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def block(out: str, start: str) -> list[str]:
    """The lines of the paragraph of out that begins with start."""
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(start))
    end = next((j for j in range(i, len(lines)) if not lines[j].strip()), len(lines))
    return lines[i:end]


def test_a_grown_line_regresses_its_test_and_is_named_first(runs):
    old = json.loads((runs.path / "old.json").read_text())["tests"]
    new = json.loads((runs.path / "new.json").read_text())["tests"]
    assert old[GROWS]["cpu"]["peak"] == OLD_PEAK and new[GROWS]["cpu"]["peak"] == NEW_PEAK
    assert old[SHRINKS]["cpu"]["peak"] == 6 * MiB and new[SHRINKS]["cpu"]["peak"] == 2 * MiB
    assert old[STEADY][STEADY_DEV]["peak"] == new[STEADY][STEADY_DEV]["peak"] == 4 * MiB

    out = memlab(runs.path, "compare", "old.json", "new.json")
    assert out.returncode == 1, out.stderr
    assert out.stderr == ""
    text = out.stdout
    assert text.splitlines()[0] == "pytest-memlab compare: old.json [cpu] -> new.json [cpu], tolerance 2%,64KiB"
    grows = block(text, "regressed ")
    assert grows[0] == f"regressed {GROWS} [cpu]: peak 20.0 MiB -> 28.0 MiB (+40.0%)"
    # the tolerance: the larger of 2% of 20 MiB and 64 KiB
    assert grows[1] == f"  exactly {NEW_PEAK} B against {OLD_PEAK} B; the tolerance allows {OLD_PEAK // 50} B more"
    # what grew, by line: the 8 MiB line first; the 16 MiB line did not move
    assert grows[2] == "  what changed at the peak, by the line that changed (against the baseline):"
    assert grows[3].split()[0] == "+8.0" and GROWN_LINE in grows[3] and grows[3].endswith("(4.0 MiB -> 12.0 MiB)")
    assert len(grows) == 4

    shrinks = block(text, "improved ")
    assert shrinks[0] == f"improved {SHRINKS} [cpu]: peak 6.0 MiB -> 2.0 MiB (-66.7%)"
    assert shrinks[1] == f"  exactly {2 * MiB} B against {6 * MiB} B; the tolerance allows {6 * MiB // 50} B less"
    assert shrinks[3].split()[0] == "-4.0" and SHRUNK_LINE in shrinks[3] and shrinks[3].endswith("(6.0 MiB -> 2.0 MiB)")

    assert block(text, "new (only in NEW):") == ["new (only in NEW):", "  test_suite.py::test_new [cpu]"]
    assert block(text, "gone (only in OLD):") == ["gone (only in OLD):", "  test_suite.py::test_breaks [cpu]",
                                                  "  test_suite.py::test_gone [cpu]"]
    assert sum(line.startswith(("regressed ", "improved ")) for line in text.splitlines()) == 2   # not test_steady
    assert text.splitlines()[-1] == SUMMARY


def test_first_use_is_shown_never_compared(runs):
    """test_steady's module cache grew by 4 MiB: a line of its own; its peak
    did not move, so it is no regression."""
    old = json.loads((runs.path / "old.json").read_text())["tests"][STEADY][STEADY_DEV]
    new = json.loads((runs.path / "new.json").read_text())["tests"][STEADY][STEADY_DEV]
    assert (old["first_use"], new["first_use"]) == (2 * MiB, 6 * MiB)
    assert old["peak"] == new["peak"] == 4 * MiB
    out = memlab(runs.path, "compare", "old.json", "new.json")
    assert out.returncode == 1   # test_grows
    assert (f"{STEADY} [{STEADY_DEV}]: first use 2.0 MiB -> 6.0 MiB (allocated once for the process: "
            "shown, not compared)") in out.stdout.splitlines()
    assert f"regressed {STEADY}" not in out.stdout and out.stdout.splitlines()[-1] == SUMMARY
    out = memlab(runs.path, "compare", "old.json", "new.json", "--format=markdown")
    assert f"- `{STEADY}` [{STEADY_DEV}]: 2.0 MiB -> 6.0 MiB" in out.stdout.splitlines()


def test_the_markdown_form_is_a_pull_request_comment(runs, capsys):
    code, md, err = main(capsys, "compare", "old.json", "new.json", "--format", "markdown")
    assert code == 1 and err == ""
    lines = md.splitlines()
    assert lines[0] == "### pytest-memlab: memory regressed in 1 test"
    assert lines[2] == ("OLD `old.json` [cpu], NEW `new.json` [cpu], tolerance `2%,64KiB`: "
                        "1 regressed, 1 improved, 1 unchanged, 1 new, 2 gone.")
    header = lines.index("| test | device | old | new | change |")
    assert lines[header - 1] == "" and lines[header + 1] == "| --- | --- | ---: | ---: | ---: |"
    # regressions first, then improvements; the | of a node id escaped
    assert lines[header + 2] == f"| `{GROWS}` | cpu | 20.0 MiB | 28.0 MiB | +8.0 MiB (+40.0%) |"
    assert lines[header + 3] == "| `test_suite.py::test_shrinks[a\\|b]` | cpu | 6.0 MiB | 2.0 MiB | -4.0 MiB (-66.7%) |"
    assert lines[header + 4] == ""
    for row in lines[header:header + 4]:   # five cells a row, as GitHub splits them
        assert len(re.split(r"(?<!\\)\|", row)) == 7, row
    # one <details> per regressed test, the lines in a code block
    start = lines.index(f"<details><summary><code>{GROWS}</code> [cpu]: peak 20.0 MiB -&gt; 28.0 MiB "
                        "(+40.0%)</summary>")
    details = lines[start:lines.index("</details>", start) + 1]
    assert details[1] == "" and details[2] == "```" and details[-3] == "```" and details[-2] == ""
    assert details[3] == f"exactly {NEW_PEAK} B against {OLD_PEAK} B; the tolerance allows {OLD_PEAK // 50} B more"
    assert details[4] == "what changed at the peak, by the line that changed (against the baseline):"
    assert details[5].lstrip().startswith("+8.0 MiB") and GROWN_LINE in details[5]
    assert len(details) == 9
    assert md.count("<details>") == 3 and md.count("</details>") == 3   # the regression; the new; the gone
    assert "<details><summary>1 new (only in NEW)</summary>" in lines
    assert "- `test_suite.py::test_new` [cpu]" in lines
    assert "<details><summary>2 gone (only in OLD)</summary>" in lines
    assert md.count("```") == 2


def test_a_json_report_compares_with_a_baseline(runs, capsys):
    report = json.loads((runs.path / "r.json").read_text())
    assert report["format"] == "pytest-memlab-report"
    code, out, err = main(capsys, "compare", "old.json", "r.json")
    assert code == 1, err
    assert out.splitlines()[0] == "pytest-memlab compare: old.json [cpu] -> r.json (report), tolerance 2%,64KiB"
    grows = block(out, "regressed ")
    assert grows[0] == f"regressed {GROWS} [cpu]: peak 20.0 MiB -> 28.0 MiB (+40.0%)"
    assert grows[3].split()[0] == "+8.0" and GROWN_LINE in grows[3]
    # the broken test's figures stop at its failure: not compared, not gone
    assert block(out, "left out of r.json") == [
        "left out of r.json (skipped, or failed by its own doing: its figures stop short):",
        "  test_suite.py::test_breaks"]
    assert block(out, "gone (only in OLD):") == ["gone (only in OLD):", "  test_suite.py::test_gone [cpu]"]
    assert out.splitlines()[-1] == REPORT_SUMMARY
    # the other way round: the report as OLD, the old baseline as NEW
    code, out, err = main(capsys, "compare", "r.json", "old.json")
    assert code == 1
    assert f"improved {GROWS} [cpu]: peak 28.0 MiB -> 20.0 MiB (-28.6%)" in out
    assert f"regressed {SHRINKS} [cpu]: peak 2.0 MiB -> 6.0 MiB (+200.0%)" in out
    assert out.splitlines()[-1] == REPORT_SUMMARY
    # a run against its own report: nothing listed, exit 0
    code, out, err = main(capsys, "compare", "new.json", "r.json")
    assert code == 0
    assert out.splitlines() == [
        "pytest-memlab compare: new.json [cpu] -> r.json (report), tolerance 2%,64KiB", "",
        "left out of r.json (skipped, or failed by its own doing: its figures stop short):",
        "  test_suite.py::test_breaks", "",
        "pytest-memlab compare: 0 regressed, 0 improved, 4 unchanged, 0 new, 0 gone"]


def test_the_tolerance_and_failing_on_improvement(runs, capsys):
    # +8 MiB is beyond 5 MiB, so still a regression; -4 MiB is within it
    code, out, _ = main(capsys, "compare", "old.json", "new.json", "--tolerance", "5MiB")
    assert code == 1
    assert out.splitlines()[-1] == "pytest-memlab compare: 1 regressed, 0 improved, 2 unchanged, 1 new, 2 gone"
    # +8 MiB is within 50% of 20 MiB; -4 MiB is beyond 50% of 6 MiB
    code, out, _ = main(capsys, "compare", "old.json", "new.json", "--tolerance", "50%")
    assert code == 0
    assert out.splitlines()[-1] == "pytest-memlab compare: 0 regressed, 1 improved, 2 unchanged, 1 new, 2 gone"
    code, out, _ = main(capsys, "compare", "old.json", "new.json", "--tolerance", "50%", "--fail-on-improvement")
    assert code == 1
    assert out.splitlines()[-1].endswith("2 gone (improvements fail: --fail-on-improvement)")
    code, md, _ = main(capsys, "compare", "old.json", "new.json", "--tolerance=50%", "--fail-on-improvement",
                       "--format=markdown")
    assert code == 1 and md.startswith("### pytest-memlab: the baseline is loose: 1 test improved (--fail-on-improvement)\n")
    # growth equal to the tolerance passes, as in the plugin
    code, out, _ = main(capsys, "compare", "old.json", "new.json", "--tolerance", "8MiB")
    assert code == 0
    assert out.splitlines()[-1] == "pytest-memlab compare: 0 regressed, 0 improved, 3 unchanged, 1 new, 2 gone"
    code, md, _ = main(capsys, "compare", "old.json", "new.json", "--tolerance", "8MiB", "--format", "markdown")
    assert code == 0 and md.startswith("### pytest-memlab: no memory regression\n")
    assert "| test |" not in md


def test_a_lane_of_a_baseline_with_several(runs, capsys, monkeypatch):
    # a second lane in the old file, written by the new run
    monkeypatch.setenv("PHASE", "new")
    runs.runpytest_subprocess("--memlab", "--memlab-baseline=old.json", "--memlab-update-baseline",
                              "--memlab-baseline-env=next").assert_outcomes(passed=4, failed=1)
    capsys.readouterr()
    assert sorted(json.loads((runs.path / "old.json").read_text())["environments"]) == ["cpu", "next"]
    code, out, _ = main(capsys, "compare", "old.json", "new.json")   # by default its cpu lane
    assert code == 1 and out.startswith("pytest-memlab compare: old.json [cpu] -> new.json [cpu]")
    assert out.splitlines()[-1] == SUMMARY
    code, out, err = main(capsys, "compare", "old.json", "r.json", "--env", "next")   # a report has no lanes
    assert code == 0, err
    assert out.startswith("pytest-memlab compare: old.json [next] -> r.json (report)")
    code, out, err = main(capsys, "compare", "old.json", "new.json", "--env", "next")
    assert (code, out) == (2, "")
    assert err == "pytest-memlab compare: new.json: no lane 'next' (its lanes: cpu)\n"
    code, out, err = main(capsys, "compare", "old.json", "new.json", "--env", "gpu")
    assert (code, out) == (2, "")
    assert err == "pytest-memlab compare: old.json: no lane 'gpu' (its lanes: cpu, next)\n"


def test_files_without_sites_or_first_use_still_compare(runs, capsys):
    """A baseline and a report written before entries kept their sites and
    first use."""
    data = json.loads((runs.path / "old.json").read_text())
    for devices in data["tests"].values():
        for figures in devices.values():
            figures.pop("sites", None)
            figures.pop("first_use", None)
    (runs.path / "older.json").write_text(json.dumps(data))
    code, out, err = main(capsys, "compare", "older.json", "new.json")
    assert code == 1, err
    grows = block(out, "regressed ")
    assert grows[0] == f"regressed {GROWS} [cpu]: peak 20.0 MiB -> 28.0 MiB (+40.0%)"
    assert grows[2] == ("  (no lines to compare: older.json keeps no sites at the peak, "
                        "written by an older pytest-memlab)")
    assert "first use" not in out
    assert out.splitlines()[-1] == SUMMARY
    report = json.loads((runs.path / "r.json").read_text())
    for test in report["tests"]:
        for d in test["devices"].values():
            d.pop("sites", None)
            d.pop("first_use", None)
    (runs.path / "older-r.json").write_text(json.dumps(report))
    code, out, err = main(capsys, "compare", "older.json", "older-r.json", "--format", "markdown")
    assert code == 1, err
    assert ("(no lines to compare: older.json and older-r.json keep no sites at the peak, "
            "written by an older pytest-memlab)") in out.splitlines()


BAD = [
    (None, "no such file"),
    ("{not json", "not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
    ("[1, 2]", "expected a JSON object at the top, found list"),
    ('{"format": "pytest-benchmark"}', "'format' is 'pytest-benchmark', expected 'pytest-memlab-baseline' "
                                       "(a baseline) or 'pytest-memlab-report' (a JSON report)"),
    ('{"format": "pytest-memlab-baseline", "version": 99, "tests": {}}',
     "format version 99 is not known to this pytest-memlab, which reads version 1"),
    ('{"format": "pytest-memlab-report", "version": 99, "tests": []}',
     "report format version 99 is not known to this pytest-memlab, which reads versions 1 to"),
    ('{"format": "pytest-memlab-baseline", "version": 1, "environment": {"name": "cpu"}, '
     '"tests": {"t.py::t": {"cpu": {"peak": -1}}}}', "test 't.py::t', device 'cpu': peak is -1, expected bytes"),
    ('{"format": "pytest-memlab-report", "version": 2, "tests": [{"nodeid": "t.py::t", "outcome": "passed", '
     '"devices": {"cpu": {"name": "cpu", "peak": "lots"}}}]}', "test 't.py::t', device 'cpu': peak is 'lots'"),
]


def test_bad_input_exits_2_naming_the_file(runs):
    for content, words in BAD:
        bad = runs.path / "bad.json"
        if content is None:
            bad.unlink(missing_ok=True)
        else:
            bad.write_text(content)
        for args in (["bad.json", "new.json"], ["old.json", "bad.json"], ["bad.json", "r.json", "--format=markdown"]):
            out = memlab(runs.path, "compare", *args)
            assert out.returncode == 2, (content, out.stdout)
            assert out.stdout == ""
            assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
            assert re.match(r"pytest-memlab compare: (baseline )?bad\.json: ", out.stderr), out.stderr
            assert words in out.stderr, out.stderr
    out = memlab(runs.path, "compare", "old.json", "new.json", "--tolerance", "lots")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("pytest-memlab compare: --tolerance: tolerance 'lots': 'lots' is not a size "
                          "(expected a number, at most one space, and a unit: B, K, M, G, T, KiB, MiB, GiB, TiB, "
                          "kB, MB, GB, TB)\n")


def test_merge_still_works(runs):
    out = memlab(runs.path, "merge", "both.json", "old.json", "new.json")
    assert out.returncode == 0, out.stderr
    assert f"measured twice: {GROWS} [cpu cpu] in old.json and new.json: kept new.json's" in out.stderr
    assert out.stdout.strip() == "pytest-memlab merge: 2 files into both.json (cpu: 6 tests)"
