"""Acceptance tests of the plugin on CPU tensors, through pytester: exit
codes, outcomes and what the user reads."""

import json
import os
import sys

import pytest

from conftest import requires_torch

pytestmark = requires_torch

MiB = 2**20

HEADER = """
import threading
import pytest, torch
MiB = 2**20

def cpu_bytes(n):
    return torch.empty(n, dtype=torch.uint8)
"""


def run(pytester, body, *args):
    pytester.makepyfile(test_inner=HEADER + body)
    return pytester.runpytest_inprocess("-v", *args)


def test_own_peak_of_32_and_16_mib_is_exactly_48_mib(inner):
    result = run(inner, """
@pytest.mark.cpu_memory(max="48MiB")
def test_at_budget():
    a = cpu_bytes(32 * MiB)
    b = cpu_bytes(16 * MiB)
    del a, b

@pytest.mark.cpu_memory(max=48 * MiB - 1)
def test_one_byte_over():
    a = cpu_bytes(32 * MiB)
    b = cpu_bytes(16 * MiB)
    del a, b
""")
    result.assert_outcomes(passed=1, failed=1)  # <= passes, one byte over fails
    result.stdout.fnmatch_lines([
        "*test_at_budget PASSED*",
        "*test_one_byte_over FAILED*",
        "cpu peak 48.0 MiB exceeds max 48.0 MiB by 1 B",
        "  exactly 50331648 B against 50331647 B",
    ])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_max_total_and_report_table(inner):
    result = run(inner, """
@pytest.mark.cpu_memory(max_total="10MiB")
def test_total():
    a = cpu_bytes(12 * MiB)

@pytest.mark.cpu_memory(max="1G")
def test_small():
    a = cpu_bytes(3 * MiB)
""", "--memlab-report")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "cpu total peak 12.0 MiB exceeds max_total 10.0 MiB by 2.0 MiB",
        "*= memlab =*",
        "2 tests measured*",
        # one device and one file: said once above the rows; no reserved peak (no pool on the CPU)
        "on cpu, in test_inner.py:",
        "test*own peak*total peak*max*use",
        "test_total*12.0 MiB*12.0 MiB*-*-",
        "test_small*3.0 MiB*3.0 MiB*1.00 GiB*0%",
    ])


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_bad_markers_are_collection_errors_naming_test_and_value(inner, xdist):
    result = run(inner, """
@pytest.mark.cpu_memory(max="2X")
def test_bad_unit():
    pass

@pytest.mark.cuda_memory(max="1G", maxx="2G")
def test_unknown_keyword():
    pass

@pytest.mark.cpu_memory(max_total="-1G")
def test_negative():
    pass

@pytest.mark.cuda_memory(device="gpu")
def test_bad_device():
    pass

@pytest.mark.cpu_memory("1G", "2G")
def test_two_positionals():
    pass
""", *xdist)
    # The same with and without xdist: a collection error of the module
    # that names each test and its bad value; no traceback, no INTERNALERROR.
    # (pytest stops at a collection error with exit 2; xdist reports it and
    # exits 1, as it does for every collection error.)
    assert result.ret == (pytest.ExitCode.TESTS_FAILED if xdist else pytest.ExitCode.INTERRUPTED)
    result.stdout.fnmatch_lines([
        "*ERROR collecting test_inner.py*",
        "pytest-memlab: bad memory marker",
        "*test_inner.py::test_bad_unit: cpu_memory(max='2X'): '2X' has an unknown unit 'X'*",
        "*test_inner.py::test_unknown_keyword: cuda_memory got unknown keyword 'maxx'*",
        "*test_inner.py::test_negative: cpu_memory(max_total='-1G'): '-1G' is negative*",
        "*test_inner.py::test_bad_device: device='gpu' is not a CUDA device*",
        "*test_inner.py::test_two_positionals: cpu_memory takes at most one positional*",
    ])
    output = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in output and "INTERNALERROR" not in output


def test_leaks_and_tolerance_are_accepted_and_checked(inner):
    result = run(inner, """
@pytest.mark.cpu_memory(max="1M", leaks=None, tolerance="5%,1MiB")
def test_ok():
    pass

@pytest.mark.cpu_memory(tolerance="lots")
def test_bad():
    pass
""")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*test_bad: cpu_memory(tolerance='lots'): tolerance 'lots'*"])


def test_a_marker_added_by_a_hook_is_checked_too(inner):
    inner.makeconftest("""
import os

import pytest
def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.cpu_memory(max="lots"))
""")
    result = run(inner, """
def test_a():
    pass
""")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_inner.py::test_a: cpu_memory(max='lots'): *"])


def test_closest_marker_wins_and_class_and_module_markers_apply(inner):
    result = run(inner, """
pytestmark = pytest.mark.cpu_memory(max="1MiB")

def test_module_budget():
    a = cpu_bytes(2 * MiB)

@pytest.mark.cpu_memory(max="4MiB")
class TestClass:
    def test_class_budget(self):
        a = cpu_bytes(3 * MiB)

    @pytest.mark.cpu_memory(max="2MiB")
    def test_own_marker_wins(self):
        a = cpu_bytes(3 * MiB)
""")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*test_module_budget FAILED*", "*test_class_budget PASSED*", "*test_own_marker_wins FAILED*",
        "cpu peak 2.0 MiB exceeds max 1.0 MiB by 1.0 MiB",
        "cpu peak 3.0 MiB exceeds max 2.0 MiB by 1.0 MiB",
    ])


def test_one_cuda_budget_per_gpu_from_the_tests_own_markers(inner):
    """Several cuda_memory markers on the test itself, naming other GPUs,
    all apply (one budget each); the same GPU twice, or a class's marker
    beside the test's own, keep the closest."""
    inner.makeconftest("""
from pytest_memlab.markers import specs_for

def pytest_collection_modifyitems(items):
    for item in items:
        print("SPECS", item.name, [(s.device, s.max) for s in specs_for(item)])
""")
    inner.makepyfile(test_gpus="""
import os

import pytest

@pytest.mark.cuda_memory(max="1MiB", device="cuda:0")
@pytest.mark.cuda_memory(max="2MiB", device="cuda:1")
def test_two_gpus():
    pass

@pytest.mark.cuda_memory(max="1MiB", device="cuda:1")
@pytest.mark.cuda_memory(max="2MiB", device="cuda:1")
def test_one_gpu_twice():
    pass

@pytest.mark.cuda_memory(max="4MiB", device="cuda:1")
class TestClass:
    @pytest.mark.cuda_memory(max="3MiB")
    def test_own_wins(self):
        pass
""")
    result = inner.runpytest("-s", "--collect-only", "-q")
    out = result.stdout.str()
    # the decorator nearest the function is the closest marker, and comes first
    assert "SPECS test_two_gpus [('cuda:1', 2097152), ('cuda:0', 1048576)]" in out, out
    assert "SPECS test_one_gpu_twice [('cuda:1', 2097152)]" in out, out
    assert "SPECS test_own_wins [('cuda', 3145728)]" in out, out


def test_function_fixtures_count_and_broader_fixtures_do_not(inner):
    result = run(inner, """
@pytest.fixture
def per_test():
    t = cpu_bytes(5 * MiB)   # set up in the test's scope: counts
    yield t
    u = cpu_bytes(7 * MiB)   # allocated in teardown, with t still held: 12 MiB
    del u

@pytest.fixture(scope="module")
def shared():
    return cpu_bytes(50 * MiB)   # a broader fixture: not the test's

@pytest.mark.cpu_memory(max="12MiB")
def test_fixture_setup_and_teardown_count(per_test, shared):
    pass

@pytest.mark.cpu_memory(max="11MiB")
def test_teardown_allocation_breaks_budget(per_test, shared):
    pass
""")
    # Only teardown pushed the peak over: teardown fails, for the same test.
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_teardown_allocation_breaks_budget*",
        "cpu peak 12.0 MiB exceeds max 11.0 MiB by 1.0 MiB",
        "*<- test_inner.py:* per_test: u = cpu_bytes(7 * MiB)*",
    ])


def test_memlab_fixture_reports_peak_live_total_marks_and_limits(inner):
    result = run(inner, """
from pytest_memlab import MemoryBudgetExceeded

@pytest.mark.cpu_memory
def test_fixture(memlab):
    assert memlab.devices == ["cpu"]
    a = cpu_bytes(3 * MiB)
    assert memlab.peak == 3 * MiB and memlab.live == 3 * MiB
    assert memlab.total == 3 * MiB
    m = memlab.mark("after a")
    assert m.label == "after a" and m.live == {"cpu": 3 * MiB}
    with memlab.limit("2MiB") as region:
        b = cpu_bytes(2 * MiB)
        del b
    assert region.figures.peak == 2 * MiB
    with pytest.raises(MemoryBudgetExceeded, match="cpu peak 4.0 MiB exceeds limit 2.0 MiB by 2.0 MiB"):
        with memlab.limit("2MiB"):
            c = cpu_bytes(4 * MiB)
    del a
    assert memlab.live == 4 * MiB  # c is still held
    assert memlab.peak == 7 * MiB

def test_unmarked_fixture_user_is_measured(memlab):
    # unmarked: CUDA where there is CUDA, else the CPU
    assert memlab.devices == ["cuda:0" if torch.cuda.is_available() else "cpu"]
    a = torch.empty(MiB, dtype=torch.uint8, device=memlab.devices[0])
    assert memlab.peak == 1 * MiB
""")
    result.assert_outcomes(passed=2)


def test_limit_failure_fails_the_test_with_figures(inner):
    result = run(inner, """
@pytest.mark.cpu_memory
def test_region(memlab):
    with memlab.limit("1MiB"):
        a = cpu_bytes(3 * MiB)
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*MemoryBudgetExceeded: cpu peak 3.0 MiB exceeds limit 1.0 MiB by 2.0 MiB*"])


def test_a_failing_test_stays_failed_and_gets_the_budget_note(inner):
    result = run(inner, """
@pytest.mark.cpu_memory(max="1MiB")
def test_fails_anyway():
    a = cpu_bytes(2 * MiB)
    assert False, "its own failure"

@pytest.mark.xfail(reason="known")
@pytest.mark.cpu_memory(max="1MiB")
def test_xfail_over_budget():
    a = cpu_bytes(2 * MiB)
    assert False

@pytest.mark.cpu_memory(max="1MiB")
def test_skipped():
    pytest.skip("not today")
""")
    result.assert_outcomes(failed=1, xfailed=1, skipped=1)
    result.stdout.fnmatch_lines(["*its own failure*", "*- memlab -*", "cpu peak 2.0 MiB exceeds max 1.0 MiB by 1.0 MiB"])


def test_allocations_on_autograd_and_threads(inner):
    result = run(inner, """
@pytest.mark.cpu_memory(max="100MiB")
def test_backward(memlab):
    w = torch.randn(1024, 1024, requires_grad=True)   # 4 MiB
    (w * 2).sum().backward()
    assert w.grad is not None
    assert memlab.live >= 8 * MiB   # w and its gradient

@pytest.mark.cpu_memory(max="100MiB")
def test_plain_thread(memlab):
    # memlab's CPU allocator hears every thread: the plain thread's 4 MiB,
    # which the test keeps, and the test thread's 1 MiB
    out = []
    t = threading.Thread(target=lambda: out.append(cpu_bytes(4 * MiB)))
    t.start(); t.join()
    a = cpu_bytes(1 * MiB)
    assert memlab.peak == 5 * MiB
""")
    result.assert_outcomes(passed=2)


def test_unmarked_tests_are_not_measured_unless_asked(inner):
    import torch

    body = """
def test_plain():
    a = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda" if torch.cuda.is_available() else "cpu")
"""
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    result = run(inner, body)
    result.assert_outcomes(passed=1)
    assert "= memlab =" not in result.stdout.str()
    result = inner.runpytest_inprocess("-v", "--memlab-report")
    result.stdout.fnmatch_lines([f"on {device}, in test_inner.py:", "test_plain*2.0 MiB*"])
    inner.makeini("[pytest]\naddopts = -p no:cacheprovider\nmemlab_report = term\n")
    result = inner.runpytest_inprocess("-v")
    result.stdout.fnmatch_lines([f"on {device}, in test_inner.py:", "test_plain*2.0 MiB*"])


def test_cuda_marker_without_cuda_runs_unmeasured_or_fails_when_required(inner):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    body = """
@pytest.mark.cuda_memory(max="1G")
def test_gpu():
    pass
"""
    result = run(inner, body)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["not measured: test_inner.py::test_gpu cuda: CUDA is not available"])
    result = inner.runpytest_inprocess("-v", "--memlab-require-cuda")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["cuda not measured: CUDA is not available (--memlab-require-cuda)"])


def test_bad_report_option_is_a_usage_error(inner):
    inner.makepyfile("def test_x(): pass")
    result = inner.runpytest_inprocess("--memlab-report=xml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'xml' is not a report*"])


def test_figures_reach_junitxml_and_the_lines_reach_the_reports(inner):
    """junit keeps a test's figures (numbers and words); its heaviest lines
    and phases are the JSON report's and the terminal table's, serial and
    under pytest-xdist (each junit property is an element kept to the
    session's end)."""
    body = """
@pytest.mark.cpu_memory(max="8MiB")
def test_x():
    a = cpu_bytes(3 * MiB)
"""
    import xml.etree.ElementTree as ET

    from conftest import line_no

    for args in ([], ["-n", "2"]):
        run(inner, body, "--junitxml=out.xml", "--memlab-json=out.json", *args).assert_outcomes(passed=1)
        line = line_no(inner.path / "test_inner.py", "return torch.empty")
        expected = {"file": "test_inner.py", "function": "cpu_bytes", "bytes": 3 * 2**20, "peak_total": 3 * 2**20,
                    "line": line}   # the line that allocated: the helper, which is user code too
        xml = (inner.path / "out.xml").read_text()
        assert '<property name="memlab.cpu.peak" value="3145728"' in xml
        assert '<property name="memlab.cpu.max" value="8388608"' in xml
        props = {p.get("name") for p in ET.fromstring(xml).iter("property")}
        assert props == {"memlab.cpu.peak", "memlab.cpu.peak_total", "memlab.cpu.max"}, args
        test = json.loads((inner.path / "out.json").read_text())["tests"][0]
        assert test["devices"]["cpu"]["top"][0] == expected, args
    result = run(inner, body, "--junitxml=out.xml", "--memlab-report=term", "-n", "2")
    result.stdout.fnmatch_lines([f"*3.0 MiB allocated by test_inner.py:{line} cpu_bytes: return torch.empty*"])


def test_a_test_that_kept_nothing_leaves_its_zero_figures_out_of_junit_and_reads_the_same(inner):
    """A device that kept nothing past its teardown writes no leaked, kept,
    first_use or peak_with_kept property (0, 0, 0, its peak), and no name
    where the name is the device's own: each is an element junit keeps to
    the end.  The controller under pytest-xdist reads every figure back as
    the serial run has it; a test that kept something writes all four."""
    body = """
KEPT = []

@pytest.mark.cpu_memory   # (unmarked, a test measures CUDA where there is one)
def test_nothing_kept():
    a = cpu_bytes(3 * MiB)

@pytest.mark.cpu_memory(leaks="4MiB")   # kept, within its allowance: passes
def test_keeps():
    KEPT.append(cpu_bytes(2 * MiB))
"""
    run(inner, body, "--junitxml=serial.xml", "--memlab-json=serial.json").assert_outcomes(passed=2)
    import xml.etree.ElementTree as ET

    def props(path):
        return {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
                for case in ET.parse(inner.path / path).getroot().iter("testcase")}

    serial = props("serial.xml")
    assert set(serial["test_nothing_kept"]) == {"memlab.cpu.peak", "memlab.cpu.peak_total"}
    assert not {"memlab.cpu.leaked", "memlab.cpu.kept", "memlab.cpu.first_use", "memlab.cpu.peak_with_kept",
                "memlab.cpu.name"} & set(serial["test_nothing_kept"])
    assert int(serial["test_keeps"]["memlab.cpu.leaked"]) == 2 * MiB
    assert {"memlab.cpu.kept", "memlab.cpu.peak_with_kept"} <= set(serial["test_keeps"])
    run(inner, body, "-n", "2", "--junitxml=workers.xml", "--memlab-json=workers.json").assert_outcomes(passed=2)
    assert props("workers.xml") == serial

    def figures(path):
        data = json.loads((inner.path / path).read_text())
        return {t["nodeid"]: {d: {k: v for k, v in f.items() if k != "gpu"} for d, f in t["devices"].items()}
                for t in data["tests"]}

    read_back = figures("workers.json")
    assert read_back == figures("serial.json")
    nothing = read_back["test_inner.py::test_nothing_kept"]["cpu"]
    assert (nothing["leaked"], nothing["kept"], nothing["first_use"], nothing["peak"]) == (0, 0, 0, 3 * MiB)


def test_the_results_kept_to_the_end_are_not_tracked_by_the_collector_and_read_the_same(inner):
    """Each result the session keeps to its end (the test, its devices,
    their heaviest lines) is untracked by the garbage collector: on a large
    heap each tracked one is promoted and walked at every full collection,
    and a few a test brought the next one into the tests.  The reports
    read from them still say what was measured, serial and under xdist."""
    inner.makeconftest("""
import gc

def pytest_sessionfinish(session):
    manager = session.config.pluginmanager.get_plugin("memlab-manager")
    results = manager.session.results
    kept = [r for r in results.values()] + [r.devices for r in results.values()]
    kept += [d for r in results.values() for d in r.devices.values()]
    kept += [d.top for r in results.values() for d in r.devices.values() if d.top]
    print(f"kept {len(results)} results, {sum(map(gc.is_tracked, kept))} of {len(kept)} objects tracked")
""")
    body = """
KEPT = []

@pytest.mark.cpu_memory
@pytest.mark.parametrize("n", [1, 2, 3])
def test_allocates(n):
    a = cpu_bytes(n * MiB)

@pytest.mark.cpu_memory(leaks="4MiB")
def test_keeps():
    KEPT.append(cpu_bytes(2 * MiB))
"""
    result = run(inner, body, "-s", "--junitxml=serial.xml", "--memlab-json=serial.json")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*kept 4 results, 0 of 16 objects tracked*"])
    data = json.loads((inner.path / "serial.json").read_text())
    cpu = {t["nodeid"].split("::")[1]: t["devices"]["cpu"] for t in data["tests"]}
    assert [cpu[f"test_allocates[{n}]"]["peak"] for n in (1, 2, 3)] == [MiB, 2 * MiB, 3 * MiB]
    assert [cpu[f"test_allocates[{n}]"]["top"][0]["bytes"] for n in (1, 2, 3)] == [MiB, 2 * MiB, 3 * MiB]
    assert (cpu["test_keeps"]["leaked"], cpu["test_keeps"]["peak_with_kept"]) == (2 * MiB, 2 * MiB)
    workers = run(inner, body, "-n", "2", "--memlab-json=workers.json")
    workers.assert_outcomes(passed=4)
    assert json.loads((inner.path / "workers.json").read_text())["tests"] == data["tests"]


def test_the_property_codec_reads_back_what_it_wrote_for_every_shape_of_figures():
    """encode then decode gives back every figure: a device that kept
    nothing (its four figures left out), one that kept something, one the
    engine did not follow (kept, first_use and peak_with_kept unknown: all
    written that are known), one not measured, a name that is not the
    device's own."""
    from pytest_memlab.reports.results import DeviceResult, TestResult, decode, details, encode

    shapes = [
        DeviceResult("cpu", peak=5, peak_total=9, leaked=0, kept=0, first_use=0, peak_with_kept=5, name="cpu"),
        DeviceResult("cpu", peak=5, peak_total=9, leaked=0, kept=3, first_use=3, peak_with_kept=8, name="cpu"),
        DeviceResult("cpu", peak=5, peak_total=9, leaked=2, kept=2, first_use=0, peak_with_kept=7, name="cpu"),
        DeviceResult("cuda:0", peak=5, peak_total=9, reserved_peak=20, leaked=0, name="cuda"),
        DeviceResult("cuda:0", peak=0, peak_total=0, reserved_peak=0, leaked=0, kept=0, first_use=0,
                     peak_with_kept=0, name="cuda:0", gpu="1"),
        DeviceResult("cuda:1", measured=False, reason="no bridge", name="cuda:1"),
        DeviceResult("cpu", peak=5, peak_total=9, leaked=0, kept=0, first_use=0, peak_with_kept=5, name="cpu",
                     top=[{"file": "t.py", "line": 3, "function": "f", "bytes": 5, "peak_total": 9}],
                     phases={"forward": 5}, phase_max={"forward": 8}, kinds={"activations": 5}, max=8,
                     detail={"events": 2, "timeline": [[0, 0, 5, 4, 9]]}),
        DeviceResult("cpu", peak=0, peak_total=9, leaked=0, kept=0, first_use=0, peak_with_kept=0, name="cpu",
                     phases={"forward": 0}, kinds={}),   # phases ran, nothing of its own at its peak
    ]
    for shape in shapes:
        result = TestResult("t.py::t", devices={shape.device: shape})
        props = encode(result)
        assert not any(isinstance(v, str) and v.startswith(("[", "{")) for _, v in props), props   # junit: no lists or maps
        back = decode("t.py::t", props, details(result))
        assert back.devices == result.devices, shape
    # the test's child processes and out-of-memory explanations travel beside the
    # properties; another plugin's memlab.NAME property (--memlab-pack's) is no device
    result = TestResult("t.py::t", devices={"cpu": shapes[0]}, failed_by_memlab=["cpu max"],
                        processes=[{"pid": 7, "label": "process 0", "devices": {"cpu": {"peak": 5}}}],
                        out_of_memory=[{"device": "cpu", "text": "out of memory"}])
    props = encode(result) + [("memlab.rerun", "set aside, re-run alone at the end: OutOfMemoryError")]
    assert {name for name, _ in props} == {"memlab.cpu.peak", "memlab.cpu.peak_total", "memlab.failed_by_memlab",
                                          "memlab.rerun"}
    back = decode("t.py::t", props, details(result))
    assert back.devices == result.devices
    assert (back.failed_by_memlab, back.processes, back.out_of_memory) == (
        result.failed_by_memlab, result.processes, result.out_of_memory)


def test_plugin_can_be_turned_off(inner):
    result = run(inner, """
@pytest.mark.cpu_memory(max="1B")
def test_x():
    a = cpu_bytes(3 * MiB)
""", "-p", "no:memlab")
    result.assert_outcomes(passed=1)


def test_xdist_workers_measure_and_the_controller_reports(inner):
    pytest.importorskip("xdist")
    inner.makepyfile(test_inner=HEADER + """
@pytest.mark.cpu_memory(max="1MiB")
def test_over():
    a = cpu_bytes(2 * MiB)

@pytest.mark.cpu_memory(max="4MiB")
def test_under():
    a = cpu_bytes(3 * MiB)
""")
    result = inner.runpytest_subprocess("-n", "2", "--memlab-report")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*cpu peak 2.0 MiB exceeds max 1.0 MiB by 1.0 MiB*",
        "test_inner.py::test_under*cpu*3.0 MiB*",
    ])


BROKEN_BRIDGE_BODY = """
@pytest.mark.cpu_memory(max="1G")
def test_cpu():
    a = cpu_bytes(MiB)
"""


def test_without_the_bridge_cpu_is_not_measured_and_says_why(inner, monkeypatch):
    monkeypatch.setenv("MEMLAB_CORE", "auto")
    monkeypatch.setenv("MEMLAB_BRIDGE", str(inner.path / "missing.so"))
    inner.makepyfile(test_inner=HEADER + BROKEN_BRIDGE_BODY)
    result = inner.runpytest_subprocess("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "0 tests measured from torch.cuda's counters only, no line attribution (torch *): the torch bridge is "
        "unavailable: MEMLAB_BRIDGE=*missing.so' is not a file; 1 not measured (below)",
        "not measured: test_inner.py::test_cpu cpu: CPU memory is measured only through the torch bridge, "
        "which is unavailable here",
    ])
    # a budget never passes unjudged: the session fails, saying why and what to do, in one line
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "pytest-memlab: 1 marked test not judged: the torch bridge is unavailable: MEMLAB_BRIDGE=*missing.so' "
        "is not a file. To judge it: point MEMLAB_BRIDGE at a bridge built for this torch elsewhere. "
        "The session fails for it (--memlab-accept-unjudged accepts this).",
    ])
    # the reason is said in the head line and the fix once: not three times over
    assert result.stdout.str().count("missing.so") == 2, result.stdout.str()
    # accepted, with the option or its ini twin: the tests' own outcome stands
    for accept in (["--memlab-accept-unjudged"], ["-o", "memlab_accept_unjudged=true"]):
        accepted = inner.runpytest_subprocess("-v", *accept)
        assert accepted.ret == pytest.ExitCode.OK, accepted.stdout.str()
        accepted.stdout.fnmatch_lines(["pytest-memlab: 1 marked test not judged: *. Accepted "
                                       "(--memlab-accept-unjudged)."])


def test_an_unjudged_budget_fails_the_session_under_xdist_too(inner, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv("MEMLAB_CORE", "auto")
    monkeypatch.setenv("MEMLAB_BRIDGE", str(inner.path / "missing.so"))
    inner.makepyfile(test_inner=HEADER + BROKEN_BRIDGE_BODY)
    result = inner.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["pytest-memlab: 1 marked test not judged: the torch bridge is unavailable*"])


def test_a_compiler_that_fails_is_said_in_one_line_with_its_output_in_a_file(tmp_path, monkeypatch):
    """The bridge's build with a C++ compiler that fails (CXX=/bin/false):
    a short reason naming the compiler and the file that holds its command
    and output, not the 600-character command line."""
    torch = pytest.importorskip("torch")
    from pytest_memlab.engine.bridge_build import BridgeBuildError, build

    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(BridgeBuildError) as info:
        build(torch, tmp_path)
    message = str(info.value)
    assert message.startswith("the C++ compiler '/bin/false' failed (exit 1); its command and output: ")
    assert "\n" not in message and len(message) < 300, message
    log = message.rsplit(": ", 1)[1]
    assert log.startswith(str(tmp_path)) and open(log).read().startswith("/bin/false -O2 -std=c++17")
    assert not list(tmp_path.glob("*.so"))   # nothing half-built is left


def test_the_bridges_first_build_says_where_it_went_and_how_long_it_took(inner, monkeypatch, tmp_path):
    """A bridge built on first use (no prebuilt one: MEMLAB_PREBUILT=0) into
    an empty cache: one line in the summary; the next run loads it, silent."""
    monkeypatch.setenv("MEMLAB_CORE", "bridge")
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MEMLAB_PREBUILT", "0")
    inner.makepyfile(test_inner=HEADER + BROKEN_BRIDGE_BODY)
    first = inner.runpytest_subprocess()
    assert first.ret == pytest.ExitCode.OK, first.stdout.str()
    first.stdout.fnmatch_lines([f"pytest-memlab: built the torch bridge for torch * in * s: {tmp_path}/cache/bridge/"
                                "memlab_bridge-*.so (later runs load it)"])
    second = inner.runpytest_subprocess()
    assert second.ret == pytest.ExitCode.OK and "built the torch bridge" not in second.stdout.str()


def test_without_the_bridge_memlab_core_bridge_is_an_error_naming_memlab(inner, monkeypatch):
    monkeypatch.setenv("MEMLAB_CORE", "bridge")
    monkeypatch.setenv("MEMLAB_BRIDGE", str(inner.path / "missing.so"))
    inner.makepyfile(test_inner=HEADER + BROKEN_BRIDGE_BODY)
    result = inner.runpytest_subprocess("-v")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_cpu*",
        "pytest-memlab: MEMLAB_CORE=bridge, but the torch bridge is unavailable: MEMLAB_BRIDGE=*missing.so' is not a file",
    ])
    assert "Traceback" not in result.stdout.str()


def test_a_bad_memlab_core_value_fails_clearly(inner, monkeypatch):
    monkeypatch.setenv("MEMLAB_CORE", "fast")
    inner.makepyfile(test_inner=HEADER + BROKEN_BRIDGE_BODY)
    result = inner.runpytest_subprocess("-v")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["pytest-memlab: MEMLAB_CORE='fast' is not one of auto, bridge, counters"])


def test_many_unmeasured_tests_are_grouped_by_reason(inner):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run(inner, """
@pytest.mark.parametrize("i", range(5))
@pytest.mark.cuda_memory(max="1G")
def test_gpu(i):
    pass
""")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["not measured: 5 tests (test_inner.py::test_gpu[0], ...) cuda: CUDA is not available"])


def test_pytest_does_not_rewrite_memlabs_modules(inner, monkeypatch):
    """pytest rewrites an entry-point plugin's modules on every start where
    bytecode is not written (0.5-1 s for memlab's); memlab's own are left to
    Python's import, while the test files keep pytest's assert rewriting.
    The package is found on sys.path, as an installed (not editable) one
    is: pytest's hook rewrites only what the path finder finds."""
    import pytest_memlab

    root = os.path.dirname(os.path.dirname(os.path.abspath(pytest_memlab.__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    inner.makepyfile(test_loaded="""
import sys
from _pytest.assertion.rewrite import AssertionRewritingHook

def test_loaders():
    import pytest_memlab.measuring.run, pytest_memlab.judging.verdicts
    rewritten = sorted(name for name, module in sys.modules.items() if name.startswith("pytest_memlab.")
                       and isinstance(getattr(module, "__loader__", None), AssertionRewritingHook))
    assert rewritten == []
    assert isinstance(sys.modules[__name__].__loader__, AssertionRewritingHook)

def test_rewriting_still_explains():
    x = [1, 2]
    assert x == [1, 3]
""")
    result = inner.runpytest_subprocess("--memlab", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    assert "E       assert [1, 2] == [1, 3]" in result.stdout.str()


SKIPPED_BODY = """
import sys

pytestmark = pytest.mark.cpu_memory   # marked: judged on the CPU, wherever CUDA is

@pytest.mark.skipif(False, reason="a false condition")
def test_skipif_false():
    a = cpu_bytes(MiB)

@pytest.mark.skip(reason="by a mark")
def test_skip_mark():
    cpu_bytes(MiB)

@pytest.mark.skipif(True, reason="a true condition")
def test_skipif_true():
    cpu_bytes(MiB)

@pytest.mark.skipif("sys.platform != 'nowhere'", reason="a string: pytest evaluates it")
def test_skipif_string():
    cpu_bytes(MiB)

def test_skips_itself():
    a = cpu_bytes(MiB)
    pytest.skip("from its own code")

@pytest.mark.skip(reason="the class's mark")
class TestSkippedClass:
    def test_in_it(self):
        cpu_bytes(MiB)

def test_after():
    a = cpu_bytes(2 * MiB)
"""


def test_a_test_skipped_by_its_marks_is_not_measured_and_leaves_the_tracer_parked(inner):
    """pytest's skipping plugin skips a test with a skip mark, or a skipif
    whose condition is True, at the start of its setup, before any fixture:
    nothing of it runs, so memlab builds nothing for it, marked or not (a
    suite's skipped tests are mostly these: kornia's 3,495 of 11,506), and
    the tracer that the last measured test parked stays parked.  A string condition is
    pytest's to evaluate, and a test that skips from its own code ran: both
    are measured as before.  Without pytest's skipping plugin the marks
    skip nothing, and the test is measured."""
    inner.makeconftest("""
import pytest
from pytest_memlab import _engine as E

PARKED = {}

def pytest_runtest_logreport(report):
    if report.when == "setup" and report.skipped:
        PARKED[report.nodeid.rsplit("::", 1)[-1]] = E.tracer_status()["parked"]

def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line("PARKED " + repr(sorted(PARKED.items())))
""")
    result = run(inner, SKIPPED_BODY, "--memlab", "-p", "no:randomly", "--memlab-json=report.json")
    result.assert_outcomes(passed=2, skipped=5)
    tests = {t["nodeid"].rsplit("::", 1)[-1]: t for t in json.loads((inner.path / "report.json").read_text())["tests"]}
    assert set(tests) == {"test_skipif_false", "test_skipif_string", "test_skips_itself", "test_after"}
    assert tests["test_skipif_false"]["devices"]["cpu"]["peak"] == MiB
    assert tests["test_skips_itself"]["devices"]["cpu"]["peak"] == MiB
    assert tests["test_skips_itself"]["outcome"] == tests["test_skipif_string"]["outcome"] == "skipped"
    assert tests["test_after"]["devices"]["cpu"]["peak"] == 2 * MiB
    parked = dict(eval(next(line for line in result.outlines if line.startswith("PARKED "))[len("PARKED "):]))
    if sys.version_info >= (3, 12):   # (before 3.12 the tracer is never parked)
        # parked by test_skipif_false, the measured test before them, and
        # by test_skips_itself before the class's
        assert parked["test_skip_mark"] is True and parked["test_skipif_true"] is True
        assert parked["test_in_it"] is True
    unskipped = run(inner, SKIPPED_BODY, "--memlab", "-p", "no:randomly", "-p", "no:skipping",
                    "--memlab-json=unskipped.json")
    unskipped.assert_outcomes(passed=6, skipped=1)
    ran = {t["nodeid"].rsplit("::", 1)[-1] for t in json.loads((inner.path / "unskipped.json").read_text())["tests"]}
    assert {"test_skip_mark", "test_skipif_true", "test_in_it"} <= ran
