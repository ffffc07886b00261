"""Memory heard on every thread (issue 35), on CPU tensors: memlab's own CPU
allocator hears a thread pool's allocations and a plain thread's frees; the
reporter path stays, said once, where the allocator is not installed."""

import sys

from conftest import MiB, device_figures, line_no, requires_torch

pytestmark = requires_torch

POOL = """
import threading
from concurrent.futures import ThreadPoolExecutor
import pytest, torch

def make(n):
    return torch.ones(n)

@pytest.mark.cpu_memory(max="8M")
def test_pool():
    with ThreadPoolExecutor(1) as pool:
        x = pool.submit(torch.ones, 4 << 20).result()

@pytest.mark.cpu_memory(max="8M")
def test_pool_runs_python():
    with ThreadPoolExecutor(1) as pool:
        x = pool.submit(make, 4 << 20).result()

@pytest.mark.cpu_memory(max="64M")
def test_thread_frees():
    box = [torch.ones(1 << 20)]
    t = threading.Thread(target=box.clear)
    t.start(); t.join()
"""


def test_a_pool_threads_tensor_counts_and_its_line_is_named(inner):
    inner.makepyfile(test_pool=POOL)
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab-json=r.json")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    path = inner.path / "test_pool.py"
    pool_line = line_no(path, "x = pool.submit(torch.ones")
    make_line = line_no(path, "return torch.ones(n)")
    python_line = line_no(path, "x = pool.submit(make")
    # CPU on every thread: no warning that the reporter is all there is
    assert "measured through torch's memory reporter" not in out
    result.stdout.fnmatch_lines([
        "*test_pool _*",
        "cpu peak 16.0 MiB exceeds max 8.0 MiB by 8.0 MiB",
        f"  peak reached in test_pool.py:{pool_line} test_pool: x = pool.submit(torch.ones, 4 << 20).result()",
    ])
    # A thread that runs Python: its own traced line where the tracer sees
    # other threads (sys.monitoring, 3.12+), else the test's line.
    if sys.version_info >= (3, 12):
        result.stdout.fnmatch_lines([f"*16.0 MiB 100%*test_pool.py:{make_line} make: return torch.ones(n)*"])
    else:
        result.stdout.fnmatch_lines([f"*16.0 MiB 100%*test_pool.py:{python_line} test_pool_runs_python: "
                                     "x = pool.submit(make, 4 << 20).result()*"])
    f = device_figures(inner)
    assert f["test_pool"]["peak"] == f["test_pool"]["peak_total"] == 16 * MiB
    assert f["test_pool_runs_python"]["peak"] == 16 * MiB
    # the tensor freed by a plain thread is gone: no leak, nothing kept
    assert f["test_thread_frees"]["peak"] == 4 * MiB
    assert f["test_thread_frees"]["leaked"] == 0 and f["test_thread_frees"]["kept"] == 0


def test_without_memlabs_allocator_the_reporter_hears_the_cpu_and_the_summary_says_so(inner, monkeypatch):
    monkeypatch.setenv("MEMLAB_CPU_ALLOCATOR", "0")
    inner.makepyfile(test_pool=POOL)
    # warnings as errors: the path is said in the summary, never raised
    # (pytest-benchmark, where installed, warns of its own under xdist)
    result = inner.runpytest_subprocess("-p", "no:randomly", "-p", "no:asyncio", "-p", "no:benchmark",
                                        "--memlab-json=r.json", "-W", "error")
    # the pool's tensor goes unheard there: the budgets pass
    result.assert_outcomes(passed=3)
    assert result.stdout.str().count("the CPU heard through torch's memory reporter, on the threads") == 1
    result.stdout.fnmatch_lines(["3 tests measured through torch's allocators (torch *); the CPU heard through "
                                 "torch's memory reporter*: turned off by MEMLAB_CPU_ALLOCATOR=0"])
    f = device_figures(inner)
    assert f["test_pool"]["peak"] == 0
    # the plain thread's free goes unheard: the block looks kept, and the
    # own peak leaves what a test keeps out
    assert f["test_thread_frees"]["peak_total"] == 4 * MiB and f["test_thread_frees"]["kept"] == 4 * MiB


def test_the_profilers_memory_events_still_arrive_inside_a_measured_test(inner):
    """memlab's allocator delegates to torch's default, which still reports
    to torch.profiler: a test that profiles memory sees the same events."""
    inner.makepyfile(test_prof="""
import pytest, torch
from torch.profiler import profile, ProfilerActivity

@pytest.mark.cpu_memory(max="1G")
def test_profiles_memory():
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        x = torch.ones(1 << 20)
        y = x * 2
    used = sum(e.cpu_memory_usage for e in prof.key_averages() if e.cpu_memory_usage > 0)
    assert used >= 8 * 2**20, used
""")
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab-json=r.json")
    result.assert_outcomes(passed=1)
    assert device_figures(inner)["test_profiles_memory"]["peak"] >= 8 * MiB


def test_the_mobile_allocator_set_inside_a_test_is_torchs_business(inner):
    """torch's tests set the mobile CPU allocator (priority 100) and unset
    it; memlab's stays out of its way and the process's allocator comes
    back as it was."""
    inner.makepyfile(test_mobile="""
import pytest, torch

@pytest.mark.cpu_memory(max="1G")
def test_sets_the_mobile_allocator():
    torch._C._set_default_mobile_cpu_allocator()
    try:
        x = torch.ones(1 << 20)
        assert float(x.sum()) == 2**20
    finally:
        torch._C._unset_default_mobile_cpu_allocator()

@pytest.mark.cpu_memory(max="1G")
def test_after_it():
    x = torch.ones(1 << 20)
""")
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab-json=r.json")
    result.assert_outcomes(passed=2)
    # while it is set, nothing is heard (torch's mobile allocator reports
    # to no one); unset, memlab's is back
    assert device_figures(inner)["test_after_it"]["peak"] == 4 * MiB


def test_an_in_process_session_inside_a_measured_test_leaves_the_allocator(inner):
    """pytester's in-process run ends a session inside the outer test: the
    allocator stays memlab's until the outermost session ends, and the
    outer test's budget still hears a plain thread."""
    inner.makepyfile(test_outer="""
import threading
import pytest, torch
pytest_plugins = ["pytester"]

@pytest.mark.cpu_memory(max="1MiB")
def test_outer(pytester):
    pytester.makepyfile(test_in="def test_in():\\n    pass\\n")
    pytester.runpytest_inprocess("-p", "no:randomly").assert_outcomes(passed=1)
    box = []
    t = threading.Thread(target=lambda: box.append(torch.ones(1 << 20)))
    t.start(); t.join()
""")
    result = inner.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["cpu peak 4.0 MiB exceeds max 1.0 MiB by 3.0 MiB"])


def test_the_allocator_is_given_back_at_the_sessions_end(inner):
    inner.makepyfile(test_one="""
import pytest, torch

@pytest.mark.cpu_memory(max="1G")
def test_one():
    x = torch.ones(1 << 10)
""")
    script = inner.makepyfile(run_twice="""
import pytest
from pytest_memlab.engine.backend import core

for _ in range(2):
    assert pytest.main(["-q", "-p", "no:randomly", "test_one.py"]) == 0
    # given back at the session's end; set again by the next one's first CPU measurement
    print("after a session:", core().bridge.cpu_allocator)
""")
    result = inner.runpython(script)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert result.stdout.str().count("after a session: None") == 2
