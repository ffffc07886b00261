"""An out-of-memory on CUDA, explained (ci/gpu oom: these tests fill the
GPU, so they run alone, serially, where MEMLAB_OOM_TESTS=1).  Each inner
suite attaches an observer of its own beside memlab's, which writes
torch.cuda.memory_stats() at the error: memlab's figures must equal it to
the byte."""

from __future__ import annotations

import json
import os

import pytest

from conftest import requires_cuda

pytestmark = [requires_cuda, pytest.mark.skipif(os.environ.get("MEMLAB_OOM_TESTS") != "1",
                                                reason="fills the GPU: ci/gpu oom runs it alone")]

GiB = 2**30

CONFTEST = """
import json, os, torch, pytest
AT_ERROR = []

@pytest.fixture(autouse=True, scope="session")
def _witness():
    torch.cuda.init()
    def seen(device, alloc, reserved, free):
        s = torch.cuda.memory_stats(device)
        AT_ERROR.append({"device": device, "request": alloc, "allocated": s["allocated_bytes.all.current"],
                         "reserved": s["reserved_bytes.all.current"]})
    torch._C._cuda_attach_out_of_memory_observer(seen)
    yield
    with open("at_error.json", "w") as f:
        json.dump(AT_ERROR, f)
"""

SUITE = """
import pytest, torch
GiB = 2**30
_KEEP = []
CAP = torch.cuda.get_device_properties(0).total_memory

def test_a_asks_for_more_than_the_gpu():
    x = torch.empty(2 * CAP, dtype=torch.uint8, device="cuda")

def test_b_leaves_most_of_the_gpu():
    _KEEP.append(torch.empty(int(CAP * 0.6) // GiB * GiB, dtype=torch.uint8, device="cuda"))

def test_c_runs_out_because_of_b():
    mine = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
    more = torch.empty(int(CAP * 0.5) // GiB * GiB, dtype=torch.uint8, device="cuda")

def test_d_frees_b():
    _KEEP.clear()

class Greedy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        wasted = torch.empty(2 * CAP, dtype=torch.uint8, device="cuda")
        return grad * 2

def test_e_runs_out_in_backward():
    x = torch.ones(1024, device="cuda", requires_grad=True)
    loss = Greedy.apply(x).sum()
    loss.backward()

def test_f_fragmented():
    MiB = 2**20
    # requests of 1 to 10 MiB share segments of 20 MiB: three 6 MiB blocks
    # each, the middle one kept: every segment is 14 MiB free in two
    # pieces (6 and 8 MiB), and none can be given back
    blocks = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(300)]
    keep = blocks[1::3]
    del blocks
    filler = []
    for size in (GiB, 100 * MiB, 12 * MiB):   # the rest of the GPU, in blocks no piece can serve
        while True:
            try:
                filler.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                break
    # 9 MiB: no piece is that large, and a new 20 MiB segment does not fit
    more = torch.empty(9 * MiB, dtype=torch.uint8, device="cuda")

def test_g_catches_it():
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2 * CAP, dtype=torch.uint8, device="cuda")
"""


def test_each_out_of_memory_is_explained_with_the_allocators_figures_at_the_error(inner):
    inner.makeconftest(CONFTEST)
    inner.makepyfile(test_oom=SUITE)
    unmeasured = inner.runpytest_subprocess("-p", "no:randomly", "-p", "no:memlab")
    unmeasured.assert_outcomes(passed=3, failed=4)
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab", "--memlab-json=r.json")
    result.assert_outcomes(passed=3, failed=4)
    text = result.stdout.str()
    witness = json.loads((inner.path / "at_error.json").read_text())
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((inner.path / "r.json").read_text())["tests"]}
    failed = {name: t["out_of_memory"] for name, t in tests.items() if t.get("out_of_memory")}
    assert set(failed) == {"test_a_asks_for_more_than_the_gpu", "test_c_runs_out_because_of_b",
                           "test_e_runs_out_in_backward", "test_f_fragmented", "test_g_catches_it"}, failed.keys()

    def check(oom):
        """The figures equal the allocator's at the same error (the witness
        heard the same request: the same bytes, in the same order)."""
        seen = [(w["allocated"], w["reserved"]) for w in witness if w["request"] == oom["request"]]
        assert oom["at_error"] is True
        assert (oom["allocated"], oom["reserved"]) in seen, (oom, witness)
        assert oom["outside_pytorch"] == oom["capacity"] - oom["free"] - oom["reserved"]

    [a] = failed["test_a_asks_for_more_than_the_gpu"]
    check(a)
    assert a["line"][0]["function"] == "test_a_asks_for_more_than_the_gpu" and not a["caught"]

    [c] = failed["test_c_runs_out_because_of_b"]
    check(c)
    kinds = [(h["kind"], h.get("test")) for h in c["holders"]]
    assert kinds[0] == ("earlier test", "test_oom.py::test_b_leaves_most_of_the_gpu"), c["holders"]
    assert c["holders"][0]["held_by"] == ["module test_oom, global _KEEP[0]"]
    own = [h for h in c["holders"] if h["kind"] == "own"]
    assert own[0]["bytes"] == 4 * GiB and own[0]["line"][0]["function"] == "test_c_runs_out_because_of_b"
    assert sum(h["bytes"] for h in c["holders"]) == c["allocated"]
    assert "left by test_oom.py::test_b_leaves_most_of_the_gpu (held by: module test_oom, global _KEEP[0])" in text

    [e] = failed["test_e_runs_out_in_backward"]
    check(e)
    assert e["phase"] == "backward"
    assert any(f["function"].endswith("Greedy.backward") for f in e["line"]), e["line"]

    [f] = [x for x in failed["test_f_fragmented"] if not x["caught"]]
    assert len(failed["test_f_fragmented"]) == 4   # the three the filling caught, recorded as caught
    check(f)
    # the request is the block the caching allocator asked CUDA for, as
    # torch's message says it: a 20 MiB segment for the 9 MiB tensor
    assert f["reserved"] - f["allocated"] >= f["request"] == 20 * 2**20
    assert "expandable_segments" in text

    [g] = failed["test_g_catches_it"]
    assert g["caught"] and g["line"][0]["function"] == "test_g_catches_it"
    assert tests["test_g_catches_it"]["outcome"] == "passed"


RANKS = """
import torch, torch.multiprocessing as tmp
CAP = torch.cuda.get_device_properties(0).total_memory

def work(rank):
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    if rank == 1:
        y = torch.empty(2 * CAP, dtype=torch.uint8, device="cuda")

def test_ranks():
    tmp.spawn(work, nprocs=2)
"""


def test_a_rank_that_runs_out_of_memory_names_itself_in_the_tests_failure(inner):
    inner.makepyfile(test_kids=RANKS)
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab", "--memlab-json=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*- memlab: out of memory in rank 1 (pid *) -*",
        "memlab: cuda:0 ran out of memory: * requested",
        "  asked at test_kids.py:7 work: y = torch.empty(2 * CAP, dtype=torch.uint8, device=\"cuda\")",
        "  the device at the error: allocated 1.00 GiB, *",
        "  who held the 1.00 GiB allocated, largest first:",
        "    1.00 GiB 100%  this process: test_kids.py:5 work: x = torch.empty(*",
    ])
    assert "out of memory in rank 0" not in result.stdout.str()
    test = json.loads((inner.path / "r.json").read_text())["tests"][0]
    [rank1] = [p for p in test["processes"] if p["label"] == "rank 1"]
    [oom] = rank1["out_of_memory"]
    assert oom["device"] == "cuda:0" and oom["at_error"] and oom["allocated"] == 2**30
