"""What a newcomer reads in the terminal is what is true: the own peak with
what a test kept beside it, a regression named at the line that changed,
lists that say what they count, the backend in plain words, a use far over
budget as a ratio, and node ids cut in their path, not their name.  Each
test asserts the text a user sees, on real torch allocations."""

import json

import pytest

from conftest import MiB, line_no, requires_torch
from pytest_memlab.reports.terminal import cut_nodeid, failure_words, use_text

pytestmark = requires_torch

KEEPS = """
import pytest, torch
MiB = 2**20
_KEEP = []

@pytest.mark.cpu_memory(max="64 MiB", leaks=None)
def test_keeps_a_tensor():
    _KEEP.append(torch.empty(8 * MiB, dtype=torch.uint8))
"""


def summary_of(result) -> list[str]:
    return result.stdout.str().split("= memlab =")[1].splitlines()


def test_what_a_test_kept_is_said_beside_its_own_peak(inner):
    inner.makepyfile(test_keeps=KEEPS)
    result = inner.runpytest_inprocess("--memlab-report")
    result.assert_outcomes(passed=1)
    lines = summary_of(result)
    # one file: said once above the rows, the rows the tests' names
    assert "on cpu, in test_keeps.py:" in lines
    row = next(ln for ln in lines if ln.startswith("test_keeps_a_tensor "))
    # the own peak leaves out what the test kept; the cell says it
    assert row.split()[1:5] == ["0", "B", "(+8.0", "MiB"] and "(+8.0 MiB kept)" in row, row
    assert "test_keeps.py::test_keeps_a_tensor (cpu, own peak 0 B; 8.0 MiB kept past teardown, not in it)" in lines
    header = next(ln for ln in lines if ln.startswith("test "))
    assert header.split() == ["test", "own", "peak", "total", "peak", "max", "use"]


GROWS = """
import os
import pytest, torch
MiB = 2**20

def cpu_bytes(n):
    return torch.empty(n, dtype=torch.uint8)

@pytest.mark.cpu_memory
def test_grows():
    a = cpu_bytes(int(os.environ.get("FIRST", 24 * MiB)))
    if os.environ.get("SECOND"):
        b = cpu_bytes(8 * MiB)
        del b
    del a
"""


@pytest.fixture
def grows(inner, monkeypatch):
    inner.makepyfile(test_grow=GROWS)
    monkeypatch.delenv("FIRST", raising=False)
    monkeypatch.delenv("SECOND", raising=False)
    inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-update-baseline").assert_outcomes(passed=1)
    return inner


def test_a_regression_is_named_at_the_new_caller_line_with_the_helper_beneath(grows, monkeypatch):
    site = json.loads((grows.path / "bl.json").read_text())["tests"]["test_grow.py::test_grows"]["cpu"]["sites"]
    assert site == [{"bytes": 24 * MiB, "file": "test_grow.py", "function": "cpu_bytes",
                     "text": "return torch.empty(n, dtype=torch.uint8)",
                     "callers": [{"file": "test_grow.py", "function": "test_grows",
                                  "text": 'a = cpu_bytes(int(os.environ.get("FIRST", 24 * MiB)))'}]}]
    monkeypatch.setenv("SECOND", "1")
    result = grows.runpytest_inprocess("--memlab-baseline=bl.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "cpu peak grew from 24.0 MiB to 32.0 MiB (+33.3%), over the tolerance 2%,64KiB (baseline bl.json)",
        "  what changed at the peak, by the line that changed (against the baseline):",
        "       +8.0 MiB  test_grow.py test_grows: b = cpu_bytes(8 * MiB)  (new)",
        "                   -> test_grow.py cpu_bytes: return torch.empty(n, dtype=torch.uint8)",
        f"  peak reached in test_grow.py:{line_no(grows.path / 'test_grow.py', 'return torch.empty')} cpu_bytes*",
    ])


def test_a_grown_caller_line_leads_where_no_line_is_new(grows, monkeypatch):
    monkeypatch.setenv("FIRST", str(32 * MiB))
    result = grows.runpytest_inprocess("--memlab-baseline=bl.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "  what changed at the peak, by the line that changed (against the baseline):",
        '       +8.0 MiB  test_grow.py test_grows: a = cpu_bytes(int(os.environ.get("FIRST", 24 * MiB)))  '
        "(24.0 MiB -> 32.0 MiB)",
        "                   -> test_grow.py cpu_bytes: return torch.empty(n, dtype=torch.uint8)",
    ])


def test_a_baseline_without_callers_is_compared_line_by_line(grows, monkeypatch):
    """A baseline written before sites kept their callers: the allocating
    line is compared, as it was then."""
    path = grows.path / "bl.json"
    data = json.loads(path.read_text())
    for site in data["tests"]["test_grow.py::test_grows"]["cpu"]["sites"]:
        del site["callers"]
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    monkeypatch.setenv("SECOND", "1")
    result = grows.runpytest_inprocess("--memlab-baseline=bl.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "  what changed at the peak, by the line that changed (against the baseline):",
        "       +8.0 MiB  test_grow.py cpu_bytes: return torch.empty(n, dtype=torch.uint8)  (24.0 MiB -> 32.0 MiB)",
    ])


LOOPS = """
import pytest, torch
MiB = 2**20

@pytest.mark.cpu_memory
def test_loops():
    for _ in range(3):
        x = torch.empty(4 * MiB, dtype=torch.uint8)
        del x
"""


def test_the_heaviest_lines_say_they_count_bytes_allocated_not_held(inner):
    """12 MiB allocated by one line over the test, never more than 4 MiB
    held at once: the list says which it counts."""
    inner.makepyfile(test_loops=LOOPS)
    result = inner.runpytest_inprocess("--memlab-report")
    result.assert_outcomes(passed=1)
    n = line_no(inner.path / "test_loops.py", "x = torch.empty")
    result.stdout.fnmatch_lines([
        "the heaviest tests, by the lines that allocated most (allocated over the test, not held at once):",
        "test_loops.py::test_loops (cpu, own peak 4.0 MiB)",
        f"    12.0 MiB allocated by test_loops.py:{n} test_loops: x = torch.empty(4 * MiB, dtype=torch.uint8)",
    ])


def test_the_head_line_says_how_it_measured_in_plain_words(inner):
    import torch

    inner.makepyfile(test_loops=LOOPS)
    result = inner.runpytest_inprocess("--memlab-report", "-v")
    result.assert_outcomes(passed=1)
    version = torch.__version__.split("+")[0]
    assert f"1 test measured through torch's allocators (torch {version})" in summary_of(result)
    assert "memlab_bridge" not in result.stdout.str() and "backend" not in result.stdout.str()
    # the library's name: under -vv, and in the JSON report
    result = inner.runpytest_inprocess("--memlab-report=term,json:r.json", "-vv")
    result.stdout.fnmatch_lines(["backend: bridge: torch bridge memlab_bridge-*"])
    assert "memlab_bridge-" in json.loads((inner.path / "r.json").read_text())["backend"]


FAR_OVER = """
import pytest, torch
MiB = 2**20

@pytest.mark.cpu_memory(max="1M")
def test_far_over():
    x = torch.zeros(36 * MiB, dtype=torch.uint8)
"""


def test_a_use_far_over_budget_reads_as_a_ratio_and_an_unchanged_test_as_same(inner):
    inner.makepyfile(test_over=FAR_OVER)
    inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-update-baseline")
    result = inner.runpytest_inprocess("--memlab-report", "--memlab-baseline=bl.json")
    result.assert_outcomes(failed=1)
    assert "1 test failed by memlab (cpu over max); see above" in summary_of(result)
    row = next(ln for ln in summary_of(result) if ln.startswith("test_far_over "))
    assert row.split()[-2:] == ["36x", "same"], row


@pytest.mark.parametrize("peak, budget, text", [
    (MiB, 2 * MiB, "50%"), (MiB + MiB // 8, MiB, "113%"), (9 * MiB + MiB // 2, MiB, "950%"),
    (36 * MiB, MiB, "36x"), (MiB, None, "-"), (MiB, 0, "inf"),
])
def test_use_text(peak, budget, text):
    assert use_text(peak, budget) == text


def test_a_node_id_is_cut_in_its_path_and_keeps_its_name():
    nodeid = "tests/models/test_demo_budgets.py::test_grew_since_the_baseline"
    assert cut_nodeid(nodeid, len(nodeid)) == nodeid
    assert cut_nodeid(nodeid, 44) == "tests/model...::test_grew_since_the_baseline"
    assert len(cut_nodeid(nodeid, 44)) == 44
    # a name longer than the room: cut in its middle, both ends kept
    cut = cut_nodeid(nodeid, 20)
    assert len(cut) == 20 and cut.startswith("tests") and cut.endswith("baseline")


@pytest.mark.parametrize("key, words", [
    ("cpu max", "cpu over max"), ("cuda:0 baseline", "cuda:0 grew since the baseline"), ("cpu leaks", "cpu leaked"),
    ("cpu leak growth", "cpu grew at each repetition"), ("cuda:1 max [rank 1]", "cuda:1 over max [rank 1]"),
    ("cpu activations", "cpu over activations"), ("cuda:1 backward baseline [rank 1]",
                                                  "cuda:1 backward grew since the baseline [rank 1]"),
    ("cuda spread", "cuda over spread"),
])
def test_what_memlab_failed_a_test_for_reads_as_words(key, words):
    assert failure_words(key) == words


def test_rows_of_several_files_keep_their_files_and_one_file_is_said_once(inner):
    inner.makepyfile(test_one=LOOPS, test_two=LOOPS.replace("test_loops", "test_other_loops"))
    lines = summary_of(inner.runpytest_inprocess("--memlab-report"))
    assert "on cpu:" in lines
    assert any(ln.startswith("test_one.py::test_loops ") for ln in lines)
    assert any(ln.startswith("test_two.py::test_other_loops ") for ln in lines)
