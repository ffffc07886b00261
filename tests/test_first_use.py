"""First use: memory a test allocates once for the whole process (a module
cache filled by whichever test needs it first, a constant built lazily)
is its own figure, left out of the compared peak and the budgets, so that
a test's figures do not depend on what ran before it: a baseline written
in one order compares clean in any other (reversed, pytest-randomly's
seeds, a subset, pytest-xdist), while a real growth of one line still
fails and names that line first.  Real torch allocations on the CPU."""

import json
import os
from pathlib import Path

import pytest

from conftest import device_figures, requires_torch

pytestmark = requires_torch

MiB = 2**20

SUITE = """
import os
import pytest, torch

MiB = 2**20
GROW = int(os.environ.get("GROW", "0"))
_TABLES = {}        # a module cache: filled by whichever test needs it first
_CONSTANT = None    # a constant built on first use

def table(n):
    t = _TABLES.get(n)
    if t is None:
        t = _TABLES[n] = torch.ones(n * MiB, dtype=torch.uint8)
    return t

def constant():
    global _CONSTANT
    if _CONSTANT is None:
        _CONSTANT = torch.zeros(3 * MiB, dtype=torch.uint8)
    return _CONSTANT

@pytest.fixture
def batch():
    return torch.empty(2 * MiB, dtype=torch.uint8)

@pytest.mark.parametrize("i", range(4))
def test_uses_the_table(i):
    x = torch.empty((i + 1) * MiB, dtype=torch.uint8)
    y = x + table(6)[: x.numel()]
    del x, y

def test_uses_both(batch):
    y = batch + constant()[: batch.numel()]
    z = table(6)[:MiB].clone()
    del y, z

def test_grows():
    a = torch.empty(4 * MiB, dtype=torch.uint8)
    b = torch.empty(1 * MiB + GROW, dtype=torch.uint8)
    del a, b

def test_builds_the_constant():
    c = constant()
    x = torch.empty(MiB, dtype=torch.uint8)
    del x
"""

REVERSE = """
import os
def pytest_collection_modifyitems(items):
    if os.environ.get("MEMLAB_TEST_REVERSE"):
        items.reverse()
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeconftest(REVERSE)
    monkeypatch.delenv("GROW", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")   # --memlab measures the CPU: no CUDA in these runs
    return pytester


def test_first_use_is_its_own_figure_and_left_out_of_the_peak(suite):
    result = suite.runpytest_subprocess("--memlab", "-p", "no:randomly", "--memlab-json=r.json")
    result.assert_outcomes(passed=7)
    r = device_figures(suite)
    first = r["test_uses_the_table[0]"]      # the first to need the table: fills it
    assert first["first_use"] == 6 * MiB
    assert first["kept"] == 6 * MiB
    assert first["peak_with_kept"] == 6 * MiB + 2 * MiB   # the table, then x and y at once
    assert first["peak"] == 2 * MiB                       # x and y: what the test needs while it runs
    assert first["leaked"] == 0
    assert first["first_use_held"] == ["6.0 MiB held by module test_suite, global _TABLES"]
    later = r["test_uses_the_table[1]"]
    assert later["first_use"] == 0 and later["kept"] == 0
    assert later["peak"] == later["peak_with_kept"] == 4 * MiB
    both = r["test_uses_both"]                # builds the constant: 3 MiB; the fixture's 2 MiB counts
    assert both["first_use"] == 3 * MiB
    assert both["peak"] == 2 * MiB + 2 * MiB + MiB        # batch, y, z at once
    assert [s["text"] for s in both["sites"]][:1] == ["return torch.empty(2 * MiB, dtype=torch.uint8)"] or \
        both["sites"][0]["bytes"] == 2 * MiB
    assert r["test_builds_the_constant"]["first_use"] == 0   # built already
    assert r["test_builds_the_constant"]["peak"] == MiB
    # the cache is still reported once, by the test that filled it
    result.stdout.fnmatch_lines(["cpu cache: 6.0 MiB kept by module test_suite, global _TABLES, "
                                 "filled by test_suite.py::test_uses_the_table[[]0[]]*"])


def _has_randomly():
    try:
        import pytest_randomly  # noqa: F401
    except ImportError:
        return False
    return True


RANDOMLY = pytest.mark.skipif(not _has_randomly(), reason="needs pytest-randomly")


@pytest.mark.xdist_group("first-use-orders")   # one worker writes the baseline once
@pytest.mark.parametrize("order", [
    ["-p", "no:randomly"],                                   # reversed (MEMLAB_TEST_REVERSE)
    pytest.param(["-p", "randomly", "--randomly-seed=1"], marks=RANDOMLY),
    pytest.param(["-p", "randomly", "--randomly-seed=2"], marks=RANDOMLY),
    pytest.param(["-p", "randomly", "--randomly-seed=3"], marks=RANDOMLY),
    ["-p", "no:randomly", "-n", "2"],
    ["-p", "no:randomly", "-k", "grows or constant or both"],   # a subset
])
def test_a_baseline_written_in_one_order_compares_clean_in_another(suite, monkeypatch, order, made_once):
    def write():   # serially in file order: once a session, each order given its copy
        suite.runpytest_subprocess("--memlab-baseline=bl.json", "--memlab-update-baseline",
                                   "-p", "no:randomly").assert_outcomes(passed=7)

    made_once("first-use-baseline", suite.path, ("bl.json",), write)
    baseline = json.loads(suite.path.joinpath("bl.json").read_text())
    entry = baseline["tests"]["test_suite.py::test_uses_the_table[0]"]["cpu"]
    assert entry["peak"] == 2 * MiB and entry["first_use"] == 6 * MiB
    monkeypatch.setenv("MEMLAB_TEST_REVERSE", "1")
    args = order
    result = suite.runpytest_subprocess("--memlab-baseline=bl.json", "--memlab-json=r.json", *args)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert "regressed" not in result.stdout.str()
    for name, d in device_figures(suite).items():
        assert d["baseline"] == "same", (name, d)
    # and a real growth of one line still fails, naming that line first
    monkeypatch.setenv("GROW", str(3 * MiB))
    grown = suite.runpytest_subprocess("--memlab-baseline=bl.json", *args)
    grown.assert_outcomes(failed=1, passed=outcomes["passed"] - 1)
    grown.stdout.fnmatch_lines([
        "cpu peak grew from 5.0 MiB to 8.0 MiB (+60.0%), over the tolerance 2%,64KiB (baseline bl.json)",
        "  what changed at the peak, by the line that changed (against the baseline):",
        "       +3.0 MiB  test_suite.py test_grows: b = torch.empty(1 * MiB + GROW, dtype=torch.uint8)  "
        "(1.0 MiB -> 4.0 MiB)",
        "  peak reached in test_suite.py:* test_grows: b = torch.empty(1 * MiB + GROW, dtype=torch.uint8)",
    ])


def test_budgets_judge_the_peak_without_first_use_unless_asked(suite):
    suite.makepyfile(test_budgets="""
import pytest, torch
MiB = 2**20
_CACHE = {}

@pytest.mark.cpu_memory(max="5M", leaks=None)
def test_fills_a_cache():
    _CACHE["k"] = torch.ones(8 * MiB, dtype=torch.uint8)
    x = torch.empty(4 * MiB, dtype=torch.uint8)

@pytest.mark.cpu_memory(max="5M", leaks=None, include_first_use=True)
def test_fills_another_counting_it():
    _CACHE["j"] = torch.ones(8 * MiB, dtype=torch.uint8)
    x = torch.empty(4 * MiB, dtype=torch.uint8)

@pytest.mark.cpu_memory(max="5M")
def test_over_without_any_first_use():
    x = torch.empty(6 * MiB, dtype=torch.uint8)

@pytest.mark.cpu_memory(include_first_use="yes")
def test_bad():
    pass
""")
    result = suite.runpytest_subprocess("test_budgets.py", "-p", "no:randomly")
    assert result.ret == 2
    result.stdout.fnmatch_lines(["*test_bad*include_first_use='yes'*expected True or False*"])
    suite.path.joinpath("test_budgets.py").write_text(
        suite.path.joinpath("test_budgets.py").read_text().split("@pytest.mark.cpu_memory(include_first_use")[0])
    result = suite.runpytest_subprocess("test_budgets.py", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_fills_another_counting_it _*",
        "cpu peak with first use 12.0 MiB exceeds max 5.0 MiB by 7.0 MiB",
        "*_ test_over_without_any_first_use _*",
        "cpu peak 6.0 MiB exceeds max 5.0 MiB by 1.0 MiB",
    ])


CUDA_SUITE = """
import pytest, torch

def test_first_matmul():
    a = torch.ones(256, 256, device="cuda")
    b = a @ a
    torch.cuda.synchronize()
    del a, b

def test_second_matmul():
    a = torch.ones(512, 512, device="cuda")
    b = a @ a
    torch.cuda.synchronize()
    del a, b

def test_conv():
    x = torch.ones(8, 16, 64, 64, device="cuda")
    w = torch.ones(32, 16, 3, 3, device="cuda")
    y = torch.nn.functional.conv2d(x, w, padding=1)
    torch.cuda.synchronize()
    del x, w, y

def test_conv_backward():
    x = torch.ones(8, 16, 32, 32, device="cuda", requires_grad=True)
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda()
    conv(x).sum().backward()
    torch.cuda.synchronize()
"""


def _cuda_available():
    from conftest import has_cuda

    return has_cuda()


@pytest.mark.skipif(not _cuda_available(), reason="needs CUDA")
def test_cuda_library_first_use_is_left_out_and_named(pytester, monkeypatch):
    """cuBLAS's workspace, allocated by the first matmul of the process and
    kept for it, and cuDNN's first convolutions: a baseline written in one
    order compares clean in reverse; the workspace is the first test's
    first use, named cuBLAS's, of the size torch chose for it."""
    import torch

    pytester.makepyfile(test_cuda_suite=CUDA_SUITE)
    pytester.makeconftest(REVERSE)
    write = pytester.runpytest_subprocess("--memlab", "-p", "no:randomly", "--memlab-baseline=bl.json",
                                          "--memlab-update-baseline", "--memlab-json=w.json")
    write.assert_outcomes(passed=4)
    w = device_figures(pytester, "w.json", "cuda:0")
    print(json.dumps(w, indent=1))
    first = w["test_first_matmul"]
    size = getattr(torch._C, "_cuda_getCublasWorkspaceSize", lambda: 0)()
    # unmarked (--memlab): the leak check tells first use at the session's
    # end, where a block no tensor owns may have been freed unheard: the
    # allocator's snapshot says the workspace is still allocated
    assert first["kept"] == (size or 32 * 2**20) and first["leaked"] == 0
    assert first["first_use"] == first["kept"], first
    assert any("cuBLAS" in h or "outside Python" in h for h in first["first_use_held"]), first
    assert first["peak"] == first["peak_with_kept"] - first["kept"] or first["peak"] < first["peak_with_kept"]
    assert first["peak"] == 2 * 256 * 256 * 4     # a and b: the workspace is not the test's
    assert w["test_second_matmul"]["first_use"] == 0
    assert w["test_second_matmul"]["peak"] == 2 * 512 * 512 * 4
    monkeypatch.setenv("MEMLAB_TEST_REVERSE", "1")
    compare = pytester.runpytest_subprocess("--memlab", "-p", "no:randomly", "--memlab-baseline=bl.json",
                                            "--memlab-json=r.json")
    compare.assert_outcomes(passed=4)
    r = device_figures(pytester, "r.json", "cuda:0")
    print(json.dumps(r, indent=1))
    if os.environ.get("OUT"):   # ci/gpu: the figures come back with the logs
        Path(os.environ["OUT"], "first_use_cuda.json").write_text(json.dumps({"written": w, "reversed": r,
                                                                             "cublas_workspace": size}, indent=1))
    assert {n: d["baseline"] for n, d in r.items()} == {n: "same" for n in r}
    assert r["test_first_matmul"]["peak"] == first["peak"]
    # reversed, the workspace is the other matmul's first use
    assert r["test_second_matmul"]["first_use"] == first["kept"] and r["test_first_matmul"]["first_use"] == 0
