"""Bad input and faults, each kept by a test that failed before its fix
(issue 20): the HTML report's script data, a baseline nested too deeply,
Ctrl-C during collection, a bad bool ini value, two outputs naming one
file, --collect-only with reports, where a leak warning points, and one
rounding of a budget's use; and a bad --memlab-report spec, slashes
in its paths or not, on the command line, in the ini and under xdist, is
memlab's own usage error, never a test path pytest cannot find."""

import json
import subprocess
import sys

import pytest

from conftest import line_no, requires_torch
from test_reports import CHROMIUM


@requires_torch
def test_script_markup_in_a_test_id_or_line_leaves_the_html_report_whole(inner, tmp_path):
    inner.makepyfile(test_markup="""
import pytest, torch

@pytest.mark.parametrize("tag", ["<!--<script>", "</script><b>"])
@pytest.mark.cpu_memory(max="1K")
def test_page(tag):
    page = torch.empty(4096)  # parse "<!--<script>" blocks
""")
    result = inner.runpytest_inprocess("--memlab-html=r.html", "--memlab-details=all")
    result.assert_outcomes(failed=2)
    page = (inner.path / "r.html").read_text()
    data = page.split('<script id="memlab-data" type="application/json">')[1].split("</script>")[0]
    assert "<" not in data                       # nothing the HTML parser could read as markup
    report = json.loads(data)                    # and still the same JSON
    assert any("<!--<script>" in t["nodeid"] for t in report["tests"])
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (ci/install installs Debian's chromium)")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", (inner.path / "r.html").as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert "data-errors" not in dom.stdout.split("<body", 1)[0]
    assert '<span id="count">2 of 2 shown</span>' in dom.stdout   # the rows rendered


def test_a_baseline_nested_too_deeply_is_a_usage_error_naming_the_file(inner):
    inner.makepyfile(test_a="def test_a(): pass")
    (inner.path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    result = inner.runpytest_inprocess("--memlab-baseline=deep.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*baseline deep.json: nested too deeply to be read*the file was left as it is*"])
    merged = subprocess.run([sys.executable, "-m", "pytest_memlab", "merge", str(inner.path / "out.json"),
                             str(inner.path / "deep.json")], capture_output=True, text=True)
    assert merged.returncode != 0 and "Traceback" not in merged.stderr
    assert "nested too deeply" in merged.stderr and not (inner.path / "out.json").exists()


def test_ctrl_c_during_collection_does_not_blame_memlab(inner):
    inner.makepyfile(test_stop="raise KeyboardInterrupt\n\ndef test_a(): pass\n")
    result = inner.runpytest_subprocess("--memlab")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str() + result.stderr.str()
    assert "PluggyTeardownRaisedWarning" not in out and "memlab-manager" not in out


def test_a_bad_bool_ini_value_names_its_key(inner):
    inner.makepyfile(test_a="def test_a(): pass")
    inner.makeini("[pytest]\naddopts = -p no:cacheprovider\nmemlab_require_cuda = maybe\n")
    result = inner.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini memlab_require_cuda: invalid truth value 'maybe' (expected true or false)*"])


@pytest.mark.parametrize("args", [
    ["--memlab-json=b.json", "--memlab-baseline=b.json"],
    ["--memlab-html=same.out", "--memlab-json=./same.out"],
])
def test_two_outputs_naming_one_file_are_refused(inner, args):
    inner.makepyfile(test_a="def test_a(): pass")
    (inner.path / "b.json").write_text("kept\n")
    result = inner.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*pytest-memlab: the * and the * name the same file*give each its own*"])
    assert (inner.path / "b.json").read_text() == "kept\n"


@requires_torch
def test_collect_only_writes_no_report_over_an_earlier_one(inner):
    inner.makepyfile(test_a="import torch\ndef test_a():\n    torch.ones(16)\n")
    inner.runpytest_inprocess("--memlab-json=r.json").assert_outcomes(passed=1)
    before = (inner.path / "r.json").read_text()
    assert json.loads(before)["summary"]["measured"] == 1
    result = inner.runpytest_inprocess("--memlab-json=r.json", "--co", "-q")
    assert result.ret == pytest.ExitCode.OK
    assert (inner.path / "r.json").read_text() == before


@requires_torch
def test_a_leak_warning_points_at_the_test(inner):
    inner.makepyfile(test_leak="""
import pytest, torch
_KEPT = []

@pytest.mark.parametrize("n", [1])
def test_keeps(n):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    _KEPT.append(torch.empty(4096, dtype=torch.uint8, device=dev))
""")
    result = inner.runpytest_inprocess("--memlab", "--memlab-leak-repeat=1")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    line = line_no(inner.path / "test_leak.py", "@pytest.mark.parametrize")
    assert f"test_leak.py:{line}: MemlabLeakWarning" in out     # the test's own line (its decorator's)
    assert "pytest_memlab" not in out.split("warnings summary")[1].split("-- Docs")[0]


@requires_torch
def test_a_budgets_use_rounds_half_up_in_the_table(inner):
    inner.makepyfile(test_use="""
import pytest, torch

@pytest.mark.cpu_memory(max="8KiB")
def test_an_eighth():
    torch.empty(1024, dtype=torch.uint8)
""")
    result = inner.runpytest_inprocess("--memlab-report")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["test_an_eighth * 1.0 KiB * 8.0 KiB * 13%"])


@requires_torch
def test_the_leaked_figure_agrees_with_the_verdict(inner):
    """A function fixture's value, which pytest still holds when the leak
    check runs, is no leak: the verdict says so, and so do the figures."""
    inner.makepyfile(test_fixture="""
import pytest, torch

@pytest.fixture
def tensor():
    return torch.empty(2**20, dtype=torch.uint8)

@pytest.mark.cpu_memory(max="1G")
def test_uses(tensor):
    assert tensor.numel() == 2**20
""")
    result = inner.runpytest_inprocess("--memlab-json=r.json", "--memlab-baseline=bl.json", "--memlab-update-baseline")
    result.assert_outcomes(passed=1)
    report = json.loads((inner.path / "r.json").read_text())
    assert report["tests"][0]["devices"]["cpu"]["leaked"] == 0
    baseline = json.loads((inner.path / "bl.json").read_text())
    assert baseline["tests"]["test_fixture.py::test_uses"]["cpu"]["leaked"] == 0


@requires_torch
def test_reports_and_baselines_write_through_links_and_refuse_what_is_not_a_file(inner):
    import os

    inner.makepyfile(test_a="import torch\ndef test_a():\n    torch.ones(16)\n")
    os.symlink("target.json", inner.path / "link.json")
    os.symlink("bl-target.json", inner.path / "bl.json")
    result = inner.runpytest_inprocess("--memlab-json=link.json", "--memlab-baseline=bl.json",
                                       "--memlab-update-baseline")
    assert result.ret == pytest.ExitCode.OK
    assert (inner.path / "link.json").is_symlink() and (inner.path / "bl.json").is_symlink()
    assert json.loads((inner.path / "target.json").read_text())["summary"]["measured"] == 1
    assert "test_a.py::test_a" in json.loads((inner.path / "bl-target.json").read_text())["tests"]
    os.mkfifo(inner.path / "fifo")
    result = inner.runpytest_inprocess("--memlab-json=fifo")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*the JSON report fifo was not written: NotARegularFile: * is not a regular file*"])
    assert (inner.path / "fifo").is_fifo()


@requires_torch
def test_each_test_gets_its_own_snapshot_files(inner):
    inner.makepyfile(test_ids="""
import pytest, torch

@pytest.mark.parametrize("tag", ["a<b", "a>b", "a b", "a/b"])
def test_x(tag):
    torch.ones(16)
""")
    inner.runpytest_inprocess("--memlab-snapshot=snap").assert_outcomes(passed=4)
    tests = {json.loads(p.read_text())["memlab"]["nodeid"] for p in (inner.path / "snap").glob("*.json")}
    assert len(tests) == 4 and len(list((inner.path / "snap").glob("*.pickle"))) == 4


@requires_torch
def test_a_failed_tests_own_locals_are_no_leak(inner):
    """What pytest.fail, a signal handler or pytest-timeout raised keeps
    the failed frames (and their tensors) in pytest's hands for a while:
    no leak, whether the test is marked (judged at once) or not (at the
    end), and its figure says 0."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    inner.makepyfile(test_own=f"""
import pytest, torch, signal, os

@pytest.mark.{'cuda' if dev == 'cuda' else 'cpu'}_memory(max="1G")
def test_marked():
    x = torch.empty(2**20, dtype=torch.uint8, device="{dev}")
    pytest.fail("own")

def test_unmarked():
    x = torch.empty(2**20, dtype=torch.uint8, device="{dev}")
    pytest.fail("own")

def test_from_a_signal_handler():
    x = torch.empty(2**20, dtype=torch.uint8, device="{dev}")
    def handler(signum, frame):
        pytest.fail("timed out")
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, old)
""")
    result = inner.runpytest_inprocess("--memlab", "--memlab-json=r.json")
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    assert "MemlabLeakWarning" not in out and "leaked 1.0 MiB" not in out, out
    name = "cuda:0" if dev == "cuda" else "cpu"
    report = json.loads((inner.path / "r.json").read_text())
    assert [t["devices"][name]["leaked"] for t in report["tests"]] == [0, 0, 0]


@requires_torch
def test_a_failed_tests_locals_are_no_leak_in_a_large_session(inner):
    """The failed frames' tensors are found however much of pytest their
    locals reach: a request reaches the session and its 3000 items, which
    once used up the search's bound before the tensor (a false leak)."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    inner.makepyfile(test_big=f"""
import pytest, torch

@pytest.mark.parametrize("i", range(3000))
def test_many(i, request):
    pass

def test_fails(request):
    x = torch.empty(2**20, dtype=torch.uint8, device="{dev}")
    held = [request] * 3
    pytest.fail("own")
""")
    result = inner.runpytest_inprocess("--memlab", "--memlab-leaks=fail", "--memlab-json=r.json", "-p", "no:randomly")
    result.assert_outcomes(passed=3000, failed=1)
    out = result.stdout.str()
    assert "leaked" not in out and "failed by memlab" not in out, out
    report = json.loads((inner.path / "r.json").read_text())
    name = "cuda:0" if dev == "cuda" else "cpu"
    assert [t["devices"][name]["leaked"] for t in report["tests"] if t["nodeid"].endswith("test_fails")] == [0]


def test_a_bad_marker_a_hook_adds_under_xdist_is_said_cleanly(inner):
    pytest.importorskip("xdist")
    inner.makeconftest("""
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        if item.name == "test_a":
            item.add_marker(pytest.mark.cpu_memory(max="2X"))
""")
    inner.makepyfile(test_x="def test_a(): pass\n\ndef test_b(): pass\n")
    result = inner.runpytest_subprocess("-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, errors=1)
    out = result.stdout.str()
    assert "INTERNALERROR" not in out
    result.stdout.fnmatch_lines(["*pytest-memlab: bad memory marker*", "*test_x.py::test_a: *2X*"])
    plain = inner.runpytest_inprocess()
    assert plain.ret == pytest.ExitCode.USAGE_ERROR   # without workers: the usage error, as before


KINDS = "term, json:PATH, html:PATH, bmf:PATH, gab:PATH"


def said(result, lead: str) -> str:
    """The one line of the run's stderr that begins with lead, from lead on
    (the program's name before ': error:' is the runner's)."""
    lines = [line[line.index(lead):] for line in result.stderr.lines if lead in line]
    assert len(lines) == 1, result.stderr.str()
    return lines[0]


BAD_REPORTS = [   # (spec, what memlab says): a slash in a path makes no test path of a bad spec
    ("jsn:reports/a.json", f"'jsn:reports/a.json' is not a report (expected a comma list of: {KINDS}); "
                           "did you mean json:reports/a.json?"),
    ("jsn:a.json", f"'jsn:a.json' is not a report (expected a comma list of: {KINDS}); did you mean json:a.json?"),
    ("term,xml:reports/a.xml", f"'xml:reports/a.xml' is not a report (expected a comma list of: {KINDS})"),
    ("reports/a.html", f"'reports/a.html' is not a report (expected a comma list of: {KINDS}); "
                       "did you mean html:reports/a.html?"),
    ("json:reports/a.json,html:", "'html:' names no file (write html:PATH)"),
]


@pytest.mark.parametrize("spec, message", BAD_REPORTS)
def test_a_bad_report_spec_is_memlabs_usage_error_with_or_without_slashes(inner, spec, message):
    inner.makepyfile(test_a="def test_a(): pass")
    result = inner.runpytest_inprocess(f"--memlab-report={spec}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert said(result, "error: argument") == f"error: argument --memlab-report: {message}"
    assert "file or directory not found" not in result.stdout.str() + result.stderr.str()
    assert not (inner.path / "reports").exists()


@pytest.mark.parametrize("spec, message", [BAD_REPORTS[0], BAD_REPORTS[2]])
def test_a_bad_report_spec_in_the_ini_is_memlabs_usage_error(inner, spec, message):
    inner.makeini(f"[pytest]\naddopts = -p no:cacheprovider -p no:randomly\nmemlab_report = {spec}\n")
    inner.makepyfile(test_a="def test_a(): pass")
    result = inner.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert said(result, "ERROR: ") == f"ERROR: ini memlab_report: {message}"


def test_a_bad_report_spec_under_xdist_is_memlabs_usage_error(inner):
    pytest.importorskip("xdist")
    inner.makepyfile(test_a="def test_a(): pass")
    spec, message = BAD_REPORTS[0]
    result = inner.runpytest_subprocess("-p", "xdist", "-n", "2", f"--memlab-report={spec}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert said(result, "error: argument") == f"error: argument --memlab-report: {message}"
    assert "file or directory not found" not in result.stdout.str() + result.stderr.str()
    inner.makeini(f"[pytest]\naddopts = -p no:cacheprovider -p no:randomly\nmemlab_report = {spec}\n")
    result = inner.runpytest_subprocess("-p", "xdist", "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert said(result, "ERROR: ") == f"ERROR: ini memlab_report: {message}"


@pytest.mark.parametrize("xdist", [[], ["-p", "xdist", "-n", "2"]], ids=["", "xdist"])
def test_a_report_that_cannot_be_written_fails_the_session(inner, xdist):
    """A good spec whose folder is a file: the tests pass, the report is
    said not written, and the session fails."""
    if xdist:
        pytest.importorskip("xdist")
    inner.makepyfile(test_a="def test_a(): pass")
    (inner.path / "blocked").write_text("a file, not a folder")
    result = inner.runpytest_subprocess(*xdist, "--memlab-report=term,json:blocked/r.json,html:blocked/r.html")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "pytest-memlab: the JSON report blocked/r.json was not written: *Error: *",
        "pytest-memlab: the HTML report blocked/r.html was not written: *Error: *",
    ])
    assert (inner.path / "blocked").read_text() == "a file, not a folder"
