"""CUDA tests: run by ci/gpu on the GPU machine (skipped without CUDA)."""

import threading

import pytest

from conftest import MiB, device_figures, line_no, requires_cuda

pytestmark = requires_cuda


def _measure(core, device="cuda:0"):
    from pytest_memlab.measuring.measurement import Measurement

    m = Measurement(core, [device])
    m.begin()
    return m


def test_own_peak_of_32_and_16_mib_is_exactly_48_mib(core):
    import torch

    torch.cuda.init()
    m = _measure(core)
    a = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
    b = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
    del a, b
    fig = m.end()["cuda:0"]
    assert fig.peak == 48 * MiB
    assert fig.live == 0


def test_training_step_peak_total_equals_max_memory_allocated(core):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(256, 1024, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    m = _measure(core)
    for _ in range(2):
        loss = model(x).square().mean()
        loss.backward()  # runs on the autograd device thread
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    fig = m.end()["cuda:0"]
    assert fig.peak_total == torch.cuda.max_memory_allocated()
    assert fig.reserved_peak == torch.cuda.max_memory_reserved()
    # Adam's state (two moments per parameter) stays: the test's own bytes
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert fig.live >= 2 * params
    assert fig.peak > fig.live


def test_autograd_thread_allocations_reach_the_reporter(core):
    """With the trace tracker gated off, only the thread-local reporter
    speaks: gradients allocated on the autograd device thread must still
    arrive, so the engine's total matches the allocator's exactly."""
    import torch

    w = torch.randn(2048, 2048, device="cuda", requires_grad=True)
    x = torch.randn(512, 2048, device="cuda")
    torch.cuda.synchronize()
    m = _measure(core)
    core.bridge.lib.memlab_bridge_set_tracker(0)
    try:
        (x @ w).sum().backward()
        torch.cuda.synchronize()
        fig = m.figures()
        from pytest_memlab import _engine as engine

        assert engine.totals(1)[0] == torch.cuda.memory_allocated()
        # w.grad (16 MiB) was allocated on the autograd thread and is live
        assert fig.live >= w.numel() * 4
    finally:
        core.bridge.lib.memlab_bridge_set_tracker(1)
        m.end()


def test_free_on_a_plain_thread_is_seen_through_the_tracker(core):
    import torch

    torch.cuda.init()
    _measure(core).end()   # the tracker is attached by the first measurement after CUDA's initialisation
    if core.bridge.tracker is not True:
        pytest.skip(f"no CUDA trace tracker: {core.bridge.tracker}")
    import torch

    box = [None]
    m = _measure(core)
    box[0] = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    assert m.figures().live == 8 * MiB

    def drop():
        box[0] = None  # freed on a thread that carries no reporter

    t = threading.Thread(target=drop)
    t.start()
    t.join()
    fig = m.end()["cuda:0"]
    assert fig.live == 0
    assert fig.peak == 8 * MiB


def test_marker_budget_fails_on_cuda_with_figures(inner):
    inner.makepyfile(
        """
        import pytest, torch
        MiB = 2**20

        @pytest.mark.cuda_memory(max="40MiB")
        def test_over():
            a = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
            b = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")

        @pytest.mark.cuda_memory(max="48MiB", max_total="100GiB", max_reserved="100GiB")
        def test_fits():
            a = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
            b = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
        """
    )
    result = inner.runpytest_subprocess("-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*cuda:0 peak 48.0 MiB exceeds max 40.0 MiB by 8.0 MiB*",
        "*exactly 50331648 B against 41943040 B*",
    ])


def test_the_first_test_to_use_cuda_counts_as_the_tests_after_it(inner):
    """11.5 MiB asked for in a fresh process: the allocator's block is
    12 MiB (a 12 MiB segment, its 0.5 MiB remainder not split off).  Each
    test's own peak counts the request, the first to touch CUDA too: the
    tracker is attached while CUDA initialises, not at the next test
    (measured on timm: a test 2% larger when it ran first)."""
    inner.makepyfile(
        """
        import torch
        MiB = 2**20

        def _alloc():
            return torch.empty(23 * MiB // 2, dtype=torch.uint8, device="cuda")

        def test_first():
            x = _alloc()
            assert torch.cuda.max_memory_allocated() == 12 * MiB

        def test_second():
            x = _alloc()
        """
    )
    result = inner.runpytest_subprocess("-v", "--memlab", "--memlab-json=r.json")
    result.assert_outcomes(passed=2)
    peaks = device_figures(inner, "r.json", "cuda:0")
    assert peaks["test_first"]["peak"] == peaks["test_second"]["peak"] == 23 * MiB // 2
    # the device's figure stays the allocator's: the block
    assert peaks["test_first"]["peak_total"] == 12 * MiB


def test_a_pool_thread_first_to_touch_cuda_is_heard(inner, monkeypatch):
    """CUDA first initialised on a ThreadPoolExecutor worker (no reporter
    there): its 16 MiB is heard from its first allocation, the total peak
    equals max_memory_allocated, and the 8 MiB budget fails naming the
    line that took the worker's tensor."""
    inner.makepyfile(
        """
        import os, pytest, torch
        from concurrent.futures import ThreadPoolExecutor

        @pytest.mark.cuda_memory(max="8M")
        def test_pool():
            assert not torch.cuda.is_initialized()
            with ThreadPoolExecutor(1) as pool:
                x = pool.submit(torch.ones, 4 << 20, device="cuda").result()
            with open(os.environ["MAX_OUT"], "w") as f:
                f.write(str(torch.cuda.max_memory_allocated()))
        """
    )
    out = inner.path / "max.txt"
    monkeypatch.setenv("MAX_OUT", str(out))
    result = inner.runpytest_subprocess("-v", "--memlab-json=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cuda:0 peak 16.0 MiB exceeds max 8.0 MiB*", "*x = pool.submit(torch.ones*"])
    figures = device_figures(inner, "r.json", "cuda:0")["test_pool"]
    assert figures["peak_total"] == int(out.read_text()) == 16 * MiB


def test_counters_fallback_gives_exact_total_peak(inner, monkeypatch):
    monkeypatch.setenv("MEMLAB_CORE", "counters")
    inner.makepyfile(
        """
        import pytest, torch
        MiB = 2**20

        @pytest.mark.cuda_memory(max_total="1MiB")
        def test_over():
            a = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
        """
    )
    result = inner.runpytest_subprocess("-v")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cuda:0 total peak * exceeds max_total 1.0 MiB*", "*estimated from torch.cuda counters*"])


def test_out_of_memory_fails_that_test_and_the_session_goes_on(inner):
    inner.makepyfile(
        """
        import pytest, torch
        MiB = 2**20

        @pytest.mark.cuda_memory(max="1G")
        def test_oom():
            torch.empty(2**50, dtype=torch.uint8, device="cuda")

        @pytest.mark.cuda_memory(max="8MiB")
        def test_after():
            a = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        """
    )
    result = inner.runpytest_subprocess("-v", "--memlab-report")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*OutOfMemoryError*", "test_*.py::test_after*cuda:0*4.0 MiB*"])


def test_unmarked_tests_under_memlab_measure_cuda_without_broader_fixtures(inner):
    inner.makepyfile(
        """
        import pytest, torch
        MiB = 2**20

        @pytest.fixture(scope="module")
        def weights():
            return torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")

        def test_uses_weights(weights, memlab):
            a = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
            assert memlab.devices == ["cuda:0"]
            assert memlab.peak == 2 * MiB
            assert memlab.peak_total >= 66 * MiB
        """
    )
    result = inner.runpytest_subprocess("-v", "--memlab-report")
    result.assert_outcomes(passed=1)
    # (the heaviest tests' list shortens a long module name with "...")
    result.stdout.fnmatch_lines(["*::test_uses_weights (cuda:0, own peak 2.0 MiB)*"])


def test_peak_in_backward_names_the_backward_line(inner):
    path = inner.makepyfile(test_bw="""
        import pytest, torch

        @pytest.mark.cuda_memory(max="1MiB")
        def test_train():
            model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                        torch.nn.Linear(4096, 4096)).cuda()
            x = torch.randn(2048, 4096, device="cuda")
            loss = model(x).square().mean()
            loss.backward()
        """)
    result = inner.runpytest_subprocess("-v")
    result.assert_outcomes(failed=1)
    backward = line_no(path, "loss.backward()")
    result.stdout.fnmatch_lines([
        "cuda:0 peak * exceeds max 1.0 MiB by *",
        # the phase marked itself: the tracer heard torch.autograd.backward start
        f"  peak reached during backward, in test_bw.py:{backward} test_train: loss.backward()",
        "  live at the peak, by the line that allocated it (user call chain):",
        f"*test_bw.py:{backward} test_train: loss.backward()",  # the autograd thread's gradients
    ])


def test_helper_allocation_names_helper_and_calling_line_on_cuda(inner):
    helpers = inner.makepyfile(helpers="""
        import torch

        def make(n):
            return torch.empty(n, dtype=torch.uint8, device="cuda")
        """)
    test = inner.makepyfile(test_helper="""
        import pytest
        from helpers import make
        MiB = 2**20

        @pytest.mark.cuda_memory(max="40MiB")
        def test_x():
            a = make(32 * MiB)
            b = make(16 * MiB)
        """)
    result = inner.runpytest_subprocess("-v")
    result.assert_outcomes(failed=1)
    make, a, b = line_no(helpers, "return torch.empty"), line_no(test, "a = make"), line_no(test, "b = make")
    result.stdout.fnmatch_lines([
        "cuda:0 peak 48.0 MiB exceeds max 40.0 MiB by 8.0 MiB",
        f"  peak reached in helpers.py:{make} make: return torch.empty(n, dtype=torch.uint8, device=\"cuda\")",
        f"                <- test_helper.py:{b} test_x: b = make(16 * MiB)",
        "  live at the peak, by the line that allocated it (user call chain):",
        f"      32.0 MiB  67%  helpers.py:{make} make: *",
        f"                         <- test_helper.py:{a} test_x: a = make(32 * MiB)",
        f"      16.0 MiB  33%  helpers.py:{make} make: *",
        f"                         <- test_helper.py:{b} test_x: b = make(16 * MiB)",
    ])


def _readme_example():
    """fixtures/lab/readme_example.py: the example the README shows."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "lab" / "readme_example.py"
    spec = importlib.util.spec_from_file_location("readme_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_line_profiler_example_on_cuda_and_user_stats_untouched(core):
    import inspect

    import torch
    from pytest_memlab import LineProfiler

    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the README's figures start from an empty device
    big = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del big
    user_peak = torch.cuda.max_memory_allocated()
    reserved = torch.cuda.memory_reserved()
    base = torch.cuda.memory_allocated()
    example = _readme_example()
    with LineProfiler(example.outer, example.inner, target_gpu=0) as prof:
        example.outer()
    # pytorch_memlab resets these and empties the cache; memlab must not
    assert torch.cuda.max_memory_allocated() == user_peak
    assert torch.cuda.memory_reserved() >= reserved
    src, first = inspect.getsourcelines(example.outer)
    at = {line.strip(): first + i for i, line in enumerate(src)}
    rec = prof.records[(example.outer.__code__, "cuda:0")]
    linear = 40960  # weight 40000 B and bias 400 B, each rounded up to 512 B blocks: "40.00K"
    assert rec[at["linear = torch.nn.Linear(100, 100).cuda()"]].peak_total - base == linear
    assert rec[at["linear2 = torch.nn.Linear(100, 100).cuda()"]].peak_total - base == 2 * linear
    assert rec[at["inner()"]].peak_total - base == 3 * linear
    assert max(r.peak_reserved for r in rec.values()) >= 2 * MiB
    text = str(prof.display())
    assert "## outer" in text and "## inner" in text


def test_cuda_leaks_and_what_is_not_one(inner):
    inner.makepyfile(test_inner="""
import pytest, torch
_KEEP = []

@pytest.mark.cuda_memory(max="1G")
def test_kept_on_the_gpu():
    _KEEP.append(torch.empty(2**20, dtype=torch.uint8, device="cuda"))

@pytest.mark.cuda_memory(max="1G")
def test_first_cublas_matmul():
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()

@pytest.mark.cuda_memory(max="1G")
def test_cudnn_convolution():
    torch.backends.cudnn.benchmark = True
    try:
        conv = torch.nn.Conv2d(3, 8, 3).cuda()
        conv(torch.randn(2, 3, 32, 32, device="cuda")).sum().backward()
    finally:
        torch.backends.cudnn.benchmark = False

@pytest.mark.cuda_memory(max="1G")
def test_cuda_graph_capture():
    x = torch.ones(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2
    g.replay()
    torch.cuda.synchronize()

@pytest.mark.cuda_memory(max="1G")
def test_compiled_function():
    f = torch.compile(lambda t: (t * 2).relu(), backend="eager")
    f(torch.ones(64, device="cuda"))
""")
    result = inner.runpytest_subprocess("-v", "-p", "no:randomly")
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_kept_on_the_gpu*",
        "cuda:0 leaked 1.0 MiB after teardown (allowed 0 B)",
        "*tensor (1048576,) uint8  1.0 MiB",
        "      held by: module test_inner, global _KEEP[[]0[]]",
    ])


def test_courtesy_yields_and_restores_the_same_objects():
    import torch

    from pytest_memlab import Courtesy, MemReporter

    model = torch.nn.Linear(1024, 1024).cuda()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(64, 1024, device="cuda")).sum().backward()
    opt.step()
    weight = model.weight
    before = torch.cuda.memory_allocated()
    params_grads_state = 4 * (1024 * 1024 + 1024) * 4   # weights, grads, exp_avg, exp_avg_sq
    with Courtesy():
        assert weight.device.type == "cpu" and weight.grad.device.type == "cpu"
        assert opt.state[weight]["exp_avg"].device.type == "cpu"
        assert torch.cuda.memory_allocated() <= before - params_grads_state
    assert model.weight is weight and weight.device.type == "cuda" and weight.grad.device.type == "cuda"
    assert opt.state[weight]["exp_avg"].device.type == "cuda"
    model(torch.randn(64, 1024, device="cuda")).sum().backward()
    opt.step()   # the optimizer still works on the same Parameters
    report = MemReporter(model).collect("cuda:0")
    dev = report.devices["cuda:0"]
    assert dev.allocated == torch.cuda.memory_allocated(0)
    assert dev.by_kind["parameters"] >= (1024 * 1024 + 1024) * 4


def test_bridge_reads_the_cuda_allocators_totals_as_torch_does(core):
    """Each measured test starts from the allocator's totals, read in C by
    the bridge: they must be torch.cuda's own figures, to the byte."""
    import torch

    from pytest_memlab import _engine as engine

    torch.cuda.init()
    held = [torch.empty(n * MiB + 3, dtype=torch.uint8, device="cuda") for n in (1, 7, 33)]
    for _ in range(2):
        allocated, reserved = torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0)
        assert engine.bridge_cuda_totals(0) == (allocated, reserved)
        assert core.bridge.cuda_totals(torch.cuda, 0) == (allocated, reserved)
        held.pop()
    assert allocated > 0 and reserved >= allocated
