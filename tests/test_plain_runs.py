"""Plain runs (measuring/plain_run.py): an unmarked test on the CPU alone
runs with the fewest steps, and becomes the general run when it needs more.
Every test's outcome, junit figures, warnings and summary are those of the
general path (``MEMLAB_PLAIN_RUNS=off``), test for test."""

import re
import xml.etree.ElementTree as ET

import pytest

from conftest import MiB, has_cuda, requires_torch

pytestmark = [requires_torch,
              pytest.mark.skipif(has_cuda(), reason="this machine has CUDA: unmarked tests measure it, never plain")]

# Counts the runs that ended plain (printed at the end): the comparison
# below would hold trivially if none did.
COUNT_PLAIN_ENDS = """
import pytest
from pytest_memlab.measuring import plain_run

ENDED = []
_end = plain_run.PlainRun.end

def _counting_end(self):
    ended = _end(self)
    if ended:
        ENDED.append(self.nodeid)
    return ended

plain_run.PlainRun.end = _counting_end

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    print(f"plain ends: {len(ENDED)}: {' '.join(sorted(ENDED))}")
"""

SUITE = """
import gc, os, subprocess, sys, warnings
import pytest, torch

_GROWS = []
_TABLE = {}

class Node:
    pass

@pytest.fixture(scope="module")
def weights():
    return torch.ones(4096)          # a broader fixture: measured apart

@pytest.fixture
def scratch():
    t = torch.zeros(1024)
    yield t
    del t

def test_first():   # what torch keeps for the process lands in the first test (in either order)
    _warm()

def test_plain():
    a = torch.randn(64, 64)
    assert (a @ a).shape == (64, 64)

def test_forward_backward():
    model = torch.nn.Linear(16, 4)
    model(torch.randn(8, 16)).square().mean().backward()

def test_function_fixture(scratch):
    assert scratch.sum() == 0

def test_module_fixture(weights):
    assert (weights * 2).sum() == 8192

def test_memlab_fixture(memlab):
    t = torch.ones(2048)
    assert memlab.peak >= t.nbytes

def test_leaks():
    _GROWS.append(torch.ones(512))

def test_cycle():
    n = Node()
    n.me = n
    n.t = torch.ones(4096)

def test_cache():
    if "k" not in _TABLE:
        _TABLE["k"] = torch.ones(256)

def test_fails():
    t = torch.ones(128)
    assert t.sum() == 0

def test_fails_in_teardown(request):
    request.addfinalizer(lambda: 1 / 0)
    torch.ones(16)

@pytest.mark.xfail(reason="expected")
def test_xfails():
    torch.ones(32)
    assert False

def test_skips():
    torch.ones(8)
    pytest.skip("inside")

@pytest.mark.skip(reason="by mark")
def test_skipped_by_mark():
    pass

def test_child_process():
    subprocess.run([sys.executable, "-c", "import torch; torch.ones(100)"], check=True)

def test_cpu_oom_caught():
    try:
        torch.empty(1 << 62, dtype=torch.uint8)
    except RuntimeError:
        pass
    torch.ones(4)

@pytest.mark.cpu_memory(max="1M")
def test_marked():
    torch.ones(1024)

def test_last():
    _warm()

def _warm():
    a = torch.randn(64, 64)
    model = torch.nn.Linear(16, 4)
    model(torch.randn(8, 16)).square().mean().backward()
    assert (a @ a).shape == (64, 64)
"""


def _junit(path) -> dict:
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = tuple(c.tag for c in case if c.tag not in ("properties", "system-out", "system-err"))
        props = [(p.get("name"), p.get("value")) for p in case.iter("property")]
        out[case.get("name")] = (outcome, props)
    return out


def _memlab_section(text: str) -> str:
    """What memlab printed (its warnings and summary), durations and the
    addresses of objects in failures' texts left out."""
    words = re.sub(r"0x[0-9a-f]+", "0x", text.split("warnings summary")[-1])
    return "\n".join(line for line in words.splitlines() if not (" in " in line and "passed" in line)
                     and "generated xml file" not in line and "plain ends" not in line)


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_plain_runs_give_the_general_runs_figures(inner, monkeypatch, order):
    inner.makeconftest(COUNT_PLAIN_ENDS)
    inner.makepyfile(test_inner=SUITE)
    args = ["-p", "no:randomly", "-s", "-rA", "--memlab"]
    if order == "reverse":
        inner.makeconftest(COUNT_PLAIN_ENDS + """
def pytest_collection_modifyitems(items):
    items.reverse()
""")
    runs = {}
    for mode in ("on", "off"):
        monkeypatch.setenv("MEMLAB_PLAIN_RUNS", mode)
        result = inner.runpytest_subprocess(*args, f"--junitxml={mode}.xml")
        runs[mode] = (result, _junit(inner.path / f"{mode}.xml"))
    (plain, plain_junit), (general, general_junit) = runs["on"], runs["off"]
    assert plain.ret == general.ret == 1
    plain.assert_outcomes(passed=14, failed=1, errors=1, xfailed=1, skipped=2)
    assert plain_junit == general_junit
    assert sum(len(props) for _, props in plain_junit.values()) >= 2 * 14
    assert _memlab_section(plain.stdout.str()) == _memlab_section(general.stdout.str())
    ended = plain.stdout.str().split("plain ends: ")[1].split("\n")[0]
    # the tests that needed nothing more ended plain; the others became general runs
    again = "test_last" if order == "forward" else "test_first"   # the warm-up that ran second
    assert ended.split(": ")[1].split() == sorted(f"test_inner.py::{name}" for name in
                                                  ("test_forward_backward", "test_plain", again)), ended
    assert general.stdout.str().split("plain ends: ")[1].startswith("0:")


def _scope(core):
    from pytest_memlab.engine.meters import EngineMeter

    meter = EngineMeter(core, "cpu", timeline=True)
    meter.begin()
    return meter, meter.failed_requests()[0]


def test_a_plain_end_closes_a_scope_that_left_nothing_with_the_general_ends_figures(core):
    import torch

    hooks = core.bridge._hook_users
    general, failed = _scope(core)
    a = torch.ones(512, 512)          # 1 MiB
    b = a * 2                         # 2 MiB at the peak
    del a, b
    figures = general.end()
    plain, failed = _scope(core)
    a = torch.ones(512, 512)
    b = a * 2
    del a, b
    peak, peak_total, reserved_peak, head = plain.end_plain(failed)
    assert (peak, peak_total, reserved_peak) == (figures.peak, figures.peak_total, figures.reserved_peak)
    assert 2 * MiB <= peak < 2 * MiB + 1024   # (and the few bytes of the scalar 2)
    assert head[0] == peak and head[3] is None   # the kept head: the peak, no phase ran
    assert not core.bridge.installed() and core.bridge._hook_users == hooks


def test_a_plain_end_leaves_a_scope_open_where_a_block_is_live_or_a_request_failed(core):
    import torch

    hooks = core.bridge._hook_users
    meter, failed = _scope(core)
    held = torch.ones(256, 256)       # 256 KiB still allocated
    assert meter.end_plain(failed) is None
    assert core.bridge.installed() and meter.live() == 256 * 1024   # still open: the general end reads it
    del held
    with pytest.raises(RuntimeError):
        torch.empty(2**50, dtype=torch.uint8)   # a request the CPU allocator could not serve
    assert meter.end_plain(failed) is None
    assert meter.failed_requests()[0] == failed + 1
    assert meter.end().peak == 256 * 1024
    assert not core.bridge.installed() and core.bridge._hook_users == hooks
