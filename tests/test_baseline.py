"""Baselines: write, compare, tolerate, fail, report; broken and missing
files; xdist, CI shards and concurrent writers.  Real torch allocations,
on the CPU here and on CUDA too where there is CUDA (ci/gpu)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import has_cuda, requires_torch

pytestmark = requires_torch

# the lane a run compares with and writes, unless it names one: "cuda" on a
# machine with CUDA (whatever device the tests measure), else "cpu"
LANE = "cuda" if has_cuda() else "cpu"

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not has_cuda(), reason="needs CUDA"))]

SUITE = """
import os
import pytest, torch

DEV = %(dev)r
MiB = 2**20
pytestmark = pytest.mark.%(marker)s()   # measured on DEV, also where CUDA would be the default
GROW = int(os.environ.get("GROW", "100"))

def block(n):
    return torch.empty(n * GROW // 100, dtype=torch.uint8, device=DEV)

def test_steady():
    x = block(4 * MiB)
    del x

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    x = block(n * 4 * MiB)
    del x

@pytest.mark.%(marker)s(max="1G", tolerance="30%%")
def test_marked_loose():
    x = block(4 * MiB)
    del x

def test_fixed():
    x = torch.empty(4 * MiB, dtype=torch.uint8, device=DEV)
    del x
"""


def suite(pytester, dev="cpu", extra=""):
    marker = "cuda_memory" if dev == "cuda" else "cpu_memory"
    pytester.makepyfile(test_suite=SUITE % {"dev": dev, "marker": marker} + extra)


def write(pytester, *args):
    return pytester.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-update-baseline", *args)


def compare(pytester, *args, grow=100, subprocess=False):
    os.environ["GROW"] = str(grow)
    try:
        run = pytester.runpytest_subprocess if subprocess else pytester.runpytest_inprocess
        return run("--memlab-baseline=bl.json", *args)
    finally:
        del os.environ["GROW"]


def entries(path) -> dict:
    data = json.loads(path.read_text())
    if "environments" in data:
        return {name: env["tests"] for name, env in data["environments"].items()}
    return {data["environment"]["name"]: data["tests"]}


NODEIDS = ["test_suite.py::test_fixed", "test_suite.py::test_marked_loose", "test_suite.py::test_param[1]",
           "test_suite.py::test_param[2]", "test_suite.py::test_steady"]


@pytest.mark.parametrize("dev", DEVICES)
def test_write_then_compare_unchanged_passes(inner, dev):
    suite(inner, dev)
    result = write(inner)
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([f"baseline bl.json [[]{LANE}[]] updated: 5 tests written (5 new, 0 changed)"])
    text = (inner.path / "bl.json").read_text()
    data = json.loads(text)
    # the README's layout: sorted keys, two-space indent, trailing newline
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert data["format"] == "pytest-memlab-baseline" and data["version"] == 1
    assert data["environment"]["name"] == LANE
    assert set(data["environment"]) >= {"torch", "cuda", "device", "python"}
    assert sorted(data["tests"]) == NODEIDS
    steady = data["tests"]["test_suite.py::test_steady"][dev]
    assert steady["peak"] == 4 * 2**20 and steady["leaked"] == 0
    assert set(steady) == {"peak", "peak_total", "reserved_peak", "leaked", "first_use", "sites"}
    assert data["tests"]["test_suite.py::test_param[2]"][dev]["peak"] == 8 * 2**20
    # written again with the same figures: nothing changed
    write(inner).stdout.fnmatch_lines([f"baseline bl.json [[]{LANE}[]] updated: 5 tests written (0 new, 0 changed)"])
    assert (inner.path / "bl.json").read_text() == text

    if dev == "cuda":
        assert steady["reserved_peak"] >= steady["peak"]
    else:
        assert steady["reserved_peak"] is None

    result = compare(inner)
    assert result.ret == 0
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([f"baseline bl.json [[]{LANE}[]]: 5 compared"])


def test_a_test_with_no_lines_is_not_changed_by_writing_it_again(inner):
    """A test that allocated nothing has no heavy lines: written again, it
    is the same entry ([] as it was written), not a change."""
    inner.makepyfile(test_none="def test_nothing():\n    pass\n")
    for new in (1, 0):
        result = inner.runpytest_subprocess("--memlab-baseline=bl.json", "--memlab-update-baseline")
        result.stdout.fnmatch_lines([f"baseline bl.json [[]*[]] updated: 1 test written ({new} new, 0 changed)"])


@pytest.mark.parametrize("dev", DEVICES)
def test_growth_of_a_quarter_fails_the_grown_tests(inner, dev):
    suite(inner, dev)
    write(inner).assert_outcomes(passed=5)
    before = (inner.path / "bl.json").read_text()
    result = compare(inner, "--junitxml=junit.xml", grow=125)
    # test_fixed does not grow; test_marked_loose's own tolerance is 30%
    result.assert_outcomes(passed=2, failed=3)
    dev_name = "cpu" if dev == "cpu" else "cuda:*"
    result.stdout.fnmatch_lines([
        f"*{dev_name} peak grew from 4.0 MiB to 5.0 MiB (+25.0%), over the tolerance 2%,64KiB (baseline bl.json)",
        "  peak reached in test_suite.py:* block: *",
        "*exactly 5242880 B against 4194304 B in the baseline; the tolerance allows 83886 B more",
    ])
    result.stdout.fnmatch_lines([
        "FAILED test_suite.py::test_steady - *peak grew from 4.0 MiB*",
        "FAILED test_suite.py::test_param[[]1[]] - *",
        "FAILED test_suite.py::test_param[[]2[]] - *peak grew from 8.0 MiB*",
    ])
    result.stdout.fnmatch_lines([f"baseline bl.json [[]{LANE}[]]: 5 compared, 3 regressed"])
    junit = (inner.path / "junit.xml").read_text()
    assert junit.count("over the tolerance 2%,64KiB (baseline bl.json)") >= 3
    assert junit.count('name="memlab.') > 10 and 'value="regressed"' in junit
    assert (inner.path / "bl.json").read_text() == before  # compare mode never writes


def test_unmarked_tests_compare_on_the_default_device(inner):
    inner.makepyfile(test_plain="""
import os, torch
def test_plain():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.empty(int(os.environ.get("GROW", "100")) * 40960, dtype=torch.uint8, device=dev)
""")
    default = "cuda" if has_cuda() else "cpu"
    write(inner).assert_outcomes(passed=1)
    tests = entries(inner.path / "bl.json")
    assert tests[LANE]["test_plain.py::test_plain"][default]["peak"] == 4096000
    compare(inner).assert_outcomes(passed=1)
    compare(inner, grow=150).assert_outcomes(failed=1)


@pytest.mark.parametrize("dev", DEVICES)
def test_a_tolerance_of_thirty_percent_passes_the_growth(inner, dev):
    suite(inner, dev)
    write(inner).assert_outcomes(passed=5)
    compare(inner, "--memlab-tolerance=30%", grow=125).assert_outcomes(passed=5)
    # and as an ini twin
    inner.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\nmemlab_tolerance = 30%\n")
    compare(inner, grow=125).assert_outcomes(passed=5)
    # an absolute tolerance: 2 MiB covers +1 MiB and +2 MiB
    compare(inner, "--memlab-tolerance=1%,2MiB", grow=125).assert_outcomes(passed=5)
    compare(inner, "--memlab-tolerance=1MiB", grow=125).assert_outcomes(passed=4, failed=1)


def test_improvements_are_reported_and_can_fail(inner):
    suite(inner)
    write(inner).assert_outcomes(passed=5)
    result = compare(inner, grow=50)
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([
        f"baseline bl.json [[]{LANE}[]]: 5 compared, 4 improved beyond the tolerance",
        "  improved (write the baseline again to keep it tight):",
        "    test_suite.py::test_steady [[]cpu[]] 4.0 MiB -> 2.0 MiB",
    ])
    result = compare(inner, "--memlab-fail-on-improvement", grow=50)
    result.assert_outcomes(passed=5, errors=4)   # the calls passed; the teardowns say the baseline is loose
    result.stdout.fnmatch_lines([
        "*cpu peak shrank from 4.0 MiB to 2.0 MiB (-50.0%), beyond the tolerance 2%,64KiB (baseline bl.json)",
        "*write it again with --memlab-update-baseline",
    ])


def test_new_tests_are_listed_and_stale_entries_pruned(inner):
    suite(inner, extra="\ndef test_gone():\n    torch.ones(10)\n")
    write(inner).assert_outcomes(passed=6)
    suite(inner, extra="\ndef test_new():\n    torch.ones(10)\n")
    result = compare(inner)
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines([
        f"baseline bl.json [[]{LANE}[]]: 5 compared, 1 new (not in the baseline), 1 stale entry",
        "  new, listed not failed (--memlab-update-baseline adds them):",
        "    test_suite.py::test_new",
        "  stale, tests the baseline has that no longer exist (--memlab-prune-baseline drops them):",
        "    test_suite.py::test_gone",
    ])
    # updating keeps the stale entry unless asked to prune
    result = write(inner)
    result.stdout.fnmatch_lines(["*6 tests written (1 new, * changed)", "  1 stale entry kept*"])
    assert "test_suite.py::test_gone" in entries(inner.path / "bl.json")[LANE]
    # an entry of a file this run did not collect is not stale; a deselected test still exists
    inner.makepyfile(test_other="def test_elsewhere():\n    pass\n")
    write(inner, "test_other.py").assert_outcomes(passed=1)
    result = write(inner, "--memlab-prune-baseline", "test_suite.py", "-k", "test_new")
    result.assert_outcomes(passed=1, deselected=5)
    result.stdout.fnmatch_lines(["*1 test written (0 new, * changed), 1 stale entry pruned", "  pruned:",
                                 "    test_suite.py::test_gone"])
    assert sorted(entries(inner.path / "bl.json")[LANE]) == sorted(
        NODEIDS + ["test_suite.py::test_new", "test_other.py::test_elsewhere"])
    # a file that is gone takes its entries with it
    (inner.path / "test_other.py").unlink()
    write(inner, "--memlab-prune-baseline").stdout.fnmatch_lines(["*1 stale entry pruned", "  pruned:",
                                                                  "    test_other.py::test_elsewhere"])


def test_a_failing_test_keeps_its_old_entry(inner):
    suite(inner, extra="\ndef test_flaky():\n    x = block(4 * MiB)\n    assert GROW == 100\n")
    write(inner).assert_outcomes(passed=6)
    os.environ["GROW"] = "300"
    try:
        result = write(inner)
    finally:
        del os.environ["GROW"]
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines([
        "*6 tests measured*", "*5 tests written (0 new, * changed)",
        "  not written, because they failed by their own doing or did not run:", "    test_suite.py::test_flaky",
    ])
    tests = entries(inner.path / "bl.json")[LANE]
    assert tests["test_suite.py::test_flaky"]["cpu"]["peak"] == 4 * 2**20
    assert tests["test_suite.py::test_steady"]["cpu"]["peak"] == 12 * 2**20


def test_a_budget_failure_still_writes_its_figures(inner):
    suite(inner, extra="\n@pytest.mark.cpu_memory(max='1MiB')\ndef test_over():\n    x = block(4 * MiB)\n")
    result = write(inner)
    result.assert_outcomes(passed=5, failed=1)
    assert entries(inner.path / "bl.json")[LANE]["test_suite.py::test_over"]["cpu"]["peak"] == 4 * 2**20


@pytest.mark.parametrize("content, what", [
    ('{"format": "pytest-memlab-baseline", "version": 7, "tests": {}}',
     "format version 7 is not known to this pytest-memlab, which reads version 1"),
    ('{"format": "pytest-memlab-baseline", "version": 1, "tests": {',
     "not valid JSON (Expecting property name enclosed in double quotes at line 1, column *)"),
    ('[1, 2]', "expected a JSON object at the top, found list"),
    ('{"format": "something-else", "version": 1}', "'format' is 'something-else'*not a pytest-memlab baseline"),
    ('{"format": "pytest-memlab-baseline", "version": 1, "environment": {"name": "cpu"}, '
     '"tests": {"t::a": {"cpu": {"peak": "big"}}}}',
     "test 't::a', device 'cpu': peak is 'big', expected bytes (a whole number >= 0) or null"),
])
@pytest.mark.parametrize("update", [False, True])
def test_a_broken_file_is_a_usage_error_and_left_untouched(inner, content, what, update):
    suite(inner)
    path = inner.path / "bl.json"
    path.write_text(content)
    result = write(inner) if update else compare(inner)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-memlab: baseline bl.json: {what}*; the file was left as it is*"])
    assert path.read_text() == content
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_missing_file_says_how_to_create_it(inner):
    suite(inner)
    result = compare(inner)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: pytest-memlab: the baseline bl.json does not exist. Write it first from a run whose figures "
        "are right: pytest --memlab-baseline=bl.json --memlab-update-baseline"])
    assert not (inner.path / "bl.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--memlab-update-baseline"], "--memlab-update-baseline needs the file to write: add --memlab-baseline=PATH"),
    (["--memlab-baseline=x.json", "--memlab-prune-baseline"], "--memlab-prune-baseline drops entries while it "
                                                             "writes the baseline: add --memlab-update-baseline"),
    (["--memlab-tolerance=5 parsecs"], "*tolerance '5 parsecs'*unknown unit 'parsecs'*"),
    (["--memlab-baseline-env=a b"], "*'a b' is not an environment name*"),
    (["--memlab-gpus-per-worker=0"], "*'0' must be at least 1*"),
])
def test_bad_baseline_options_are_usage_errors(inner, args, message):
    suite(inner)
    result = inner.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


def test_a_marker_with_a_bad_tolerance_is_a_collection_error(inner):
    inner.makepyfile(test_bad="import pytest\n@pytest.mark.cpu_memory(tolerance='lots')\ndef test_a(): pass\n")
    result = inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-update-baseline")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*test_bad.py::test_a: cpu_memory(tolerance='lots'): *"])


def test_a_different_environment_is_reported_and_compared(inner):
    suite(inner)
    write(inner).assert_outcomes(passed=5)
    path = inner.path / "bl.json"
    data = json.loads(path.read_text())
    data["environment"].update(torch="1.13.1", cuda="11.8")
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    result = compare(inner, grow=125)
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines([
        f"baseline bl.json [[]{LANE}[]] was measured elsewhere: torch 1.13.1 -> 2.*; CUDA 11.8 -> * "
        "(the comparisons ran all the same)"])


def test_one_file_holds_two_environments(inner):
    suite(inner)
    write(inner).assert_outcomes(passed=5)
    os.environ["GROW"] = "200"
    try:
        write(inner, "--memlab-baseline-env=big-lane").assert_outcomes(passed=5)
    finally:
        del os.environ["GROW"]
    tests = entries(inner.path / "bl.json")
    assert sorted(tests) == sorted(["big-lane", LANE])
    assert tests[LANE]["test_suite.py::test_steady"]["cpu"]["peak"] == 4 * 2**20
    assert tests["big-lane"]["test_suite.py::test_steady"]["cpu"]["peak"] == 8 * 2**20
    data = json.loads((inner.path / "bl.json").read_text())
    assert set(data) == {"environments", "format", "version"}
    # each lane compares with its own figures
    compare(inner).assert_outcomes(passed=5)
    compare(inner, "--memlab-baseline-env=big-lane", grow=200).assert_outcomes(passed=5)
    compare(inner, "--memlab-baseline-env=big-lane").assert_outcomes(passed=5)   # it shrank: reported only
    compare(inner, "--memlab-baseline-env=big-lane", "--memlab-fail-on-improvement").assert_outcomes(
        passed=5, errors=4)


def test_ini_twin_names_the_file_relative_to_the_rootdir(inner, monkeypatch):
    suite(inner)
    inner.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\nmemlab_baseline = base/bl.json\n"
                  "memlab_update_baseline = true\n")
    (inner.path / "base").mkdir()
    sub = inner.path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    result = inner.runpytest_inprocess(str(inner.path))
    result.assert_outcomes(passed=5)
    assert sorted(entries(inner.path / "base" / "bl.json")[LANE]) == NODEIDS


# -- more than one process --------------------------------------------------------
@pytest.mark.parametrize("dev, dist", [("cpu", ["-n", "2"]), ("cpu", ["-n", "auto"]),
                                       ("cpu", ["-n", "2", "--dist", "loadgroup"]),
                                       pytest.param("cuda", ["-n", "2"], marks=DEVICES[1].marks)])
def test_xdist_workers_write_every_entry(inner, dev, dist):
    suite(inner, dev)
    result = inner.runpytest_subprocess("--memlab-baseline=bl.json", "--memlab-update-baseline",
                                        "--junitxml=junit.xml", *dist)
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([f"baseline bl.json [[]{LANE}[]] updated: 5 tests written (5 new, 0 changed)"])
    assert sorted(entries(inner.path / "bl.json")[LANE]) == NODEIDS
    junit = (inner.path / "junit.xml").read_text()
    name = "cpu" if dev == "cpu" else "cuda:0"
    assert junit.count(f'name="memlab.{name}.peak"') == 5   # figures reach junit from the workers

    result = compare(inner, "-n", "2", grow=125, subprocess=True)
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines([f"*{name} peak grew from 4.0 MiB to 5.0 MiB (+25.0%)*(baseline bl.json)*"])
    result.stdout.fnmatch_lines([f"baseline bl.json [[]{LANE}[]]: 5 compared, 3 regressed"])


def test_xdist_broken_file_reads_the_same(inner):
    suite(inner)
    (inner.path / "bl.json").write_text("{")
    result = inner.runpytest_subprocess("--memlab-baseline=bl.json", "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-memlab: baseline bl.json: not valid JSON*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize("dev", DEVICES)
def test_shards_merge_into_one_baseline(inner, dev):
    suite(inner, dev)
    # one job per slice of the suite, each writing its own file
    for n, selection in enumerate(["test_param", "not test_param"]):
        inner.runpytest_inprocess(f"--memlab-baseline=shard-{n}.json", "--memlab-update-baseline",
                                  "-k", selection)
    assert len(entries(inner.path / "shard-0.json")[LANE]) == 2
    assert len(entries(inner.path / "shard-1.json")[LANE]) == 3
    out = subprocess.run([sys.executable, "-m", "pytest_memlab", "merge", "bl.json", "shard-0.json",
                          "shard-1.json"], cwd=inner.path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"pytest-memlab merge: 2 files into bl.json ({LANE}: 5 tests)"
    assert sorted(entries(inner.path / "bl.json")[LANE]) == NODEIDS
    compare(inner).assert_outcomes(passed=5)
    compare(inner, grow=125).assert_outcomes(passed=2, failed=3)
    # a broken input: nothing written
    before = (inner.path / "bl.json").read_text()
    (inner.path / "shard-1.json").write_text("nonsense")
    out = subprocess.run([sys.executable, "-m", "pytest_memlab", "merge", "bl.json", "shard-0.json",
                          "shard-1.json"], cwd=inner.path, capture_output=True, text=True)
    assert out.returncode == 2
    assert "baseline shard-1.json: not valid JSON" in out.stderr and "bl.json was not written" in out.stderr
    assert (inner.path / "bl.json").read_text() == before


UPDATE_MANY = """
import sys
from pytest_memlab.judging.baseline_file import update
path, worker = sys.argv[1], sys.argv[2]
for i in range(25):
    update(path, "cpu", {"python": "x"}, {f"t.py::test_{worker}_{i}": {"cpu": {"peak": i, "leaked": 0}}})
"""


def test_two_processes_updating_one_file_lose_nothing(tmp_path):
    path = tmp_path / "bl.json"
    procs = [subprocess.Popen([sys.executable, "-c", UPDATE_MANY, str(path), str(w)]) for w in range(2)]
    for p in procs:
        assert p.wait(120) == 0
    tests = entries(path)["cpu"]
    assert len(tests) == 50
    assert tests["t.py::test_1_24"]["cpu"]["peak"] == 24
    assert sorted(os.listdir(tmp_path)) == [".bl.json.lock", "bl.json"]   # no temporary file left


def test_an_interrupted_run_leaves_the_file_whole(inner):
    suite(inner)
    write(inner).assert_outcomes(passed=5)
    before = (inner.path / "bl.json").read_text()
    inner.makepyfile(test_stop="def test_stop():\n    raise KeyboardInterrupt\n")
    result = inner.runpytest_subprocess("--memlab-baseline=bl.json", "--memlab-update-baseline", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    data = json.loads((inner.path / "bl.json").read_text())   # whole: it parses
    assert sorted(data["tests"]) == NODEIDS
    assert (inner.path / "bl.json").read_text() == before     # the figures did not change


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    from pytest_memlab import atomic_files

    path = tmp_path / "bl.json"
    path.write_text("old\n")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(atomic_files.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        atomic_files.write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["bl.json"]


def test_the_ci_example_uses_only_real_options(pytester):
    """ci/examples/memlab-gpu.yml: every memlab option it writes exists."""
    import re
    from pathlib import Path

    workflow = (Path(__file__).parent.parent / "ci" / "examples" / "memlab-gpu.yml").read_text()
    used = set(re.findall(r"--memlab[a-z-]*", workflow))
    assert {"--memlab-baseline", "--memlab-update-baseline", "--memlab-gpus-per-worker"} <= used
    helped = pytester.runpytest_subprocess("--help").stdout.str()
    assert not [flag for flag in used if flag not in helped]
    assert "python -m pytest_memlab merge memlab-baseline.json shard-*.json" in workflow


def test_what_counts_as_another_environment():
    from pytest_memlab.judging.baseline_file import environment_differences

    old = {"device": "NVIDIA A100-SXM4-40GB", "torch": "2.11.0", "cuda": "12.8", "python": "3.12.3"}
    assert environment_differences(old, {**old, "torch": "2.11.1", "python": "3.12.9"}) == []   # patch releases
    assert environment_differences(old, {**old, "device": "NVIDIA H100 80GB HBM3"}) == [
        "device NVIDIA A100-SXM4-40GB -> NVIDIA H100 80GB HBM3"]
    assert environment_differences(old, {**old, "device": "cpu"}) == []   # no GPU figured in this run
    assert environment_differences(old, {**old, "torch": "2.12.0", "cuda": "13.0"}) == [
        "torch 2.11.0 -> 2.12.0", "CUDA 12.8 -> 13.0"]


def test_a_run_that_never_started_cuda_keeps_the_lanes_gpu_name(tmp_path):
    from pytest_memlab.judging.baseline_file import update

    path = tmp_path / "bl.json"
    gpu = {"device": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "python": "3.12.3"}
    update(path, "cuda", gpu, {"t.py::a": {"cuda": {"peak": 1}}})
    update(path, "cuda", {**gpu, "device": "cpu"}, {"t.py::b": {"cpu": {"peak": 2}}})
    data = json.loads(path.read_text())
    assert data["environment"]["device"] == "NVIDIA H200" and sorted(data["tests"]) == ["t.py::a", "t.py::b"]
    before = path.read_text()
    update(path, "cuda", {**gpu, "torch": "2.12.0"}, {})     # nothing to write: the file stays as it was
    assert path.read_text() == before


def test_a_test_skipped_at_setup_is_not_written(pytester):
    """A skipif mark skips a test at its setup, with no call: it is
    reported skipped and keeps no baseline entry (it measured nothing)."""
    pytester.makepyfile(test_skips="""
import pytest, torch

@pytest.mark.skipif(True, reason="not here")
def test_skipped():
    torch.empty(1024)

def test_runs():
    x = torch.empty(1 << 20, dtype=torch.uint8)
""")
    result = pytester.runpytest_inprocess("--memlab", "-p", "no:randomly", "--memlab-baseline=bl.json",
                                          "--memlab-update-baseline", "--memlab-json=r.json")
    result.assert_outcomes(passed=1, skipped=1)
    tests = json.loads(pytester.path.joinpath("bl.json").read_text())["tests"]
    assert list(tests) == ["test_skips.py::test_runs"]
    outcomes = {t["nodeid"]: t["outcome"] for t in json.loads(pytester.path.joinpath("r.json").read_text())["tests"]}
    assert outcomes.get("test_skips.py::test_skipped", "skipped") == "skipped"
