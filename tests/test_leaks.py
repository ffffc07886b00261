"""Leaks after teardown, on CPU tensors through pytester: what is a leak
(and who holds it), what is not, and the policy."""

import json
import pytest

from conftest import has_cuda, requires_torch

pytestmark = requires_torch

HEADER = """
import pytest, torch
KiB = 1024

def cpu_bytes(n):
    return torch.empty(n, dtype=torch.uint8)

_CACHE = []
_KEPT = {}
"""


def run(pytester, body, *args, subprocess=False):
    pytester.makepyfile(test_inner=HEADER + body)
    runner = pytester.runpytest_subprocess if subprocess else pytester.runpytest_inprocess
    return runner("-v", "-p", "no:randomly", *args)


KEPT = """
DEV = "%(dev)s"

def dev_bytes(n):
    return torch.empty(n, dtype=torch.uint8, device=DEV)

class Holder:
    kept = None

def make():
    t = dev_bytes(24 * KiB)
    return lambda: t

%(mark)s
def test_global_list():
    _CACHE.append(dev_bytes(64 * KiB))

%(mark)s
def test_class_attribute():
    Holder.kept = torch.zeros(32, 32, device=DEV)

%(mark)s
def test_closure():
    _KEPT["f"] = make()

%(mark)s
def test_optimizer():
    m = torch.nn.Linear(16, 16).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.ones(2, 16, device=DEV)).sum().backward()
    opt.step()
    _KEPT["opt"] = opt

%(mark)s
def test_loss_graph():
    w = torch.ones(64, 64, requires_grad=True, device=DEV)
    _KEPT["loss"] = (w.exp() * 2).sum()
"""


@pytest.mark.parametrize("dev", ["cpu", "cuda"])
def test_kept_tensors_are_leaks_with_their_holders_named(inner, dev):
    import torch

    if dev == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    mark = '@pytest.mark.cpu_memory(max="1G")' if dev == "cpu" else '@pytest.mark.cuda_memory(max="1G")'
    name = "cpu" if dev == "cpu" else "cuda:0"
    # in a process of its own: the holder search walks the heap, and this
    # test session's heap (every in-process run before) is no user's
    result = run(inner, KEPT % {"dev": dev, "mark": mark}, subprocess=True)
    result.assert_outcomes(passed=5, errors=5)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_global_list*",
        f"{name} leaked 64.0 KiB after teardown (allowed 0 B)",
        "  1 tensor, 64.0 KiB",
        "    allocated at test_inner.py:* dev_bytes: return torch.empty(n, dtype=torch.uint8, device=DEV)",
        "              <- test_inner.py:* test_global_list: _CACHE.append(dev_bytes(64 * KiB))",
        "    tensor (65536,) uint8  64.0 KiB",
        "      held by: module test_inner, global _CACHE[[]0[]]",
        "  exactly 65536 B against 0 B allowed",
        "*ERROR at teardown of test_class_attribute*",
        "      held by: class test_inner.Holder, attribute kept",
        "*ERROR at teardown of test_closure*",
        "              <- test_inner.py:* make: t = dev_bytes(24 * KiB)",
        "              <- test_inner.py:* test_closure: _KEPT[[]\"f\"[]] = make()",
        "      held by: closure of test_inner.make.<locals>.<lambda> (variable t)",
        "*ERROR at teardown of test_optimizer*",
        "      held by: module test_inner, global _KEPT[[]'opt'[]].state[[]<Parameter>[]][[]'momentum_buffer'[]]",
        "*ERROR at teardown of test_loss_graph*",
        "      held by: module test_inner, global _KEPT[[]'loss'[]]",
        "      retains an autograd graph (grad_fn=SumBackward0)",
        "    (bytes no Python tensor owns are held by autograd*",
        f"*5 tests failed by memlab ({name} leaked)*",
    ])


def test_what_is_not_a_leak(inner):
    result = run(inner, """
@pytest.fixture(scope="module")
def module_tensor():
    return cpu_bytes(100 * KiB)

@pytest.fixture(scope="session")
def session_tensor():
    return cpu_bytes(50 * KiB)

@pytest.fixture
def function_tensor():
    t = cpu_bytes(70 * KiB)
    yield t

@pytest.mark.cpu_memory(max="1G")
def test_cycle_freed_by_gc():
    a = [cpu_bytes(40 * KiB)]
    a.append(a)

@pytest.mark.cpu_memory(max="1G")
def test_broader_fixtures(module_tensor, session_tensor):
    assert module_tensor.numel() > 0

@pytest.mark.cpu_memory(max="1G")
def test_function_fixture(function_tensor):
    assert function_tensor.numel() > 0

@pytest.mark.cpu_memory(max="1G")
def test_compiled_function():
    f = torch.compile(lambda x: (x * 2).relu(), backend="eager")
    f(torch.ones(8, 8))

@pytest.mark.cpu_memory(max="1G")
def test_fails_with_tensors_in_its_frame():
    big = cpu_bytes(30 * KiB)
    assert big.numel() == 0, "its own failure"
""", subprocess=True)  # torch.compile: a fresh process
    result.assert_outcomes(passed=4, failed=1)
    assert "leaked" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*AssertionError: its own failure*"])


def test_policy_allowance_and_off(inner):
    result = run(inner, """
@pytest.mark.cpu_memory(leaks="100KiB")
def test_within_allowance():
    _CACHE.append(cpu_bytes(64 * KiB))

@pytest.mark.cpu_memory(leaks=None)
def test_check_off():
    _CACHE.append(cpu_bytes(64 * KiB))

def test_unmarked():  # measured on the default device: CUDA where there is CUDA
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    _CACHE.append(torch.empty(8 * KiB, dtype=torch.uint8, device=dev))
""", "--memlab")
    result.assert_outcomes(passed=3, warnings=1)
    result.stdout.fnmatch_lines([
        "*MemlabLeakWarning: c*leaked 8.0 KiB after teardown (allowed 0 B)*",
        "*1 test left tensors allocated after teardown (c* leaks); see the warnings above*",
    ])
    failing = inner.runpytest_inprocess("-p", "no:randomly", "--memlab", "--memlab-leaks=fail",
                                        "-k", "unmarked")
    failing.assert_outcomes(passed=1, errors=1)
    off = inner.runpytest_inprocess("-p", "no:randomly", "--memlab", "--memlab-leaks=off", "-k", "unmarked")
    off.assert_outcomes(passed=1)
    assert "leaked" not in off.stdout.str()


def test_a_failing_test_keeps_its_failure_and_the_leak_is_told(inner):
    result = run(inner, """
@pytest.mark.cpu_memory(max="1G")
def test_fails_and_leaks():
    _CACHE.append(cpu_bytes(16 * KiB))
    assert False, "its own failure"
""")
    result.assert_outcomes(failed=1, warnings=1)
    result.stdout.fnmatch_lines([
        "*AssertionError: its own failure*",
        "*MemlabLeakWarning: cpu leaked 16.0 KiB after teardown*",
        "*(the test had failed already)*",
    ])


def test_bad_leak_policy_is_a_usage_error(inner):
    inner.makepyfile(test_inner="def test_a(): pass")
    result = inner.runpytest_inprocess("--memlab-leaks=sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'sometimes' is not a leak policy (expected one of: fail, warn, off)*"])


def test_leaks_under_xdist_fail_the_same_test(inner):
    pytest.importorskip("xdist")
    result = run(inner, """
@pytest.mark.cpu_memory(max="1G")
def test_leaks():
    _CACHE.append(cpu_bytes(64 * KiB))

def test_other():
    pass
""", "-n", "2")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR*test_leaks*", "*cpu leaked 64.0 KiB after teardown*"])


def test_leak_repeat_catches_a_cache_that_grows_every_run(inner):
    result = run(inner, """
@pytest.fixture(scope="module")
def cache():
    return []

@pytest.mark.cpu_memory(leaks="1MiB")   # one run's entry is allowed
def test_grows(cache):
    cache.append(cpu_bytes(4 * KiB))

@pytest.mark.cpu_memory(leaks="1MiB")
def test_warms_once(cache):
    if len(cache) < 100:
        cache.extend(cpu_bytes(KiB) for _ in range(100 - len(cache)))
""", "--memlab-leak-repeat=3")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_grows*",
        "cpu kept 4.0 KiB more after every repetition (3 repetitions of the test's call: "
        "+4.0 KiB, +4.0 KiB, +4.0 KiB)*",
        "  exactly 12288 B over 3 repetitions",
    ])
    plain = inner.runpytest_inprocess("-p", "no:randomly")
    plain.assert_outcomes(passed=2)   # each single run is within its allowance


def test_bad_leak_repeat_is_a_usage_error(inner):
    inner.makepyfile(test_inner="def test_a(): pass")
    result = inner.runpytest_inprocess("--memlab-leak-repeat=-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'-1' must not be negative*"])


def test_cpu_a_tensor_freed_on_a_plain_thread_is_no_leak(inner):
    """memlab's CPU allocator hears frees on every thread: a tensor made in
    the test and dropped by a plain thread is gone, neither leaked nor kept."""
    result = run(inner, """
import threading

@pytest.mark.cpu_memory(max="1G")
def test_freed_on_a_plain_thread():
    box = [cpu_bytes(4096 * KiB)]
    t = threading.Thread(target=box.clear)
    t.start(); t.join()
""", "--memlab-json=r.json", "--memlab-leaks=fail")
    result.assert_outcomes(passed=1, errors=0)
    assert "leaked" not in result.stdout.str()
    d = json.loads(inner.path.joinpath("r.json").read_text())["tests"][0]["devices"]["cpu"]
    assert d["leaked"] == 0 and d["kept"] == 0 and d["first_use"] == 0
    assert d["peak"] == 4 * 1024 * 1024


COUNT_FULL_COLLECTIONS = """
import gc

FULL = []

def _count(phase, info):
    if phase == "start" and info["generation"] == 2:
        FULL.append(1)

gc.callbacks.append(_count)

import pytest

AT_END = []   # full collections asked for by a call at the session's end
_collect = gc.collect

def _counting_collect(generation=2):
    AT_END.append(generation == 2)
    return _collect(generation)

@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    # a call's, not the collector's own: an allocation at the end may set
    # off an automatic full collection that would have come anyway
    gc.collect = _counting_collect
    try:
        yield
    finally:
        gc.collect = _collect

def pytest_unconfigure(config):
    print(f"full collections: {len(FULL)}, at the end: {sum(AT_END)}")
"""

COUNT_HEAP_WALKS = """
class _HeapWalks:
    \"\"\"gc.get_objects() calls at the session's end: each a walk of the whole heap.\"\"\"

    walks = 0

    def _counting(self, *args, **kwargs):
        self.walks += 1
        return self.get_objects(*args, **kwargs)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session):
        self.get_objects, gc.get_objects = gc.get_objects, self._counting
        try:
            yield
        finally:
            gc.get_objects = self.get_objects

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        print(f"heap walks at the end: {self.walks}")

def pytest_configure(config):
    config.pluginmanager.register(_HeapWalks(), "heap-walks")
"""

CYCLES_CACHES_LEAKS = """
DEV = "cuda" if torch.cuda.is_available() else "cpu"   # what --memlab measures an unmarked test on

def dev_bytes(n):
    return torch.empty(n, dtype=torch.uint8, device=DEV)

class Node:
    pass

_TABLE = {}      # a cache: constant tensors keyed by dtype, filled on first use
_GROWS = []      # a leak: every test that uses it appends

def constant(dtype):
    if dtype not in _TABLE:
        _TABLE[dtype] = torch.ones(1024, dtype=dtype, device=DEV)
    return _TABLE[dtype]

@pytest.mark.parametrize("i", range(20))
def test_cycle(i):
    n = Node()
    n.me = n
    n.t = dev_bytes(32 * KiB)       # freed only by the cyclic collector

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float32, torch.float64, torch.float32])
def test_uses_the_cache(dtype):
    assert constant(dtype).sum() == 1024

@pytest.mark.parametrize("i", range(2))
def test_grows(i):
    _GROWS.append(dev_bytes(8 * KiB))
"""


def test_unmarked_suspects_are_confirmed_once_at_the_end(inner):
    """Bytes that wait for the collector cost no full collection per test:
    20 tests leaving cycles, one collection at the end; the cycles are not
    leaks, the keyed cache is reported once, the growing list's tests are
    each named; every test's leaked figure agrees with its verdict."""
    import json

    inner.makeconftest(COUNT_FULL_COLLECTIONS)
    inner.makepyfile(test_inner=HEADER + CYCLES_CACHES_LEAKS)
    result = inner.runpytest_subprocess("-p", "no:randomly", "-s", "--memlab", "--memlab-json=r.json")
    result.assert_outcomes(passed=27)
    out = result.stdout.str()
    full = int(out.split("full collections: ")[1].split(",")[0])
    plain = inner.runpytest_subprocess("-p", "no:randomly", "-s", "-p", "no:memlab").stdout.str()
    unmeasured = int(plain.split("full collections: ")[1].split(",")[0])
    assert full <= unmeasured + 1, out     # one per test (20 more) before
    # every tensor left at the end is held from a module's globals: no
    # collection needed to tell it from garbage
    assert "full collections: %d, at the end: 0" % full in out, out
    import torch

    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    result.stdout.fnmatch_lines([
        f"*MemlabLeakWarning: {dev} leaked 8.0 KiB after teardown (allowed 0 B) in test_inner.py::test_grows[[]0[]],"
        " confirmed at the session's end",
        "*held by: module test_inner, global _GROWS[[]0[]]",
        f"*MemlabLeakWarning: {dev} leaked 8.0 KiB after teardown (allowed 0 B) in test_inner.py::test_grows[[]1[]],*",
        f"*2 tests left tensors allocated after teardown ({dev} leaks); see the warnings above",
        f"{dev} cache: 12.0 KiB kept by module test_inner, global _TABLE, filled by "
        "test_inner.py::test_uses_the_cache[[]dtype0[]] (and 1 later test adding keys of their own)",
    ])
    assert "test_cycle" not in out.split("warnings summary")[-1]
    report = json.loads((inner.path / "r.json").read_text())
    leaked = {t["nodeid"].split("::")[1]: t["devices"][dev]["leaked"] for t in report["tests"]}
    assert all(leaked[f"test_cycle[{i}]"] == 0 for i in range(20))
    assert leaked["test_grows[0]"] == leaked["test_grows[1]"] == 8 * 1024
    assert all(n == 0 for name, n in leaked.items() if name.startswith("test_uses_the_cache"))  # a cache, not a leak
    assert report["caches"] == [{"device": dev, "holder": "module test_inner, global _TABLE", "bytes": 12288,
                                 "tests": ["test_inner.py::test_uses_the_cache[dtype0]",
                                           "test_inner.py::test_uses_the_cache[dtype1]"]}]


def test_a_suspect_only_garbage_holds_at_the_end_is_settled_not_reported(inner):
    """Tensors that only garbage holds when the session ends (past the
    young collections: in the oldest generation) are no leak, even where
    that garbage is a class, whose attribute would read as a holder: the
    end settles the process first (one full collection) and finds nothing
    held; the module-held leak beside them is still named.  The collection
    is heard freeing the garbage's blocks, so the leak left is proven held
    from its module without a second walk of the heap (one walk in all:
    the search before the collection, which could not prove the garbage
    held)."""
    import json

    inner.makeconftest(COUNT_FULL_COLLECTIONS + COUNT_HEAP_WALKS)
    inner.makepyfile(test_inner=HEADER + """
import gc
DEV = "cuda" if torch.cuda.is_available() else "cpu"

class Node:
    pass

def test_grows():
    _CACHE.append(torch.empty(8 * KiB, dtype=torch.uint8, device=DEV))

def test_garbage():
    n = Node()
    n.me = n
    n.t = torch.empty(32 * KiB, dtype=torch.uint8, device=DEV)
    class Local:   # a class is always in a reference cycle
        pass
    Local.t = torch.empty(16 * KiB, dtype=torch.uint8, device=DEV)
    gc.collect()   # both alive now: promoted to the oldest generation
""")
    result = inner.runpytest_subprocess("-p", "no:randomly", "-s", "--memlab", "--memlab-json=r.json")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert ", at the end: 1" in out, out
    assert "heap walks at the end: 1" in out.splitlines(), out
    result.stdout.fnmatch_lines(["*MemlabLeakWarning: * leaked 8.0 KiB after teardown (allowed 0 B) in "
                                 "test_inner.py::test_grows, confirmed at the session's end",
                                 "*held by: module test_inner, global _CACHE[[]0[]]"])
    warnings = out.split("warnings summary")[-1]
    assert "test_garbage" not in warnings and "Local" not in warnings and "cache:" not in out, out
    tests = json.loads((inner.path / "r.json").read_text())["tests"]
    leaked = {t["nodeid"].split("::")[1]: sum(d["leaked"] for d in t["devices"].values()) for t in tests}
    assert leaked == {"test_grows": 8 * 1024, "test_garbage": 0}


def test_suspects_held_through_a_module_class_or_function_need_no_collection(inner):
    """A class attribute of a module's class and a closure variable of a
    module's function are held as surely as a global: confirmed at the end
    without a full collection, each named by its holder."""
    inner.makeconftest(COUNT_FULL_COLLECTIONS)
    inner.makepyfile(test_inner=HEADER + """
DEV = "cuda" if torch.cuda.is_available() else "cpu"

class Registry:
    kept = []

def make_keeper():
    kept = []
    def keep(t):
        kept.append(t)
    return keep

keep = make_keeper()

def test_class_attribute():
    Registry.kept.append(torch.empty(8 * KiB, dtype=torch.uint8, device=DEV))

def test_closure():
    keep(torch.empty(4 * KiB, dtype=torch.uint8, device=DEV))
""")
    result = inner.runpytest_subprocess("-p", "no:randomly", "-s", "--memlab")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert ", at the end: 0" in out, out
    result.stdout.fnmatch_lines([
        "*leaked 8.0 KiB after teardown (allowed 0 B) in test_inner.py::test_class_attribute, confirmed*",
        "*held by: class test_inner.Registry, attribute kept[[]0[]]",
        "*leaked 4.0 KiB after teardown (allowed 0 B) in test_inner.py::test_closure, confirmed*",
        "*held by: closure of test_inner.make_keeper.<locals>.keep (variable kept)[[]0[]]",
    ])


PARAMETER_STATE = """
DEV = "cuda" if torch.cuda.is_available() else "cpu"

class Augment:
    \"\"\"Keeps its last call's parameters on itself, as kornia's augmentations do.\"\"\"
    def __call__(self, x):
        self._params = {"noise": torch.empty(KiB, dtype=torch.uint8, device=DEV)}
        return x

AUGMENTS = [Augment(), Augment()]   # built once: every test that names one shares it

@pytest.mark.parametrize("aug", AUGMENTS)
@pytest.mark.parametrize("n", range(3))
def test_augment(aug, n):
    aug(torch.ones(4))

@pytest.mark.parametrize("pipeline", [[Augment()], [Augment()]])
def test_pipeline(pipeline):
    for aug in pipeline:
        aug(torch.ones(4))

def test_grows():
    _CACHE.append(torch.empty(2 * KiB, dtype=torch.uint8, device=DEV))
"""


def test_state_a_test_leaves_on_its_parameters_is_a_cache_not_a_leak(inner):
    """An object from a parametrize list serves every test that names it,
    and pytest holds it for the whole session: what a test leaves on it
    (the last call's state, replaced by the next) is held by that
    parameter, named so, reported once per parameter as a cache, and told
    from garbage without a full collection.  A real leak beside it is
    still named."""
    import json

    inner.makeconftest(COUNT_FULL_COLLECTIONS)
    inner.makepyfile(test_inner=HEADER + PARAMETER_STATE)
    result = inner.runpytest_subprocess("-p", "no:randomly", "-s", "--memlab", "--memlab-json=r.json")
    result.assert_outcomes(passed=9)
    out = result.stdout.str()
    assert ", at the end: 0" in out, out
    warnings = out.split("warnings summary")[-1].split("= memlab =")[0]
    assert "test_augment" not in warnings and "test_pipeline" not in warnings, out
    result.stdout.fnmatch_lines(["*leaked 2.0 KiB after teardown (allowed 0 B) in test_inner.py::test_grows, confirmed*",
                                 "*held by: module test_inner, global _CACHE[[]0[]]",
                                 "* cache: 2.0 KiB kept by test test_inner.py::test_augment, parameter aug, filled by "
                                 "test_inner.py::test_augment[[]2-aug0[]] (and 1 later test on values of their own)"])
    report = json.loads((inner.path / "r.json").read_text())
    caches = {c["holder"]: (c["bytes"], c["tests"]) for c in report["caches"]}
    assert caches == {
        "test test_inner.py::test_augment, parameter aug": (
            2 * 1024, ["test_inner.py::test_augment[2-aug0]", "test_inner.py::test_augment[2-aug1]"]),
        "test test_inner.py::test_pipeline, parameter pipeline": (
            2 * 1024, ["test_inner.py::test_pipeline[pipeline0]", "test_inner.py::test_pipeline[pipeline1]"]),
    }, report["caches"]
    leaked = {t["nodeid"].split("::")[1]: sum(d["leaked"] for d in t["devices"].values()) for t in report["tests"]}
    assert leaked["test_grows"] == 2 * 1024 and sum(leaked.values()) == 2 * 1024, leaked


def test_suspects_under_xdist_and_warnings_as_errors(inner):
    pytest.importorskip("xdist")
    inner.makepyfile(test_inner=HEADER + CYCLES_CACHES_LEAKS)
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab", "-n", "2", "-W", "error::pytest_memlab.MemlabLeakWarning")
    result.assert_outcomes(passed=27)
    assert result.ret == 0
    for line in ("*test_grows[[]0[]]: * leaked 8.0 KiB after teardown (allowed 0 B) (its MemlabLeakWarning was "
                 "raised as an error by the warnings filter)",   # the workers' order is theirs
                 "*test_grows[[]1[]]: * leaked 8.0 KiB after teardown*raised as an error by the warnings filter)",
                 "* cache: * kept by module test_inner, global _TABLE, filled by *"):
        result.stdout.fnmatch_lines([line])
    assert "test_cycle" not in result.stdout.str().split("= memlab =")[-1]


def test_a_warned_leak_under_warnings_as_errors_is_said_plainly(inner):
    """A leak found at the test's own teardown (here: a growing leak of
    --memlab-leak-repeat) keeps the outcome, and says it leaked."""
    result = run(inner, """
@pytest.fixture(scope="module")
def cache():
    return []

def test_grows(cache):   # on the device --memlab measures an unmarked test on
    cache.append(torch.empty(4 * KiB, dtype=torch.uint8, device="cuda" if torch.cuda.is_available() else "cpu"))
""", "--memlab", "--memlab-leak-repeat=2", "-W", "error::pytest_memlab.MemlabLeakWarning")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["test_inner.py::test_grows: * kept 4.0 KiB more after every repetition*"
                                 "(its MemlabLeakWarning was raised as an error by the warnings filter)"])
    assert "judging failed" not in result.stdout.str()


def test_a_suspect_freed_during_a_later_measured_test_says_0(inner):
    """A cycle freed while a later test is measured (heard: its address is
    no longer watched) is no leak, and its test's figure says so."""
    import json

    result = run(inner, """
DEV = "cuda" if torch.cuda.is_available() else "cpu"

class Node:
    pass

def test_cycle():
    import gc
    n = Node()
    n.me = n
    n.t = torch.empty(32 * KiB, dtype=torch.uint8, device=DEV)
    gc.collect()   # alive now: promoted to the oldest generation, past a young collection

def test_collects():
    import gc
    gc.collect()
""", "--memlab", "--memlab-json=r.json")
    result.assert_outcomes(passed=2)
    assert "MemlabLeakWarning" not in result.stdout.str()
    tests = json.loads((inner.path / "r.json").read_text())["tests"]
    assert [d["leaked"] for t in tests for d in t["devices"].values()] == [0, 0]


def test_the_middle_generation_is_collected_only_where_the_collector_ran_during_the_test(inner):
    """The leak check's collection of the middle generation only where a
    collection came during the test: an explicit one moves whatever is alive
    into the oldest generation, and brings its next full collection (0.3 s
    on a large heap) nearer.  Where none came, everything the test made is
    still in the youngest.  A cycle that the test's own collection moved
    into the middle generation is still freed there and says 0.  (The
    collector's automatic collections are off in this run, so that which
    test meets one is not left to chance.)"""
    inner.makeconftest("""
import gc, sys

MIDDLE = []
_collect = gc.collect

def _counting(generation=2):
    if generation == 1 and sys._getframe(1).f_globals.get("__name__", "").startswith("pytest_memlab"):
        MIDDLE.append(1)
    return _collect(generation)

gc.collect = _counting
gc.disable()

def pytest_unconfigure(config):
    gc.enable()
    print(f"memlab's middle collections: {len(MIDDLE)}")
""")
    result = run(inner, """
DEV = "cuda" if torch.cuda.is_available() else "cpu"   # what --memlab measures an unmarked test on

class Node:
    pass

_TABLE = {}

@pytest.mark.parametrize("i", range(3))
def test_cache(i):   # over at first sight, and no collection came during the test
    _TABLE[i] = torch.ones(1024, device=DEV)

def test_cycle_in_the_middle_generation():
    import gc
    n = Node()
    n.me = n
    n.t = torch.empty(32 * KiB, dtype=torch.uint8, device=DEV)
    gc.collect(0)   # alive now: moved into the middle generation
""", "-s", "--memlab", "--memlab-json=r.json")
    result.assert_outcomes(passed=4)
    out = result.stdout.str()
    assert "memlab's middle collections: 1" in out, out   # 4 before: one for each test over at first sight
    assert "MemlabLeakWarning" not in out, out
    report = json.loads((inner.path / "r.json").read_text())
    leaked = {t["nodeid"].split("::")[1]: [d["leaked"] for d in t["devices"].values()] for t in report["tests"]}
    assert leaked["test_cycle_in_the_middle_generation"] == [0]


def test_a_storage_address_is_read_without_making_the_storage_object():
    """storage_address says what untyped_storage().data_ptr() says, for
    views at an offset, of other dtypes, transposed; and it makes no
    storage object (torch keeps one made for as long as the storage lives:
    the end's search made one for every live tensor it looked at)."""
    import gc

    import torch

    from pytest_memlab.engine.heap import storage_address

    base = torch.arange(64, dtype=torch.float32)
    views = [base, base[5:], base[7:20:3], base.view(8, 8).t()[2:], torch.zeros(6, dtype=torch.complex64)[1:],
             torch.ones(9, dtype=torch.bool)[4:], torch.empty(0)]
    fresh = [torch.randn(4, 4)[1:] for _ in range(20)]

    def storages():
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) is torch.UntypedStorage)

    before = storages()
    addresses = [storage_address(t) for t in fresh]
    assert storages() == before
    assert addresses == [t.untyped_storage().data_ptr() for t in fresh]
    assert [storage_address(t) for t in views] == [t.untyped_storage().data_ptr() for t in views]


def test_the_end_finds_what_modules_hold_without_walking_the_heap(monkeypatch):
    """The end's search looks below modules' globals first: tensors a
    module's list or dict holds are proven held and named as the heap's
    search names them; a block no module reaches sends the end to the
    heap's search (None); a global whose class warns when read is not
    read (the search would otherwise print a warning in the user's run)."""
    import sys
    import types
    import warnings

    import torch

    from pytest_memlab.measuring import leak_search

    def block(t):
        storage = t.untyped_storage()
        return (storage.data_ptr(), storage.nbytes(), None, 0)

    class Warns:
        @property
        def __class__(self):
            warnings.warn("deprecated", FutureWarning)
            return Warns

    held, cached, alone = torch.ones(3), torch.ones(5), torch.ones(7)
    module = types.ModuleType("memlab_fake_holder")
    module.HELD = [held]
    module.CACHE = {("float32", 5): cached}
    module.OLD = Warns()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    starts = sorted([block(held), block(cached)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensors, named = leak_search._held_from_modules(torch, "cpu", starts, [s[0] for s in starts])
    assert sorted(id(t) for _, t in tensors) == sorted([id(held), id(cached)])
    assert named[id(held)] == ["module memlab_fake_holder, global HELD[0]"]
    assert named[id(cached)] == ["module memlab_fake_holder, global CACHE[<tuple>]"]
    # the heap's search names them alike
    paths = leak_search.holders_of([held, cached], set(), deadline=float("inf"), limit=1)
    assert paths[id(held)] == named[id(held)] and paths[id(cached)] == named[id(cached)]
    starts = sorted([block(held), block(alone)])
    assert leak_search._held_from_modules(torch, "cpu", starts, [s[0] for s in starts]) is None


def test_the_walk_reads_items_by_their_own_types_in_order_up_to_the_limit():
    """The walk's reading of a container (in C): an item that is a tensor
    of any subclass, or exactly a built-in container, is picked, in the
    container's order, with its dict key, its index, or None in a set; a
    container's subclass (its code could run) and everything else are
    passed over; no __class__ is read; only the first limit items are
    read."""
    import collections
    import warnings

    import torch

    from pytest_memlab.engine.heap import items_of_kinds

    class Warns:
        @property
        def __class__(self):
            warnings.warn("deprecated", FutureWarning)
            return torch.Tensor

    param = torch.nn.Parameter(torch.ones(2))
    plain = torch.ones(3)
    values = {"f": len, "param": param, "n": 3, "cache": {}, "ordered": collections.OrderedDict(),
              "old": Warns(), "rows": [plain], "pair": (1, 2), "q": collections.deque(), "plain": plain,
              "members": frozenset()}
    containers = (dict, list, tuple, collections.deque, set, frozenset)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picked = items_of_kinds(values, torch.Tensor, containers, len(values))
        in_list = items_of_kinds(list(values.values()), torch.Tensor, containers, 100)
        in_deque = items_of_kinds(collections.deque([1, plain, []]), torch.Tensor, containers, 100)
        in_set = items_of_kinds({plain, "x"}, torch.Tensor, containers, 100)
    assert [(k, v is values[k], t) for k, v, t in picked] == [
        ("param", True, True), ("cache", True, False), ("rows", True, False), ("pair", True, False),
        ("q", True, False), ("plain", True, True), ("members", True, False)]
    assert [(k, t) for k, _, t in in_list] == [(1, True), (3, False), (6, False), (7, False), (8, False),
                                               (9, True), (10, False)]
    assert [(k, v is plain, t) for k, v, t in in_deque] == [(1, True, True), (2, False, False)]
    assert [(k, v is plain, t) for k, v, t in in_set] == [(None, True, True)]
    # the limit counts every item read, picked or not
    assert [k for k, _, _ in items_of_kinds(values, torch.Tensor, containers, 4)] == ["param", "cache"]
    assert items_of_kinds(values, torch.Tensor, containers, 0) == []


def test_the_end_searches_only_blocks_a_tensor_can_live_in(monkeypatch):
    """A block the allocator no longer holds (alive, from its snapshot)
    has no tensor: the walk below the modules needs none for it, and with
    no block alive it is not taken at all.  A search that finds no tensor
    in the blocks builds no index of the heap (holders_of is not asked),
    and says what it always said: bytes no tensor owns."""
    import torch

    from pytest_memlab.measuring import leak_search

    held, alone = torch.ones(64), torch.ones(32)
    blocks = []
    for t in (held, alone):
        storage = t.untyped_storage()
        blocks.append((storage.data_ptr(), storage.nbytes(), None, 0))
    starts = sorted(blocks)
    addrs = [s[0] for s in starts]
    # alone's block is not alive: held's alone must be found, and a module holds it
    import sys
    import types

    module = types.ModuleType("memlab_alive_holder")
    module.HELD = [held]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    tensors, named = leak_search._held_from_modules(torch, "cpu", starts, addrs, frozenset([blocks[0][0]]))
    assert [t for _, t in tensors] == [held]
    assert named[id(held)] == ["module memlab_alive_holder, global HELD[0]"]
    # every block alive: alone's has no module's path, and the heap is searched
    assert leak_search._held_from_modules(torch, "cpu", starts, addrs, frozenset(addrs)) is None
    # no block alive: nothing to look for
    visits = []
    monkeypatch.setattr(leak_search, "_module_dict", lambda *a: visits.append(a))
    assert leak_search._held_from_modules(torch, "cpu", starts, addrs, frozenset()) == ([], {})
    assert visits == []
    monkeypatch.undo()

    # blocks of freed tensors: the heap's search finds no tensor and asks holders_of nothing
    gone = torch.ones(1000)
    storage = gone.untyped_storage()
    freed = [(storage.data_ptr(), storage.nbytes(), None, 0)]
    del gone, storage
    asked = []
    real = leak_search.holders_of
    monkeypatch.setattr(leak_search, "holders_of", lambda *a, **k: asked.append(a) or real(*a, **k))
    leak = leak_search.find_many(types.SimpleNamespace(torch=torch), "cpu", [(freed, 0)])[0]
    assert asked == []
    assert leak.bytes == 0 and leak.outside == 4000
    # a tensor in a block: the holders are asked for it
    leak = leak_search.find_many(types.SimpleNamespace(torch=torch), "cpu", [([blocks[0]], 0)])[0]
    assert len(asked) == 1 and leak.bytes == 256


def test_the_search_imports_no_lazy_module(tmp_path, monkeypatch):
    """A lazy module (importlib.util.LazyLoader) runs its code when an
    attribute is read through it: the end's searches read its globals past
    its class, and it stays unimported."""
    import importlib.util
    import sys

    import torch

    from pytest_memlab.measuring import leak_search

    (tmp_path / "memlab_lazy_probe.py").write_text("import os\nos.environ['MEMLAB_LAZY_RAN'] = '1'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("MEMLAB_LAZY_RAN", raising=False)
    spec = importlib.util.find_spec("memlab_lazy_probe")
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "memlab_lazy_probe", module)
    spec.loader.exec_module(module)
    alone = torch.ones(3)
    storage = alone.untyped_storage()
    starts = [(storage.data_ptr(), storage.nbytes(), None, 0)]
    assert leak_search._held_from_modules(torch, "cpu", starts, [starts[0][0]]) is None
    assert leak_search._module_dicts()
    assert "MEMLAB_LAZY_RAN" not in __import__("os").environ


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_waits_from_the_sessions_end_to_unconfigure_and_is_left_as_found(pytester, enabled):
    """From memlab's session end (the leak check's batch, the reports)
    through pytest's unconfigure and the cleanups of plugins configured
    after memlab, the collector makes no automatic collection: those
    temporaries would trigger a full collection on a large heap just before
    pytest's own (its unraisable-exception plugin's: at unconfigure in
    pytest 9, in such a cleanup in 8.4).  The leak is still confirmed and
    told; after the cleanups the collector is as memlab found it, disabled
    by the suite's conftest or not."""
    pytester.makeconftest(f"""
import gc, pytest
SEEN = {{}}

def pytest_configure(config):
    if not {enabled}:
        gc.disable()
    config.add_cleanup(lambda: print("COLLECTOR", SEEN.get("summary"), SEEN.get("unconfigure"),
                                     SEEN.get("late cleanup"), gc.isenabled()))

def pytest_sessionstart(session):   # a cleanup registered after memlab's, as pytest's own plugins' are
    session.config.add_cleanup(lambda: SEEN.setdefault("late cleanup", gc.isenabled()))

def pytest_terminal_summary(terminalreporter):
    SEEN["summary"] = gc.isenabled()

def pytest_unconfigure(config):
    SEEN["unconfigure"] = gc.isenabled()
""")
    # --memlab measures the GPU where there is one, else the CPU: the leak is made where it measures
    import torch

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    result = run(pytester, f"\ndef test_keeps():\n    _CACHE.append(cpu_bytes(64 * KiB).to('{device}'))\n",
                 "--memlab", "-s", subprocess=True)
    result.assert_outcomes(passed=1, warnings=1)
    assert f"{device} leaked 64.0 KiB after teardown" in result.stdout.str()
    assert f"COLLECTOR False False False {enabled}" in result.stdout.str()
    # a session memlab measured nothing in (no --memlab, no marker) keeps its collector as it was
    result = run(pytester, "\ndef test_keeps():\n    _CACHE.append(cpu_bytes(64 * KiB))\n", "-s", subprocess=True)
    result.assert_outcomes(passed=1)
    assert f"COLLECTOR {enabled} {enabled} {enabled} {enabled}" in result.stdout.str()


def test_the_collector_resumes_where_another_plugins_unconfigure_raises(pytester):
    """An in-process run (pytester's) whose conftest's unconfigure raises
    before memlab's: the collector is enabled again all the same (pytest's
    cleanup), so the process that ran the session keeps collecting."""
    import gc

    pytester.makeconftest("""
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    raise RuntimeError("a conftest's unconfigure fails")
""")
    assert gc.isenabled()
    try:
        run(pytester, "\ndef test_nothing():\n    pass\n", "--memlab")
    except RuntimeError:
        pass
    assert gc.isenabled()


@pytest.mark.skipif(has_cuda(), reason="--memlab measures an unmarked test on CUDA there")
def test_memory_a_suspect_freed_unheard_that_a_later_leak_reuses_is_no_leak_of_the_suspect(inner):
    """A function fixture's value is a suspect after its test's teardown
    (pytest drops it only after the test's protocol, while memlab does not
    listen).  A tensor made between tests (unheard) that the heap places
    inside that freed block, not at its start, and that lives to the
    session's end, is not the suspect's: a block's own storage starts at
    the block; one inside it is another allocation.  (A failed test's
    traceback holding such a tensor made a plain test's figures differ from
    the general path's, 1 run in 4.)"""
    import json

    inner.makeconftest("""
import torch

SPOT = []
FOUND = []

def pytest_runtest_logstart(nodeid):
    # between tests, unheard (as Python's and pytest's own allocations are):
    # small tensors until the heap places one inside the fixture's freed block
    if not nodeid.endswith("test_after") or not SPOT:
        return
    start, tries = SPOT[0], []
    for _ in range(20000):           # held, so that the heap splits its free blocks, the freed one among them
        t = torch.ones(1)
        if start < t.data_ptr() < start + 32 * 1024:
            FOUND.append(t)           # kept to the session's end
            return
        tries.append(t)
""")
    result = run(inner, """
from conftest import SPOT, FOUND

@pytest.fixture
def scratch():
    t = torch.zeros(8192)            # 32 KiB, held by pytest until its test's protocol ends
    SPOT.append(t.data_ptr())
    yield t

def test_fixture(scratch):
    assert scratch.sum() == 0

def test_after():
    if not FOUND:
        pytest.skip("the heap placed no small block inside the freed one")
""", "--memlab", "--memlab-json=r.json")
    out = result.stdout.str()
    if "skipped" in out.splitlines()[-1]:
        pytest.skip("this heap placed no small block inside the freed one")
    result.assert_outcomes(passed=2)
    report = json.loads((inner.path / "r.json").read_text())
    leaked = {t["nodeid"].split("::")[1]: [d.get("leaked") for d in t["devices"].values()] for t in report["tests"]}
    assert leaked["test_fixture"] == [0], out
    assert "MemlabLeakWarning" not in out, out


@pytest.mark.skipif(has_cuda(), reason="--memlab measures an unmarked test on CUDA there")
def test_a_leaks_sites_of_equal_bytes_read_in_the_order_of_their_lines(inner):
    """Sites (and tensors) that leaked as many bytes are listed by their
    chains, not by their blocks' addresses, which change from run to run:
    the same leak reads the same in every run."""
    result = run(inner, """
_HELD = []

def upper():
    return cpu_bytes(4 * KiB)     # the lower line number, allocated second

def lower():
    return cpu_bytes(4 * KiB)

def test_leaks_two():
    _HELD.append(lower())
    _HELD.append(upper())
""", "--memlab")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert out.index(" upper: return cpu_bytes") < out.index(" lower: return cpu_bytes"), out
