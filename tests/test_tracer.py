"""The tracer on the running interpreter's path (sys.monitoring on 3.12+,
PyEval_SetTrace before), with allocations injected where torch would report
them.  Needs no torch: ci/test runs it on every Python it finds."""

import asyncio
import contextlib
import copy
import gc
import importlib.util
import os
import sys
import threading
import time

import pytest

from pytest_memlab import _engine as E
from pytest_memlab.engine.attribution import Attribution, chain_of, line_stats
from pytest_memlab.engine.tracing import tracing

from injected_allocator import alloc, free

CPU = E.SLOT_CPU
HERE = os.path.realpath(__file__)


def where(chain):
    return [(f.function.rsplit(".", 1)[-1], f.line) for f in chain]


def line_of(fn, text):
    """The line number of the line of fn's source that contains text."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    for i, src in enumerate(lines):
        if text in src:
            return first + i
    raise AssertionError(f"{text!r} not in {fn.__name__}")


def user_module(folder, name, source):
    """A module of source written as folder/name.py and imported (its
    functions' code names that file: in scope where the tests say so)."""
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def run_traced(folder, include, fn, *args, added=()):
    """fn(*args) under the tracer, with folder the rootdir and include in
    scope, inside a CPU scope; returns the scope's figures.  added: code
    objects that fn adds to the scope (released after).  fn is called from
    here, a frame that began before tracing: no frame of the tests' own
    joins the chains they read."""
    tracing.scope.configure(str(folder), include)
    sid = E.begin(CPU)
    assert tracing.acquire(paths=True)
    E.tracer_reset_lines()
    try:
        fn(*args)
    finally:
        tracing.release(paths=True, codes=list(added))
        result = E.end(CPU, sid)
    return result


def lines_allocated(folder, include, code, *bodies, added=()):
    """Runs bodies under the tracer (run_traced), the first on this thread
    and each other on a thread of its own, all at once; returns line ->
    bytes allocated there for code."""
    def all_at_once():
        others = [threading.Thread(target=body) for body in bodies[1:]]
        for t in others:
            t.start()
        bodies[0]()
        for t in others:
            t.join()

    run_traced(folder, include, all_at_once, added=added)
    return {s.frame.line: s.allocated for s in line_stats(CPU, allocated_only=True) if s.code is code}


@pytest.fixture
def traced(monkeypatch):
    """Runs fn under the tracer with this file in scope, inside a CPU scope."""
    if tracing.conflict():
        pytest.skip(tracing.conflict())

    def run(fn, *args):
        result = run_traced(os.path.dirname(HERE), (HERE,), fn, *args)
        return result, Attribution(result)

    return run


def helper(n):
    return alloc(n)  # helper allocates


def calls_helper():
    a = helper(1000)  # caller
    b = alloc(500)  # direct
    free(a, 1000)
    free(b, 500)


def test_a_helper_allocation_names_the_helper_and_its_caller(traced):
    r, attribution = traced(calls_helper)
    assert r["peak"] == 1500
    assert attribution.at_peak[0].bytes == 1000
    assert where(attribution.at_peak[0].chain) == [
        ("helper", line_of(helper, "helper allocates")),
        ("calls_helper", line_of(calls_helper, "# caller")),
    ]
    assert where(attribution.at_peak[1].chain) == [("calls_helper", line_of(calls_helper, "# direct"))]
    assert where(attribution.peak_chain) == [("calls_helper", line_of(calls_helper, "# direct"))]


def gen(n):
    for _ in range(n):
        yield alloc(100)  # generator line


def consumes_generator():
    blocks = []
    for block in gen(3):
        blocks.append(block)  # consumer
        alloc(10)  # between yields
    return blocks


def test_generators_are_followed_across_yields(traced):
    r, attribution = traced(consumes_generator)
    assert r["peak"] == 330
    by_chain = {tuple(where(s.chain)): s.bytes for s in attribution.at_peak}
    assert by_chain[(("gen", line_of(gen, "generator line")),
                     ("consumes_generator", line_of(consumes_generator, "for block in gen")))] == 300
    assert by_chain[(("consumes_generator", line_of(consumes_generator, "between yields")),)] == 30


async def inner_coro():
    await asyncio.sleep(0)
    return alloc(64)  # in the coroutine


async def outer_coro():
    a = await inner_coro()  # awaits
    await asyncio.sleep(0)
    return a


def runs_coroutines():
    asyncio.run(outer_coro())


def test_coroutines_keep_their_awaiting_chain(traced):
    r, attribution = traced(runs_coroutines)
    assert r["peak"] == 64
    assert where(attribution.at_peak[0].chain)[:2] == [
        ("inner_coro", line_of(inner_coro, "in the coroutine")),
        ("outer_coro", line_of(outer_coro, "# awaits")),
    ]


def recurse(n):
    if n == 0:
        return alloc(7)  # bottom
    return recurse(n - 1)


def deep_then_shallow():
    recurse(300)  # deeper than the shadow stack keeps
    alloc(11)  # after the recursion


def test_recursion_deeper_than_the_stack_unwinds_cleanly(traced):
    r, attribution = traced(deep_then_shallow)
    assert r["peak"] == 18
    chains = {s.bytes: where(s.chain) for s in attribution.at_peak}
    assert chains[11] == [("deep_then_shallow", line_of(deep_then_shallow, "after the recursion"))]
    assert chains[7][0][0] == "recurse"


def raises_after_alloc():
    alloc(40)  # before raising
    raise ValueError("boom")


def catches():
    try:
        raises_after_alloc()  # call that raises
    except ValueError:
        pass
    alloc(2)  # after the handler


def test_exceptions_unwinding_through_traced_frames(traced):
    r, attribution = traced(catches)
    chains = {s.bytes: where(s.chain) for s in attribution.at_peak}
    assert chains[40] == [("raises_after_alloc", line_of(raises_after_alloc, "before raising")),
                          ("catches", line_of(catches, "call that raises"))]
    assert chains[2] == [("catches", line_of(catches, "after the handler"))]


def thread_body():
    alloc(1234)  # in the thread


def spawns_thread():
    t = threading.Thread(target=thread_body)
    t.start()
    t.join()  # waiting


def test_threads(traced):
    r, attribution = traced(spawns_thread)
    chain = where(attribution.at_peak[0].chain)
    if sys.version_info >= (3, 12):  # sys.monitoring sees every thread
        assert chain == [("thread_body", line_of(thread_body, "in the thread"))]
    else:  # the trace function is per thread: the measuring thread's line
        assert chain[0][0] == "spawns_thread"


class CopiesItself:
    def __deepcopy__(self, memo):
        return alloc(300)  # called back by copy.py


@contextlib.contextmanager
def holding(n):
    block = alloc(n)  # the context manager's body
    try:
        yield block
    finally:
        free(block, n)


def through_library_code():
    with holding(700):  # enters through contextlib
        copy.deepcopy(CopiesItself())  # copy.py calls back


def test_user_code_called_back_by_library_code_keeps_its_chain(traced):
    """User frames that out-of-scope Python code calls (copy.py, contextlib:
    on 3.11 the frame hook runs those untraced) are traced, and their chains
    skip the library's frames to the user line that called it."""
    r, attribution = traced(through_library_code)
    assert r["peak"] == 1000
    chains = {s.bytes: where(s.chain) for s in attribution.at_peak}
    assert chains[700] == [("holding", line_of(holding, "context manager's body")),
                           ("through_library_code", line_of(through_library_code, "enters through contextlib"))]
    assert chains[300] == [("__deepcopy__", line_of(CopiesItself.__deepcopy__, "called back by copy.py")),
                           ("through_library_code", line_of(through_library_code, "copy.py calls back"))]


# Out of scope by its file name (the scope is this file): what its frame
# says about line tracing.
_PROBE = {}
exec(compile("import sys\ndef probe():\n    return sys._getframe().f_trace_lines\n",
             "/nonexistent/library/probe.py", "exec"), _PROBE)


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the frame hook is 3.11's")
def test_out_of_scope_frames_run_without_the_trace_function_on_311(traced):
    """The trace function never hears a library frame: it would have turned
    the frame's line events off (f_trace_lines False) on its call event."""
    seen = {}

    def user():
        seen["status"] = E.tracer_status()
        seen["lines"] = _PROBE["probe"]()

    traced(user)
    assert seen["status"]["eval_hook"] is True
    assert seen["lines"] is True
    assert E.tracer_status()["eval_hook"] is False   # out with the window


def deep(n):
    return 0 if n == 0 else deep(n - 1) + 1


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the frame hook is 3.11's")
def test_a_raised_recursion_limit_keeps_the_hook_out(traced):
    """With the hook in, every Python call takes C stack: a test that raised
    the recursion limit far past the default recurses as deep as unmeasured."""
    seen = {}

    def user():
        seen["hook"] = E.tracer_status()["eval_hook"]
        seen["depth"] = deep(12000)

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        traced(user)
    finally:
        sys.setrecursionlimit(old)
    assert seen == {"hook": False, "depth": 12000}


def loops():
    for i in range(5):
        alloc(3)  # loop body


def test_line_stats_count_bytes_and_peaks_found_at_allocation(traced):
    """The plugin's scope (the path rule): user code has no line events
    where frames can be located (3.11, 3.12+); each line is found when it
    allocates, and only lines that allocated are listed."""
    traced(loops)
    stats = {(s.frame.function, s.frame.line): s for s in line_stats(CPU)}
    body = stats[("loops", line_of(loops, "loop body"))]
    assert body.allocated == 15
    assert body.peak_total == 15
    loop_line = ("loops", line_of(loops, "for i in range"))
    if E.tracer_status()["located"]:
        assert body.hits == 0
        assert loop_line not in stats
    else:   # 3.10: every line traced
        assert body.hits == 5
        assert stats[loop_line].hits == 6


def many_lines():
    alloc(5)  # line a
    alloc(7)  # line b
    alloc(5)  # line c
    alloc(9)  # line d
    for _ in range(2):
        alloc(4)  # line e
    alloc(7)  # line f
    alloc(1)  # line g
    alloc(8)  # line h


@pytest.mark.parametrize("top", [1, 2, 3, 4, 5, 7, 8, 9, 64, 65])
def test_the_top_lines_are_a_stable_sort_of_every_line_heaviest_first(traced, top):
    """The reports' heaviest lines, picked in C (top > 0), are what a
    stable sort of every line that allocated, heaviest first, keeps: ties
    in the order the full list has them, and every line where top is more
    than the lines (or more than the C side keeps: then every line)."""
    traced(many_lines)
    every = line_stats(CPU, allocated_only=True)
    expected = sorted(every, key=lambda s: s.allocated, reverse=True)[:top]
    got = line_stats(CPU, allocated_only=True, top=top)
    if top > 64:
        got = sorted(got, key=lambda s: s.allocated, reverse=True)[:top]
    assert [(s.frame.line, s.allocated, s.peak_total, s.hits) for s in got] == \
        [(s.frame.line, s.allocated, s.peak_total, s.hits) for s in expected]
    assert {s.frame.line for s in every} >= {line_of(many_lines, f"line {c}") for c in "abcdefgh"}
    # the ties (5 on a and c, 7 on b and f) keep the order of the full list
    ranked = [s.frame.line for s in line_stats(CPU, allocated_only=True, top=8) if s.code is many_lines.__code__]
    by_line = {s.frame.line: s.allocated for s in every}
    assert ranked == [ln for ln in sorted(by_line, key=lambda ln: -by_line[ln]) if ln in ranked]
    with pytest.raises(ValueError, match="top must be 0"):
        E.tracer_line_stats(CPU, True, -1)


def test_lines_found_at_allocation_stay_exact_on_a_function_that_allocates_on_many_lines(tmp_path):
    """A located frame's lines are read from a table of its code's
    instructions, made at the first lookup by whichever thread allocates
    first (csrc/tracer_internal.h, CodeLines; it replaced a cache of 16
    lookups, which this order made evict one another again and again): a
    function that allocates on 40 lines, from the measuring thread and,
    where sys.monitoring follows every thread, from another one at once,
    has each line charged its own bytes and no other's."""
    if tracing.conflict():
        pytest.skip(tracing.conflict())
    lines = 40
    body = "".join(f"    if {i} in which:\n        alloc({i + 1})  # line {i}\n" for i in range(lines))
    path, module = user_module(tmp_path, "many_allocating_lines",
                               "from injected_allocator import alloc\n\n\ndef allocate(which):\n" + body)
    first = module.allocate.__code__.co_firstlineno
    line_number = {i: first + 2 + 2 * i for i in range(lines)}
    orders = [list(range(lines)), list(range(lines - 1, -1, -1)),
              [i for k in range(4) for i in range(k, lines, 4)]]
    calls = [{i} for order in orders for i in order] + [set(range(0, lines, 3)), set(range(lines))]
    expected = {}
    for which in calls:
        for i in which:
            expected[i] = expected.get(i, 0) + i + 1

    def run_calls():
        for which in calls:
            module.allocate(which)

    # Before 3.12 another thread's allocations go to the measuring thread's
    # line of the moment (test_threads): one thread there.
    threads = 2 if sys.version_info >= (3, 12) else 1
    got = lines_allocated(tmp_path, (str(path),), module.allocate.__code__, *[run_calls] * threads)
    assert got == {line_number[i]: threads * b for i, b in expected.items()}
    if E.tracer_status()["located"]:
        assert E.tracer_status()["line_tables"] == 1   # the tables, not the scans, read these lines


def test_functions_made_and_freed_again_and_again_are_each_decided_on_their_own(tmp_path):
    """3.11's frame hook keeps the decisions it read last by code object
    (csrc/tracer_settrace.c, HookDecision): a code freed and another made
    at its address, in scope where the first was not, is decided anew.
    300 functions made, called and dropped in turn, every other one in
    scope (the tracer keeps in-scope codes alive, so the addresses an
    in-scope code takes were an out-of-scope one's): each in-scope one's
    bytes go to its line, and no line of the out-of-scope file is charged."""
    if tracing.conflict():
        pytest.skip(tracing.conflict())
    inside = tmp_path / "inside.py"
    inside.write_text("def f():\n    alloc(1)\n")
    outside = "/memlab-nowhere/outside.py"

    freed, reused = set(), []

    def churn():
        for i in range(300):
            namespace = {"alloc": alloc}
            exec(compile(f"def f():\n    alloc({i + 1})\n", str(inside) if i % 2 == 0 else outside, "exec"),
                 namespace)
            address = id(namespace["f"].__code__)
            if i % 2 == 0 and address in freed:
                reused.append(address)
            namespace["f"]()
            namespace.clear()   # the function, and its code unless the tracer keeps it (in scope)
            if i % 2:
                freed.add(address)

    run_traced(tmp_path, (str(inside),), churn)
    assert reused   # in-scope codes were made where out-of-scope ones had been
    charged = {}
    for s in line_stats(CPU, allocated_only=True):
        key = (s.code.co_filename, s.lineno)
        charged[key] = charged.get(key, 0) + s.allocated
    assert charged == {(str(inside), 2): sum(i + 1 for i in range(0, 300, 2))}


ONE_ALLOCATION = "from injected_allocator import alloc\n\n\ndef allocate():\n    alloc(100)  # the line\n"


def test_two_threads_that_start_one_function_at_once_both_keep_its_lines(tmp_path, monkeypatch):
    """sys.monitoring: a function's scope is decided once, in Python, and
    the deciding thread may let the GIL go in the middle (here: a slow
    look at its file).  Another thread that starts the same function then
    waits for that decision, instead of reading the half-made one as "out
    of scope", which would turn the function's events off for good and
    leave every later call of it, on every thread, without its lines."""
    if sys.version_info < (3, 12):
        pytest.skip("before 3.12 only the measuring thread is traced: one thread decides")
    if tracing.conflict():
        pytest.skip(tracing.conflict())
    path, module = user_module(tmp_path, "started_at_once", ONE_ALLOCATION)
    scope = tracing.scope
    in_scope = scope.file_in_scope

    def slowly(filename):
        if os.path.basename(filename) == path.name:
            time.sleep(0.2)   # the GIL goes to the other thread, which starts allocate too
        return in_scope(filename)

    monkeypatch.setattr(scope, "file_in_scope", slowly)
    both = threading.Barrier(2)

    def calls():
        both.wait()
        for _ in range(5):
            module.allocate()

    got = lines_allocated(tmp_path, (str(path),), module.allocate.__code__, calls, calls)
    assert got == {module.allocate.__code__.co_firstlineno + 1: 2 * 5 * 100}


def test_rules_that_change_while_a_function_is_decided_decide_it_again(tmp_path, monkeypatch):
    """A function decided out of scope while another thread adds it to the
    scope (tracing.extend: a profiler given it) is decided again under the
    new rules as the decision ends, not disabled on the old answer: every
    call of it is followed."""
    if tracing.conflict():
        pytest.skip(tracing.conflict())
    path, module = user_module(tmp_path, "decided_twice", ONE_ALLOCATION)
    code = module.allocate.__code__
    scope = tracing.scope
    in_scope = scope.file_in_scope

    def slowly(filename):
        if os.path.basename(filename) == path.name:
            time.sleep(0.2)   # the other thread adds the function meanwhile
            return False      # the path rule leaves it out
        return in_scope(filename)

    monkeypatch.setattr(scope, "file_in_scope", slowly)

    def calls():
        for _ in range(5):
            module.allocate()

    def adds():
        time.sleep(0.05)
        tracing.extend([code])

    got = lines_allocated(tmp_path, ("nothing matches this",), code, calls, adds, added=[code])
    assert got == {code.co_firstlineno + 1: 5 * 100}


WAIT_SCRIPT = r'''
import gc, os, sys, threading, time, importlib.util
from pytest_memlab import _engine as E
from pytest_memlab.engine.tracing import tracing

root = sys.argv[1]
path = os.path.join(root, "waited_for.py")
with open(path, "w") as f:
    f.write("def f():\n    return 1\n")
spec = importlib.util.spec_from_file_location("waited_for", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
lock = threading.Lock()

class Pooled:   # goes back to its pool under the pool's lock
    def __del__(self):
        with lock:
            pass

gc.disable()
a = Pooled(); a.me = a; del a   # garbage in a cycle
scope = tracing.scope
in_scope = scope.file_in_scope

def slowly(filename):
    if os.path.basename(filename) == "waited_for.py":
        time.sleep(0.2)
        gc.collect()   # the finalizer waits for the lock the other thread holds
    return in_scope(filename)

scope.file_in_scope = slowly
scope.configure(root, (path,))
sid = E.begin(E.SLOT_CPU)
assert tracing.acquire(paths=True)

def holds_the_lock():
    time.sleep(0.05)
    with lock:
        module.f()   # its first call, while the main thread decides f

other = threading.Thread(target=holds_the_lock)
other.start()
module.f()
other.join()
tracing.release(paths=True)
E.end(E.SLOT_CPU, sid)
print("ended")
'''


def test_a_thread_waits_for_another_threads_decision_for_a_bounded_time(tmp_path):
    """The wait for another thread's decision of a function's scope is
    bounded: a decision that cannot end while the waiting thread holds a
    lock (a finalizer that needs it runs inside the decision) ends after
    about 2 s, the waiting thread's call unfollowed, instead of hanging the
    test.  (memlab's own decisions hold the collector off; the finalizer
    here comes from an explicit collection.)"""
    if sys.version_info < (3, 12):
        pytest.skip("before 3.12 only the measuring thread is traced: no thread waits")
    import subprocess

    root = os.path.realpath(str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", WAIT_SCRIPT, root], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ended"]
    assert time.monotonic() - started < 60


def test_a_profiled_function_counts_every_lines_hits():
    """Functions given explicitly (the laboratory's line profiler) are
    traced line by line: each line's hits, allocations and peak."""
    if tracing.conflict():
        pytest.skip(tracing.conflict())
    sid = E.begin(CPU)
    assert tracing.acquire(codes=[loops.__code__])
    E.tracer_reset_lines()
    try:
        loops()
    finally:
        tracing.release(codes=[loops.__code__])
        E.end(CPU, sid)
    stats = {(s.frame.function, s.frame.line): s for s in line_stats(CPU)}
    body = stats[("loops", line_of(loops, "loop body"))]
    assert (body.hits, body.allocated, body.peak_total) == (5, 15, 15)
    # each line's frame is kept for the process: the collector does not track it
    assert not any(gc.is_tracked(s.frame) for s in stats.values())
    assert body.frame.function == "loops" and body.frame.line == line_of(loops, "loop body")
    assert stats[("loops", line_of(loops, "for i in range"))].hits == 6


def test_a_scope_decision_that_raises_never_reaches_user_code():
    if tracing.conflict():
        pytest.skip(tracing.conflict())

    def bad(code):
        raise RuntimeError("decision failed")

    seen = []
    E.tracer_start(bad)
    try:
        seen.append(sum(range(10)))  # user code runs on unharmed
        helper(1)
    finally:
        with pytest.raises(RuntimeError, match="decision failed"):
            E.tracer_stop()
    assert seen == [45]
    E.tracer_start(tracing.scope)  # the real scope again
    E.tracer_stop()


def test_sites_and_lines_resolve_to_code():
    with pytest.raises(ValueError):
        E.site(10**9)
    assert chain_of(0) == []
    status = E.tracer_status()
    assert status["backend"] == ("sys.monitoring" if sys.version_info >= (3, 12) else "PyEval_SetTrace")


PARKED_SCRIPT = r'''
import collections, sys
from pytest_memlab import _engine as E
calls = collections.Counter()
original = E._mon_start
def counting(code, *rest):
    calls[code.co_name] += 1
    return original(code, *rest)
E._mon_start = counting   # before the tracer registers its callbacks
from pytest_memlab.engine.tracing import tracing
tracing.scope.configure(sys.argv[1])
namespace = {}
exec(compile("def between():\n    return 1\n", "/elsewhere/lib.py", "exec"), namespace)
exec(compile("def measured():\n    return 2\n", sys.argv[1] + "/test_x.py", "exec"), namespace)
for _ in range(5):
    assert tracing.acquire(paths=True)
    namespace["measured"]()
    tracing.release(paths=True, park=True)
    namespace["between"]()    # pytest's own code runs here, between two tests
tracing.unpark()
print(calls["between"], calls["measured"])
'''


@pytest.mark.skipif(sys.version_info < (3, 12), reason="parking is sys.monitoring's")
def test_a_parked_tracer_disables_code_that_runs_between_measured_tests(tmp_path):
    """While parked between two measured tests, PY_START stays on: code out
    of scope that first runs there is disabled there, once, instead of
    reporting again in every test."""
    import subprocess

    root = os.path.realpath(str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", PARKED_SCRIPT, root], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    between, measured = map(int, done.stdout.split())
    assert between == 1      # decided once, then disabled
    assert measured == 5     # in scope: heard in every test


def test_the_scope_resolves_links_as_realpath_does(tmp_path):
    """A file is user code by its real path: a folder or a file linked
    into the rootdir from outside is the user's, one linked out of it is
    not; the folder's resolution is made once for all its files."""
    from pytest_memlab.engine.tracing import Scope

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "pkg").mkdir(parents=True)
    (outside / "lib").mkdir(parents=True)
    for f in (root / "pkg" / "a.py", outside / "lib" / "b.py", outside / "c.py"):
        f.write_text("")
    (root / "linked_lib").symlink_to(outside / "lib")          # a folder of outside files seen from the root
    (outside / "to_root").symlink_to(root / "pkg")             # the root's folder seen from outside
    (outside / "to_a.py").symlink_to(root / "pkg" / "a.py")    # the root's file seen from outside
    (root / "pkg" / "to_c.py").symlink_to(outside / "c.py")    # an outside file seen from the root
    scope = Scope()
    scope.configure(root)
    cases = [root / "pkg" / "a.py", root / "linked_lib" / "b.py", outside / "to_root" / "a.py",
             outside / "to_a.py", root / "pkg" / "to_c.py", outside / "c.py"]
    got = [scope.file_in_scope(str(p)) for p in cases]
    assert got == [True, False, True, True, False, False]
    assert got == [(os.path.realpath(p) + os.sep).startswith(os.path.realpath(root) + os.sep) for p in cases]
