"""A measured test that runs out of memory: memlab's section in its own
failure (the request, its line, this test's live bytes, what an earlier
test left and who holds it), the reports' record, outcomes as unmeasured.
On CPU tensors: torch raises at once for a request the machine cannot
serve.  The CUDA cases are in tests/test_out_of_memory_cuda.py."""

from __future__ import annotations

import json

import pytest

from conftest import cuda_count, requires_torch

pytestmark = requires_torch

MiB = 2**20

SUITE = """
import pytest, torch
MiB = 2**20
_KEEP = []
MARK

def test_a_leaves_8mib():
    _KEEP.append(torch.ones(8 * MiB, dtype=torch.uint8))

def test_b_asks_for_more_than_the_machine_has():
    mine = torch.ones(3 * MiB, dtype=torch.uint8)
    huge = torch.empty(1 << 50, dtype=torch.uint8)

def test_c_catches_it():
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        torch.empty(1 << 50, dtype=torch.uint8)

def test_d_plain():
    x = torch.ones(MiB, dtype=torch.uint8)
"""


UNMARKED = SUITE.replace("MARK", "")
MARKED = SUITE.replace("MARK", "pytestmark = pytest.mark.cpu_memory   # the CPU, also where there is CUDA")


@pytest.mark.parametrize("marked", [False, True], ids=["unmarked", "marked"])
def test_the_failure_says_what_held_the_memory_and_which_earlier_test_left_it(inner, marked):
    """Unmarked, the leak of the first test is a warning at the end (on a
    machine without CUDA, where unmarked tests measure the CPU); marked,
    it fails that test at its teardown.  Either way the next test's
    out-of-memory names it, with its holder."""
    if not marked and cuda_count() > 0:
        pytest.skip("unmarked tests measure CUDA here: the marked case covers the CPU")
    inner.makepyfile(test_oom=MARKED if marked else UNMARKED)
    unmeasured = inner.runpytest_subprocess("-p", "no:randomly", "-p", "no:memlab")
    unmeasured.assert_outcomes(passed=3, failed=1)
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab", "--memlab-json=r.json")
    # the test keeps its own failure; a marked test's leak is memlab's verdict, as always
    result.assert_outcomes(passed=3, failed=1, errors=int(marked))
    result.stdout.fnmatch_lines([
        "E       RuntimeError: *can't allocate memory*",   # torch's error, as it was
        "*- memlab: out of memory -*",
        "memlab: cpu ran out of memory: 1024.00 TiB requested",
        "  asked at test_oom.py:11 test_b_asks_for_more_than_the_machine_has: huge = torch.empty(1 << 50, *",
        "  the machine when the failure was reported: allocated 11.0 MiB (tensors memlab heard), free *, capacity *",
        "  who held the 11.0 MiB allocated, largest first:",
        "     8.0 MiB  73%  left by test_oom.py::test_a_leaves_8mib (held by: module test_oom, global _KEEP[0])",
        "                        8.0 MiB allocated at test_oom.py:7 test_a_leaves_8mib: _KEEP.append(*",
        "     3.0 MiB  27%  this test: test_oom.py:10 test_b_asks_for_more_than_the_machine_has: mine = *",
    ])
    data = json.loads((inner.path / "r.json").read_text())
    from test_reports import validate

    validate(data)
    tests = {t["nodeid"].split("::")[1]: t for t in data["tests"]}
    [oom] = tests["test_b_asks_for_more_than_the_machine_has"]["out_of_memory"]
    assert (oom["device"], oom["request"], oom["caught"], oom["phase"]) == ("cpu", 1 << 50, False, None)
    assert oom["line"][0] == {"file": "test_oom.py", "line": 11, "function": "test_b_asks_for_more_than_the_machine_has"}
    assert oom["allocated"] == 11 * MiB
    assert [(h["kind"], h["bytes"]) for h in oom["holders"]] == [("earlier test", 8 * MiB), ("own", 3 * MiB)]
    assert oom["holders"][0]["test"] == "test_oom.py::test_a_leaves_8mib"
    assert oom["holders"][0]["held_by"] == ["module test_oom, global _KEEP[0]"]
    assert oom["holders"][1]["line"][0]["line"] == 10
    # memlab's section is the test's failure's, never its verdict
    assert tests["test_b_asks_for_more_than_the_machine_has"]["failed_by_memlab"] == []
    # the earlier test's leak is still judged as before
    key = "failed_by_memlab" if marked else "warned"
    assert tests["test_a_leaves_8mib"][key] == ["cpu leaks"]
    assert "out_of_memory" not in tests["test_d_plain"]
    # the one the test caught: memlab's allocator heard it before torch raised
    [caught] = tests["test_c_catches_it"]["out_of_memory"]
    assert (caught["caught"], caught["request"], caught["device"]) == (True, 1 << 50, "cpu")
    assert caught["line"][0] == {"file": "test_oom.py", "line": 15, "function": "test_c_catches_it"}
    assert tests["test_c_catches_it"]["outcome"] == "passed"
    assert oom["text"].startswith("memlab: cpu ran out of memory: 1024.00 TiB requested\n  asked at test_oom.py:11")
    # the timeline of the failed test marks the point; the HTML report shows the section
    marks = tests["test_b_asks_for_more_than_the_machine_has"]["devices"]["cpu"]["detail"]["marks"]
    assert [m["label"] for m in marks if m["kind"] == "oom"] == ["out of memory: 1024.00 TiB"]
    page = inner.runpytest_subprocess("-p", "no:randomly", "--memlab", "--memlab-html=r.html")
    html = (inner.path / "r.html").read_text()
    assert "m.kind === 'oom'" in html and "out of memory: 1024.00 TiB" in html


def test_a_device_the_test_does_not_measure_is_named_as_such(inner):
    """On a machine with CUDA an unmarked test measures CUDA: a CPU
    out-of-memory in it says that memlab did not measure the CPU there,
    never "0 B allocated"."""
    inner.makepyfile(test_unmeasured_cpu="""
import pytest, torch

@pytest.mark.cuda_memory
def test_cpu_request():
    huge = torch.empty(1 << 50, dtype=torch.uint8)
""")
    result = inner.runpytest_subprocess("--memlab")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "memlab: cpu ran out of memory: 1024.00 TiB requested",
        "  asked at test_unmeasured_cpu.py:5 test_cpu_request: huge = *",
        "  (this test does not measure cpu: mark it cpu_memory to see who held it)",
    ])
    assert "largest first" not in result.stdout.str()


def test_a_test_that_fails_otherwise_gets_no_section(inner):
    inner.makepyfile(test_plain="""
import torch
def test_fails():
    x = torch.ones(1024)
    raise RuntimeError("not memory")
""")
    result = inner.runpytest_subprocess("--memlab")
    result.assert_outcomes(failed=1)
    assert "out of memory" not in result.stdout.str()


def test_an_out_of_memory_under_xdist_is_explained_in_the_workers_failure(inner):
    pytest.importorskip("xdist")
    inner.makepyfile(test_oom=MARKED)
    result = inner.runpytest_subprocess("-p", "no:randomly", "-n", "2", "--dist", "loadfile", "--memlab",
                                        "--memlab-json=r.json")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    result.stdout.fnmatch_lines(["memlab: cpu ran out of memory: 1024.00 TiB requested",
                                 "     8.0 MiB  73%  left by test_oom.py::test_a_leaves_8mib *"])
    data = json.loads((inner.path / "r.json").read_text())
    [oom] = next(t for t in data["tests"] if t["nodeid"].endswith("machine_has"))["out_of_memory"]
    assert oom["request"] == 1 << 50



RANKS = """
import pytest, torch
import torch.multiprocessing as tmp
MiB = 2**20
pytestmark = pytest.mark.cpu_memory

def work(rank):
    x = torch.ones(2 * MiB, dtype=torch.uint8)
    if rank == 1:
        y = torch.empty(1 << 50, dtype=torch.uint8)

def test_ranks():
    tmp.spawn(work, nprocs=2)
"""


def test_a_rank_that_runs_out_of_memory_names_itself_in_the_tests_failure(inner):
    """The rank's own allocator heard the request its process could not
    get: the test's failure (torch's ProcessRaisedException) gets the
    rank's section, with the line that asked and what the rank held."""
    inner.makepyfile(test_kids=RANKS)
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab", "--memlab-json=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*- memlab: out of memory in rank 1 (pid *) -*",
        "memlab: cpu ran out of memory: 1024.00 TiB requested",
        "  asked at test_kids.py:9 work: y = torch.empty(1 << 50, dtype=torch.uint8)",
        # on the CPU a child's figures are taken as it ends: its tensors are gone by then
        "  the machine when the process ended: allocated 0 B (tensors memlab heard), free *, capacity *",
        "  nothing memlab measured was allocated then",
    ])
    assert "out of memory in rank 0" not in result.stdout.str()
    test = json.loads((inner.path / "r.json").read_text())["tests"][0]
    [rank1] = [p for p in test["processes"] if p["label"] == "rank 1"]
    [oom] = rank1["out_of_memory"]
    assert (oom["device"], oom["request"]) == ("cpu", 1 << 50)
    from test_reports import validate

    validate(json.loads((inner.path / "r.json").read_text()))
