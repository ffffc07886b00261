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
"""

import os

import pytest

from pytest_memlab.children.gathering import ChildWatch
from pytest_memlab.engine.backend import core, restore, session_started, unpark
from pytest_memlab.engine.meters import EngineMeter, leave_out_kept
from pytest_memlab.engine.tracing import tracing

OFF = set(os.environ.get("ESSENTIALS_OFF", "").split(","))
_state = {}


def pytest_configure(config):
    session_started()
    tracing.scope.configure(config.rootpath, ())
    _state["watch"] = ChildWatch(config.rootpath, (), 5)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
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
        meter, armed = _state.pop("run")
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
