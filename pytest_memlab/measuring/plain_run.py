"""A plain test's run: the commonest measured test on a machine without
CUDA, measured with the fewest steps that its figures need.

An unmarked test (``--memlab``) measured on the CPU alone, in a session
where nothing reads more of it than its figures (no baseline, no JSON or
HTML report, no terminal table, no snapshot, no repetitions, no packing,
no ranks), runs plain: its engine scope, the tracer's windows and the
children's arming are opened as :meth:`.run.TestRun.begin` and the
measurement open them, without the objects that the general path builds
around them.  A test that turns out to need more (the
``memlab`` fixture, a broader fixture measured apart, a failure, anything
left allocated after teardown, a child process's figures, a failed CPU
request) becomes a :class:`.run.TestRun` at that moment
(:meth:`~.run.TestRun.adopt`), which takes the open scope over as it is,
so that from there on everything is the general path's (a window open
then closes through the measurement that took it over).

Each step of a measured test costs about a microsecond in place on a large
heap (pytest's own work between tests leaves memlab's code and data out of
the caches): the general path's objects and layers were about half of what
a plain test cost there (bench/RESULTS.md, issue 51).

``MEMLAB_PLAIN_RUNS=off`` runs every test the general way (the benchmark
and the tests compare the two, test for test).
"""

from __future__ import annotations

import gc
import os
import time

from ..children.gathering import StartupHookMissing
from ..devices import CPU
from ..engine.meters import EngineMeter, head_phase_peaks
from ..engine.tracing import WINDOWED, tracing
from ..figures import phase_bytes
from ..markers import UNMARKED_SPECS
from ..reports.results import DeviceResult, TestResult
from .measurement import TraceWindows

PLAIN_SPECS = UNMARKED_SPECS   # markers' one tuple of every unmarked test's specs


def plain_runs_possible(core, options, session) -> bool:
    """Whether a session's unmarked tests may run plain (asked once, at its
    first measured test: core is the backend chosen then)."""
    from ..devices import BRIDGE, cuda_available

    return (core.name == BRIDGE and not cuda_available(core)
            and session.baseline is None and session.ranks is None
            and not options.detail and not options.kinds_kept and not options.top_lines
            and options.snapshot is None and not options.leak_repeat and not options.pack
            and os.environ.get("MEMLAB_PLAIN_RUNS", "on").strip().lower() not in ("off", "0", "no"))


class PlainRun(TraceWindows):
    """One run of a plain test's protocol (see the module's text)."""

    __slots__ = ("specs", "nodeid", "location", "item", "meter", "t0", "collections", "cpu_failed", "armed",
                 "watch", "children", "error", "user_failed", "figures", "fixtures", "adopted",
                 "_tracing", "_traced_once", "trace_note")
    # TraceWindows' words, the same for every plain run: it traces, measures
    # until its end (final: never set) and parks the tracer
    trace, final, park = True, None, True

    def __init__(self, nodeid: str, location: tuple, item):
        self.specs = PLAIN_SPECS
        self.nodeid = nodeid
        self.location = location
        self.item = item
        self.meter: EngineMeter | None = None
        self.t0 = 0.0
        self.collections = (0, 0)
        self._tracing = 0                 # windows open (from 3.12: one, the whole run)
        self._traced_once = False
        self.trace_note = ""              # why the tracer could not run
        self.fixtures = 0                 # the test's own fixtures set up (their teardown is a window)
        self.adopted = None               # the Measurement that took it over
        self.cpu_failed = 0
        self.armed: tuple | None = None
        self.watch = None
        self.children: list | tuple = ()
        self.error = ""
        self.user_failed = False
        self.figures: tuple | None = None   # once it ended plain: (peak, peak_total, reserved_peak, kept head)

    def begin(self, core, session) -> bool:
        """Measurement.begin's and TestRun.begin's steps for the CPU alone,
        in their order; False (nothing left open) where the scope could not
        be opened: the general run then tries, and says why."""
        if not session.backend:
            session.saw_backend(core)
        meter = EngineMeter(core, CPU, False, True, False)
        self.t0 = time.perf_counter()
        self.collections = gc.get_count()[1:]
        try:
            meter.begin()
        except Exception:
            return False
        self.meter = meter
        tracing.reset_lines()
        if not WINDOWED:
            self._trace_on()
        self.cpu_failed = meter.failed_requests()[0]
        children = session.children
        if children is not None:
            try:
                self.armed = children.arm(_CPU_ALONE)
                self.watch = children
            except StartupHookMissing as exc:
                session.children_hook_missing(str(exc))
        return True

    def end(self) -> bool:
        """After teardown: the figures, where the test left nothing
        allocated, failed no CPU request and started no child that wrote;
        else False, its scope still open, for the general run to end
        (TestRun.end's steps, in its order)."""
        if self.armed is not None:
            try:
                self.children = self.watch.disarm(self.armed) or ()
            except Exception as exc:
                self.error = f"its child processes' figures were lost: {type(exc).__name__}: {exc}"
            self.armed = None
        if self.children or self.error:
            return False
        try:
            figures = self.meter.end_plain(self.cpu_failed, park=True)
        except Exception as exc:   # the general run's end goes on, as its own would
            self.error = f"lost part of this test's measurement: {type(exc).__name__}: {exc}"
            return False
        if figures is None:
            return False
        try:
            self._trace_end()
        except Exception as exc:  # a scope decision raised: say so
            self.error = self.error or f"lost part of this test's measurement: {type(exc).__name__}: {exc}"
        self.figures = figures
        return True

    def _trace_on(self) -> None:
        if self.adopted is not None:   # a window opened before the run became general
            return self.adopted._trace_on()
        TraceWindows._trace_on(self)

    def _trace_off(self) -> None:
        if self.adopted is not None:   # a window opened before, closing after
            return self.adopted._trace_off()
        TraceWindows._trace_off(self)

    def abandon(self) -> None:
        """Closes what begin opened (the general run could not take it over)."""
        try:
            if self.armed is not None:
                self.watch.disarm(self.armed)
                self.armed = None
            self.meter.end(True)
        finally:
            self._trace_end()

    def result(self) -> TestResult:
        """TestRun.result's for this run: its one device's figures, as
        DeviceResult.from_figures makes them of a scope that kept nothing
        (its peak is the peak with what it kept; each phase's peak is the
        kept head's; no lines: a plain run reads none)."""
        result = TestResult(self.nodeid, memlab_error=self.error, user_failed=self.user_failed)
        figures = self.figures
        if figures is not None:
            peak, peak_total, reserved_peak, head = figures
            result.devices[CPU] = DeviceResult(
                CPU, True, "", peak=peak, peak_total=peak_total, reserved_peak=reserved_peak, leaked=0,
                peak_with_kept=peak, kept=0, first_use=0, name=CPU,
                phases=phase_bytes(head_phase_peaks(head[3])) if head is not None else {})
        return result


_CPU_ALONE = [CPU]
