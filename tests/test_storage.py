"""The storage report (MemReporter, memory by kind, memlab.tensors()) on
CPU tensors, and pytorch_memlab's own tests of MemReporter and Courtesy
against this package imported under the old name."""

import os
import subprocess
import sys

import pytest

from conftest import requires_torch

pytestmark = requires_torch

UPSTREAM = os.path.join(os.path.dirname(__file__), "..", "fixtures", "upstream", "pytorch_memlab")


def _rows(report, device="cpu"):
    return {r.name: r for r in report.devices[device].rows}


def test_names_and_kinds_of_a_training_step():
    import torch

    from pytest_memlab import MemReporter

    torch.manual_seed(0)
    linear = torch.nn.Linear(1024, 1024)
    opt = torch.optim.Adam(linear.parameters())
    reporter = MemReporter(linear)
    inp = torch.randn(512, 1024)
    linear(inp).mean().backward()
    opt.step()
    reporter.add_optimizer(opt)
    report = reporter.collect("cpu")
    rows = _rows(report)
    w, b = 1024 * 1024 * 4, 1024 * 4
    assert rows["weight"].bytes == w and rows["weight"].kind == "parameters"
    assert rows["weight.grad"].bytes == w and rows["weight.grad"].kind == "gradients"
    assert rows["Adam.weight.exp_avg"].bytes == w and rows["Adam.weight.exp_avg_sq"].kind == "optimizer state"
    kinds = report.devices["cpu"].by_kind
    assert kinds["parameters"] >= w + b            # other Parameters of the process may add
    assert kinds["gradients"] >= w + b
    assert kinds["optimizer state"] == 2 * (w + b) + 2 * rows["Adam.weight.step"].bytes
    assert kinds["other tensors"] >= 512 * 1024 * 4   # inp
    text = report.text()
    assert "Memory by kind on cpu:" in text and "optimizer state" in text


def test_tied_weights_and_shared_storage_count_once():
    import torch

    from pytest_memlab import MemReporter

    a = torch.nn.Linear(256, 256, bias=False)
    b = torch.nn.Linear(256, 256, bias=False)
    b.weight = a.weight
    model = torch.nn.Sequential(a, b)
    view = model[0].weight.view(-1)
    report = MemReporter(model).collect("cpu")
    rows = _rows(report)
    assert rows["0.weight+1.weight"].bytes == 256 * 256 * 4
    shared = [r for r in report.devices["cpu"].rows if r.shares == "0.weight+1.weight"]
    assert shared and all(r.bytes == 0 for r in shared)
    assert "(->0.weight+1.weight)" in report.text(verbose=True)
    del view


def test_sparse_tensors_show_indices_and_values():
    import torch

    from pytest_memlab import MemReporter

    emb = torch.nn.Embedding(1024, 16, sparse=True)
    emb(torch.arange(0, 128)).mean().backward()
    rows = _rows(MemReporter(emb).collect("cpu"))
    assert rows["weight.grad.values"].bytes == 128 * 16 * 4
    assert rows["weight.grad.indices"].bytes == 128 * 8


def test_memlab_tensors_in_a_test(inner):
    inner.makepyfile(test_inner="""
import torch

def test_kinds(memlab):
    m = torch.nn.Linear(256, 256)
    m(torch.ones(4, 256)).sum().backward()
    report = memlab.tensors("cpu")
    kinds = report.devices["cpu"].by_kind
    assert kinds["gradients"] >= (256 * 256 + 256) * 4
    print(report.text())
""")
    result = inner.runpytest_inprocess("-s", "--memlab")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["Memory by kind on cpu:", "  gradients*"])


def test_pytorch_memlabs_own_tests_pass_under_the_old_name():
    """test/test_mem_reporter.py and test/test_courtesy.py of pytorch_memlab,
    unchanged (the Courtesy ones and two CUDA ones skip without CUDA)."""
    import torch

    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"],
                          cwd=UPSTREAM, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = "9 passed" if torch.cuda.is_available() else "5 passed, 4 skipped"
    assert expected in proc.stdout, proc.stdout
