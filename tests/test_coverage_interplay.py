"""pytest-memlab and pytest-cov measuring the same test: on Python 3.12+
both work (sys.monitoring beside coverage's tracer); before 3.12 memlab must
not silently take coverage's trace function: it steps aside and says so."""

import sys

import pytest

from conftest import requires_torch

pytestmark = requires_torch


def test_both_tools_measure_the_same_test(inner):
    pytest.importorskip("pytest_cov")
    inner.makepyfile(mylib="""
import torch

def make(n):
    return torch.empty(n, dtype=torch.uint8)
""")
    inner.makepyfile(test_cov="""
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
            "  peak reached in mylib.py:5 make: return torch.empty(n, dtype=torch.uint8)",
            "*<- test_cov.py:8 test_x: a = make(2 * MiB)",
        ])
    else:
        result.stdout.fnmatch_lines([
            "(line attribution: another trace function is active (coverage.*; coverage or a debugger?)*",
            "line attribution off: another trace function is active (coverage*",
        ])
        assert "peak reached in" not in result.stdout.str()
