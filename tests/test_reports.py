"""Reports: the option's spellings and the JSON report (its schema, its
figures from real allocations, under pytest-xdist too)."""

import json

import pytest

from conftest import line_no, requires_torch

pytestmark = requires_torch

SUITE = """
import pytest, torch
MiB = 2**20

@pytest.mark.cpu_memory(max="8MiB")
def test_within():
    a = torch.empty(3 * MiB, dtype=torch.uint8)
    del a

@pytest.mark.cpu_memory(max="1MiB")
def test_over():
    a = torch.empty(2 * MiB, dtype=torch.uint8)
    del a

@pytest.mark.cpu_memory
def test_fails_itself():
    a = torch.empty(MiB, dtype=torch.uint8)
    assert False

def test_unmarked():
    pass   # measured all the same: a report implies --memlab
"""


def validate(data):
    jsonschema = pytest.importorskip("jsonschema")
    from pytest_memlab.json_report import SCHEMA

    jsonschema.validate(data, json.loads(SCHEMA.read_text()))


def check_report(path, suite_file):
    text = path.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"   # stable: sorted keys
    assert data["format"] == "pytest-memlab-report" and data["version"] == 1
    tests = {t["nodeid"]: t for t in data["tests"]}
    assert list(tests) == sorted(tests)                                   # node id order
    assert list(tests) == ["test_suite.py::test_fails_itself", "test_suite.py::test_over",
                           "test_suite.py::test_unmarked", "test_suite.py::test_within"]
    assert tests["test_suite.py::test_unmarked"]["devices"]["cpu"]["peak"] == 0
    within = tests["test_suite.py::test_within"]
    assert within["outcome"] == "passed" and within["failed_by_memlab"] == []
    cpu = within["devices"]["cpu"]
    assert (cpu["peak"], cpu["budget"], cpu["leaked"], cpu["reserved_peak"]) == (3 * 2**20, 8 * 2**20, 0, None)
    line = line_no(suite_file, "a = torch.empty(3 * MiB")
    assert cpu["top"][0] == {"file": "test_suite.py", "line": line, "function": "test_within",
                             "bytes": 3 * 2**20, "peak_total": cpu["top"][0]["peak_total"]}
    over = tests["test_suite.py::test_over"]
    assert over["outcome"] == "failed" and over["failed_by_memlab"] == ["cpu max"]
    assert over["devices"]["cpu"]["peak"] == 2 * 2**20
    itself = tests["test_suite.py::test_fails_itself"]
    assert itself["outcome"] == "failed" and itself["failed_by_memlab"] == []
    assert itself["devices"]["cpu"]["budget"] is None
    assert data["summary"] == {"tests": 4, "measured": 4, "failed_by_memlab": 1, "warned": 0, "memlab_errors": 0}
    assert data["environment"]["torch"] and data["backend"].startswith("bridge")
    validate(data)
    return data


@pytest.mark.parametrize("args", [["--memlab-json=out/report.json"], ["--memlab-report=term,json:out/report.json"]])
def test_the_json_report(inner, args):
    inner.makepyfile(test_suite=SUITE)
    result = inner.runpytest_inprocess(*args)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["JSON report: out/report.json"])
    check_report(inner.path / "out" / "report.json", inner.path / "test_suite.py")
    if "term" in args[0]:
        result.stdout.fnmatch_lines(["test * device * own peak*"])


def test_the_json_report_under_xdist_and_from_the_ini(inner):
    inner.makepyfile(test_suite=SUITE)
    inner.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\nmemlab_json = report.json\n")
    result = inner.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=2, failed=2)
    check_report(inner.path / "report.json", inner.path / "test_suite.py")


def test_the_json_report_carries_the_baseline(inner):
    inner.makepyfile(test_suite=SUITE)
    inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-update-baseline")
    inner.makepyfile(test_suite=SUITE.replace("3 * MiB", "4 * MiB"))
    result = inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-json=r.json")
    result.assert_outcomes(passed=1, failed=3)
    data = json.loads((inner.path / "r.json").read_text())
    validate(data)
    within = next(t for t in data["tests"] if t["nodeid"].endswith("test_within"))
    assert within["failed_by_memlab"] == ["cpu baseline"]
    assert (within["devices"]["cpu"]["baseline_peak"], within["devices"]["cpu"]["peak"],
            within["devices"]["cpu"]["baseline"]) == (3 * 2**20, 4 * 2**20, "regressed")
    unmarked = next(t for t in data["tests"] if t["nodeid"].endswith("test_unmarked"))
    assert unmarked["devices"]["cpu"]["baseline"] == "same"   # --memlab-baseline measures every test


def test_a_path_after_the_bare_flag_is_a_path(inner):
    inner.makepyfile(test_suite=SUITE)
    sub = inner.mkpydir("sub")
    (sub / "test_other.py").write_text("def test_other():\n    pass\n")
    result = inner.runpytest_inprocess("--memlab-report", "sub")
    result.assert_outcomes(passed=1)                       # only sub/ was collected
    result.stdout.fnmatch_lines(["test * own peak*", "sub/test_other.py::test_other *"])
    result = inner.runpytest_inprocess("test_suite.py::test_within", "--memlab-report", "sub/test_other.py")
    result.assert_outcomes(passed=2)
    result = inner.runpytest_inprocess("--memlab-report=term", "sub")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("spec, message", [
    ("xml", "'xml' is not a report (expected a comma list of: term, json:PATH)"),
    ("json:", "'json:' names no file (write json:PATH)"),
    ("html:x.html", "'html:x.html': the html report is not available in this version*"),
])
def test_a_bad_report_spec_is_a_usage_error(inner, spec, message):
    inner.makepyfile(test_suite=SUITE)
    result = inner.runpytest_inprocess(f"--memlab-report={spec}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


def test_an_unwritable_json_report_is_said_and_fails_the_run(inner):
    inner.makepyfile(test_suite="def test_ok():\n    pass\n")
    (inner.path / "blocked").write_text("a file, not a folder")
    result = inner.runpytest_inprocess("--memlab-json=blocked/r.json")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["pytest-memlab: the JSON report blocked/r.json was not written: *"])
