"""pytest-memlab and pytest-cov measuring the same test: on Python 3.12+
both work (sys.monitoring beside coverage's tracer); before 3.12 memlab must
not silently take coverage's trace function: it steps aside and says so."""

import sys

import pytest

from conftest import line_no, requires_torch

pytestmark = requires_torch


def test_both_tools_measure_the_same_test(inner):
    pytest.importorskip("pytest_cov")
    lib = inner.makepyfile(mylib="""
import torch

def make(n):
    return torch.empty(n, dtype=torch.uint8)
""")
    test = inner.makepyfile(test_cov="""
import pytest
from mylib import make
MiB = 2**20

@pytest.mark.cpu_memory(max="1MiB")
def test_x():
    a = make(2 * MiB)
""")
    result = inner.runpytest_subprocess("-v", "--cov=mylib", "--cov-report=term-missing")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["cpu peak 2.0 MiB exceeds max 1.0 MiB by 1.0 MiB", "mylib.py * 100%*"])
    if sys.version_info >= (3, 12):
        result.stdout.fnmatch_lines([
            f"  peak reached in mylib.py:{line_no(lib, 'return torch.empty')} make: "
            "return torch.empty(n, dtype=torch.uint8)",
            f"*<- test_cov.py:{line_no(test, 'a = make')} test_x: a = make(2 * MiB)",
        ])
    else:
        result.stdout.fnmatch_lines([
            "(line attribution: another trace function is active (coverage.*; coverage or a debugger?)*",
            "line attribution off: another trace function is active (coverage*",
        ])
        assert "peak reached in" not in result.stdout.str()


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring's tool ids: Python 3.12+")
def test_other_tools_on_both_free_ids_turn_line_attribution_off_not_the_session(inner):
    """memlab takes sys.monitoring's id 4, else 3 (the profiler's and the
    debugger's stay free); where other tools hold both, budgets still judge
    and the summary says why lines are missing."""
    inner.makeconftest("""
import sys
sys.monitoring.use_tool_id(4, "tool four")
sys.monitoring.use_tool_id(3, "tool three")
""")
    inner.makepyfile(test_t="""
import pytest, torch

@pytest.mark.cpu_memory(max="1M")
def test_over():
    x = torch.ones(1 << 19)

def test_ok():
    x = torch.ones(10)
""")
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*cpu peak 2.0 MiB exceeds max 1.0 MiB by 1.0 MiB*",
        "line attribution off: sys.monitoring's tool ids 4 and 3 are taken by other tools (tool four, tool three)*",
    ])
