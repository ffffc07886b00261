"""What a measured test costs with memlab's essentials alone: issue 51's
floor.  A pytest plugin (run with ``-p no:memlab -p essentials_plugin``,
this folder on ``PYTHONPATH``) that does per test only what a measurement
cannot go without, through memlab's own pieces, and none of the plugin's
scaffolding (no TestRun, Measurement, verdicts, results or session record):

- the CPU's engine scope, opened at the start of setup and closed after
  teardown (park: the profiler hooks stay wrapped, as the plugin leaves them);
- the tracer (the path rule, parked between tests), its lines reset;
- the children's arming and disarming (ChildWatch);
- the leak check's first look (live) and the figure without what the test
  kept (kept, leave_out_kept);
- the two junit properties of a test that kept nothing (peak, peak_total).

``ESSENTIALS_OFF=scope,tracer,children`` leaves those parts out, one by one.
Compare it with ``-p no:memlab`` and ``--memlab`` side by side
(bench/process_phases.py, each a ``--config``): what ``--memlab`` costs
beyond it is the plugin's scaffolding.  Timing only: nothing is judged.

``ESSENTIALS_SIDE=FILE`` measures blocks of 25 tests alternately, as
``bench_pertest.py --suite`` does for ``--memlab``, and writes to FILE the
median protocol time of a measured and an unmeasured test and the median
difference of neighbouring blocks (us): the essentials' cost in one
process, beside that figure for ``--memlab``.
"""

import os
import statistics
import time

import pytest

from pytest_memlab.children.gathering import ChildWatch
from pytest_memlab.engine.backend import core, restore, session_started, unpark
from pytest_memlab.engine.meters import EngineMeter, leave_out_kept
from pytest_memlab.engine.tracing import tracing

OFF = set(os.environ.get("ESSENTIALS_OFF", "").split(","))
SIDE = os.environ.get("ESSENTIALS_SIDE")
BLOCK = 25
_state = {}
_blocks: dict[int, list] = {}   # block -> its tests' protocol times (ns)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if not SIDE:
        yield
        return
    block = _state.setdefault("index", {}).get(item)
    if block is None:
        _state["index"] = {it: i // BLOCK for i, it in enumerate(item.session.items)}
        block = _state["index"][item]
    started = time.perf_counter_ns()
    yield
    _blocks.setdefault(block, []).append(time.perf_counter_ns() - started)


def pytest_configure(config):
    session_started()
    tracing.scope.configure(config.rootpath, ())
    _state["watch"] = ChildWatch(config.rootpath, (), 5)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    if SIDE and _state["index"][item] % 2:   # an unmeasured block, as --memlab runs a test it does not measure
        _state["run"] = None
        unpark()
        return (yield)
    meter = EngineMeter(core(), "cpu", timeline=True)
    if "scope" not in OFF:
        meter.begin()
    if "tracer" not in OFF:
        tracing.reset_lines()
        tracing.acquire(paths=True)
    armed = _state["watch"].arm(["cpu"]) if "children" not in OFF else None
    _state["run"] = (meter, armed)
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        _teardown()


def _teardown():
    run = _state.pop("run")
    if run is None:
        return
    meter, armed = run
    if armed is not None:
        _state["watch"].disarm(armed)
    figures = None
    if "scope" not in OFF:
        kept = meter.kept() if not meter.live() else None
        figures = meter.end(True)
        if kept is not None:
            leave_out_kept(figures, kept)
    if "tracer" not in OFF:
        tracing.release(paths=True, park=True)
    _state["figures"] = figures


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "teardown":
        figures = _state.pop("figures", None)
        if figures is not None:
            report.user_properties.extend([("memlab.cpu.peak", figures.peak),
                                           ("memlab.cpu.peak_total", figures.peak_total)])
    return report


def pytest_unconfigure(config):
    unpark()
    restore()
    if SIDE and _blocks:
        # The first pair of blocks warms up; each measured block is compared
        # with the unmeasured one after it (bench_pertest.py's pairing).
        medians = [statistics.median(_blocks[b]) for b in sorted(_blocks)]
        pairs = [medians[b] - medians[b + 1] for b in range(2, len(medians) - 1, 2)]
        measured = [t for b, ts in _blocks.items() if b % 2 == 0 and b > 0 for t in ts]
        unmeasured = [t for b, ts in _blocks.items() if b % 2 and b > 1 for t in ts]
        with open(SIDE, "w") as f:
            f.write(f"measured {statistics.median(measured) / 1000:.1f} unmeasured "
                    f"{statistics.median(unmeasured) / 1000:.1f} paired {statistics.median(pairs) / 1000:.1f}\n")
