"""One run of one test's protocol while memlab measures it: the only user
of :class:`~.measurement.Measurement` in the plugin.

A run opens at the start of setup and ends after teardown (function-scoped
fixtures count): hook wrappers drive it, so that plugins that run the
protocol themselves (pytest-rerunfailures, and whoever else) keep doing so,
each run of the protocol one measurement.  Broader-scoped fixtures set up
during the run are measured apart (detached scopes): what they keep alive
is not the test's.  After teardown the leak protocol runs; the final
figures become the test's result.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

from ..children.gathering import ChildWatch, StartupHookMissing
from ..devices import CPU, default_device, machine_gpu, other_gpus
from ..engine.backend import BRIDGE, MemlabCoreError
from ..engine.tracing import tracing
from ..engine.meters import EngineMeter, figures_without_kept, leave_out_kept, make_meter, peak_without_kept
from ..judging.messages import leak_report
from ..markers import UNMARKED
from ..reports.results import DeviceResult, TestResult
from .measurement import Measurement
from .memory_kinds import KindWalk, defer, kinds_over_time, resolve
from .out_of_memory import cpu_failure_count, cpu_moment, explain


_CPU_ALONE = [CPU]


@dataclass(slots=True)
class TestRun:
    """One run of one test's protocol, while memlab measures it."""

    __test__ = False   # not a pytest test class

    specs: tuple
    nodeid: str = ""
    location: tuple = ("", 0)             # the test function's file and line: where its warnings point
    measurement: Measurement | None = None
    # Sequences that most tests leave empty are the empty tuple until
    # something is added (a new list then): each empty list is an object the
    # collector tracks, held through the test, and promoted to the oldest
    # generation whenever a middle collection falls inside the test (on a
    # large heap, what brings the next full collection nearer).
    devices: list | tuple = ()             # (spec, concrete device)
    fixtures: int = 0                     # fixtures set up while measuring
    figures: dict | None = None           # final, after teardown
    failed: dict = field(default_factory=dict)   # finding key -> finding (judging.findings)
    leaks: dict = field(default_factory=dict)    # device -> Leak (after teardown)
    suspects: dict = field(default_factory=dict)  # device -> blocks left to the session's batch
    leaked: dict = field(default_factory=dict)    # device -> bytes the leak check judged, where it searched
    leak_policy: dict = field(default_factory=dict)  # device -> "fail" or "warn"
    warned: list | tuple = ()              # finding keys
    call_failed: bool = False
    failure: object = None                # the failed call's traceback (pytest keeps it a while)
    user_failed: bool = False            # setup, call or teardown failed by the test's own doing
    names: dict = field(default_factory=dict)     # concrete device -> name as asked ("cuda", "cpu")
    changes: dict = field(default_factory=dict)   # device -> findings.Change
    not_compared: frozenset = frozenset()   # devices not compared: the baseline is another GPU kind's
    repeating: bool = False
    judged: bool = False                  # anything to judge before teardown: budgets, notes, a baseline
    growth: dict = field(default_factory=dict)   # device -> bytes kept by each repetition
    error: str = ""                       # memlab's own trouble
    said: list | tuple = ()                # what a warning could not say (an error by the filter)
    unjudged: list | tuple = ()            # "device: why" of a marked device memlab could not measure
    armed: tuple | None = None            # the children's folder, while the test runs (ChildWatch.arm)
    watch: ChildWatch | None = None       # the session's, which armed it
    children: list | tuple = ()            # ChildFigures of the processes it started
    ranks: list | tuple = ()               # under torchrun, on rank 0: every rank's ChildFigures
    others: list | tuple = ()              # GPUs measured that the test did not ask for
    item: object = None                   # the test's item, while it runs (what pytest holds of it)
    site_changes: dict = field(default_factory=dict)   # device -> [SiteChange] against the baseline
    out_of_memory: list | tuple = ()                   # out_of_memory.Moment of each failed request heard
    cpu_failed: int = 0                                # the CPU's failed requests before the test (engine.failed)
    explained: list | tuple = ()                       # out_of_memory.Explanation of each, for the reports
    kind_walk: KindWalk | None = None                  # the phase hook while it runs (memory by kind)

    # -- opening -------------------------------------------------------------------
    def begin(self, core, options, session) -> str | None:
        """Opens the measurement (core: the backend's chooser; session
        hears the backend first); returns a failure to raise when a backend
        that MEMLAB_CORE required is missing (memlab's other trouble is
        kept in error: the test then runs unmeasured)."""
        try:
            measurement = self._prepare(core(), options, session)
            measurement.begin()
            self.cpu_failed = cpu_failure_count(measurement)
            self._follow_kinds(measurement, options)
            children = session.children
            if children is not None and measurement.meters:
                try:
                    self.armed = children.arm(list(measurement.meters))
                    self.watch = children
                except StartupHookMissing as exc:
                    session.children_hook_missing(str(exc))
        except MemlabCoreError as exc:  # MEMLAB_CORE=bridge asked for this
            self.error = str(exc)
            return f"pytest-memlab: {exc}"
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return None
        self.measurement = measurement
        return None

    @classmethod
    def adopt(cls, plain, core, options, session) -> "TestRun":
        """The run a plain run becomes once its test needs more than its
        figures (plain_run.py): its scope, tracer, children's arming and
        counts taken over as they are, as if begin had opened them."""
        run = cls(plain.specs, nodeid=plain.nodeid, location=plain.location, item=plain.item)
        try:
            measurement = run._prepare(core, options, session)
            measurement.adopt(plain.meter, plain.t0, plain.collections, plain)
            plain.adopted = measurement
        except Exception as exc:   # memlab's trouble, never the test's: it ends unmeasured
            plain.abandon()
            run.error = f"{type(exc).__name__}: {exc}"
            return run
        run.cpu_failed = plain.cpu_failed
        run._follow_kinds(measurement, options)
        # (plain's end disarms first, as end does: what it heard is kept)
        run.armed, run.watch, run.children, run.error = plain.armed, plain.watch, plain.children, plain.error
        run.fixtures = plain.fixtures
        run.measurement = measurement
        return run

    def _prepare(self, c, options, session) -> Measurement:
        """The measurement of the test's devices, not begun; the run's
        devices, names and whether anything judges it."""
        if not session.backend:   # (saw_backend's own first question: every measured test asks)
            session.saw_backend(c)
        requested = [default_device(c) if spec.kind == "auto" else spec.device for spec in self.specs]
        # Every GPU the test uses is measured: the others it did not ask
        # for too (kept only if it allocated there: TestRun.end).  A
        # test of the CPU alone, most on a machine without CUDA, asks
        # nothing.
        others = other_gpus(c, requested) if c.name == BRIDGE and requested != _CPU_ALONE else []
        measurement = Measurement(c, list(dict.fromkeys(requested)) + others, park=True, timeline=True,
                                  log=options.snapshot is not None, others=tuple(others),
                                  lines=options.top_lines, lines_top=options.top)
        resolved = measurement.resolved
        self.devices = [(spec, resolved[r]) for spec, r in zip(self.specs, requested)]
        self.devices += [(UNMARKED, d) for d in others]
        self.others = others
        self.names = {resolved[r]: r for r in [*requested, *others]}
        # (a list, not a generator, here and in end: 3.12 runs a list
        # comprehension inline, with no frame of its own, in every test)
        self.judged = session.baseline is not None or any([spec.marked for spec in self.specs])
        return measurement

    def _follow_kinds(self, measurement: Measurement, options) -> None:
        """Memory by kind where something reads it: a report or a baseline
        keeps it, a verdict's message tells it (a budget, a baseline's
        regression).  Else no phase hook and no allocation log (about 0.1
        ms a test with a forward pass)."""
        if measurement.trace and (self.judged or options.kinds_kept):
            followed = {d: m for d, m in measurement.meters.items()
                        if m.__class__ is EngineMeter and m.timeline}
            if followed:
                self.kind_walk = KindWalk(followed)
                tracing.phase_hook(self.kind_walk)

    # -- user code -----------------------------------------------------------------
    def fixture_begin(self, scope: str, the_tests: bool) -> list:
        """A fixture's setup starts (user code: the caller opens a trace
        window); one broader than the function is measured apart, in
        detached scopes, returned for fixture_end.  the_tests: requested by
        the test itself (its finalizer runs at the test's teardown)."""
        measurement = self.measurement
        self.fixtures += the_tests
        if scope == "function" or measurement.core.name != BRIDGE:
            return []
        started = []
        try:
            for device in measurement.meters:
                meter = make_meter(measurement.core, device, detached=True)
                meter.begin()
                started.append(meter)
        except BaseException:
            self.fixture_end(started)
            raise
        return started

    @staticmethod
    def fixture_end(started: list) -> dict[str, int]:
        """Closes fixture_begin's scopes; returns the most the fixture's
        setup held on each device (its own peak)."""
        held = {}
        for meter in reversed(started):
            held[meter.device] = meter.end().peak or 0
        return held

    def repeat(self, item, allowed: dict[str, int], times: int) -> None:
        """--memlab-leak-repeat: the call again, times times, in the same
        measurement; what each repetition keeps (after a collection) is
        what grows per run.  allowed: the devices whose leaks are checked."""
        measurement = self.measurement
        checked = [d for d in allowed if hasattr(measurement.meters.get(d), "live")]
        if not checked:
            return
        gc.collect()
        before = {d: measurement.meters[d].live() for d in checked}
        self.growth = {d: [] for d in checked}
        self.repeating = True
        try:
            for _ in range(times):
                with measurement.window():
                    item.ihook.pytest_pyfunc_call(pyfuncitem=item)
                gc.collect()
                for d in checked:
                    now = measurement.meters[d].live()
                    self.growth[d].append(now - before[d])
                    before[d] = now
        finally:
            self.repeating = False

    def peek_children(self, failed: bool = False) -> None:
        """The children that ended during the call: judged with it (where
        there is anything to judge: a budget or a baseline), or read for
        a failed call (a child's out-of-memory joins its failure)."""
        if self.armed is not None and (self.judged or failed):
            try:
                self.children = self._children_used(ChildWatch.peek(self.armed))
            except Exception as exc:
                self.error = f"its child processes' figures were lost: {type(exc).__name__}: {exc}"

    def _children_used(self, children: list) -> list:
        """A child's other GPUs (armed with every GPU, as the test is) that
        it allocated nothing on leave its figures, as they leave the test's."""
        for child in children:
            for device in self.others:
                f = child.devices.get(device)
                if f is not None and not f.allocs:
                    del child.devices[device]
                    child.top.pop(device, None)
                    child.at_peak.pop(device, None)
        return children

    def processes(self) -> list[dict] | tuple:
        """Every rank (under torchrun, rank 0's own included), then the
        other children, as the reports and the failures list them (the
        empty tuple for a test that started none: most)."""
        if not self.ranks and not self.children:
            return ()
        return [c.as_dict() for c in self.ranks] + [c.as_dict() for c in self.children if c not in self.ranks]

    # -- out of memory ----------------------------------------------------------------
    def explain_out_of_memory(self, report, call, session, core, top: int) -> None:
        """A call (or a fixture) that ran out of memory: memlab's section
        added to its own failure (never memlab's verdict); the errors the
        test caught are recorded for the reports at its teardown."""
        try:
            excinfo = call.excinfo
            if excinfo is not None:
                explanation = explain(self, excinfo.value, excinfo.tb, session, core(), top)
                if explanation is not None:
                    self.out_of_memory = [m for m in self.out_of_memory if m is not explanation.moment]
                    self.explained = [*self.explained, explanation]
                    if report.failed:
                        report.sections.append(("memlab: out of memory", explanation.rendered))
            if call.when == "teardown":
                for moment in self.out_of_memory:
                    self.explained = [*self.explained,
                                      explain(self, None, None, None, core(), top, caught=True, moment=moment)]
                self.out_of_memory = ()
        except Exception as exc:  # memlab's trouble, never the test's
            self.error = self.error or f"the out-of-memory was not explained: {type(exc).__name__}: {exc}"

    def children_out_of_memory(self, report) -> None:
        """The sections of the children that ran out of memory, in the
        failed call's report, each naming the process."""
        for child in self.children:
            for o in child.out_of_memory:
                report.sections.append((f"memlab: out of memory in {child.label} (pid {child.pid})", o.get("text", "")))

    # -- what it keeps ---------------------------------------------------------------
    def _held_by_pytest(self, item=None) -> frozenset:
        """Storage addresses of the tensors that pytest alone still holds
        and drops right after teardown (function fixtures' values, a
        failure's frames): not kept by the test."""
        torch = self.measurement.core.torch
        item = item if item is not None else self.item
        if torch is None or item is None:
            return frozenset()
        from .leak_search import storages_held_by_pytest

        return frozenset(storages_held_by_pytest(item, self.failure, torch))

    def figures_now(self, device: str):
        """A device's figures so far, with where the peak came from, its own
        peak without what the test holds now apart from what pytest
        releases after it (a lower bound of the final figure's: the test
        can only keep less by its end)."""
        measurement = self.measurement
        figures = measurement.figures(device, sites=True)
        meter = measurement.meters.get(device)
        if meter.__class__ is EngineMeter and (figures.live or meter.timeline):
            kept = meter.kept(self._held_by_pytest() if figures.live else frozenset())
            if kept is not None:
                leave_out_kept(figures, kept)   # and each phase's peak
                walk = self.kind_walk
                if walk is not None and meter.slot in walk.started:
                    try:
                        defer(figures, walk, meter.slot, kept, *meter.take_alloc_log(keep=True), tracing.phases())
                    except Exception as exc:  # memlab's trouble, never the test's
                        figures.kinds, figures.kinds_note = None, f"{type(exc).__name__}: {exc}"
        return figures

    def _kept(self, item) -> dict:
        """device -> meters.Kept, for the devices the engine followed: what
        outlives the teardown (after the leak check's collections), and
        each phase's peak without it (nothing kept: one call, no walk)."""
        out, held = {}, None
        for device, meter in self.measurement.meters.items():
            if meter.__class__ is not EngineMeter or not meter.timeline:
                continue
            raw = meter.kept_raw()
            if raw is None:   # the engine did not follow the scope
                continue
            if raw[1]:   # blocks still allocated: those pytest alone holds count as freed
                if held is None:
                    held = self._held_by_pytest(item)
                out[device] = peak_without_kept(raw, held)
            else:
                out[device] = peak_without_kept(raw)
        return out

    def _kinds(self, walk: KindWalk, kept: dict) -> None:
        """Each followed device's bytes by kind at its own peak of record
        (memory_kinds.py), from the allocation log its first phase began."""
        phases = tracing.phases()
        for device, meter in self.measurement.meters.items():
            if meter.slot not in walk.started:
                continue
            figures = self.figures.get(device)
            if meter.log:   # --memlab-snapshot's log: the same entries, from the start
                entries, dropped = figures.alloc_log if figures and figures.alloc_log else ([], 0)
            else:
                entries, dropped = meter.take_alloc_log()
            if figures is not None and figures.measured and device in kept:
                defer(figures, walk, meter.slot, kept[device], entries, dropped, phases)

    # -- closing -------------------------------------------------------------------
    def end(self, item, allowed: dict[str, int], top: int) -> None:
        """After teardown: the leak check for the allowed devices (device ->
        bytes allowed; those under the warn policy may be left to the
        session's batch as suspects), then the final figures.  memlab's
        trouble is kept in error, never raised into the test."""
        measurement = self.measurement
        walk = self.kind_walk
        if walk is not None:
            tracing.phase_hook(None)
        if self.armed is not None:
            try:
                children = self.watch.disarm(self.armed)
                self.children = self._children_used(children) if children else ()
            except Exception as exc:
                self.error = f"its child processes' figures were lost: {type(exc).__name__}: {exc}"
            self.armed = None
        try:
            if allowed:
                deferred = frozenset([d for d in allowed if self.leak_policy.get(d) == "warn"])
                self.leaks, self.suspects, self.leaked = measurement.check_leaks(allowed, top, item, deferred,
                                                                                 self.failure)
        except Exception as exc:
            self.error = f"the leak check failed: {type(exc).__name__}: {exc}"
        try:   # the CPU requests that failed and that the test caught (memlab's allocator heard them)
            explained = sum(1 for e in self.explained if e.moment.device == "cpu") if self.explained else 0
            moment = cpu_moment(measurement, self.cpu_failed + explained)
            if moment is not None:
                self.out_of_memory = [*self.out_of_memory, moment]
        except Exception as exc:
            self.error = self.error or f"the out-of-memory was not explained: {type(exc).__name__}: {exc}"
        kept = {}
        try:
            kept = self._kept(item)
        except Exception as exc:
            self.error = f"what the test kept was not told apart: {type(exc).__name__}: {exc}"
        try:
            self.figures = measurement.end()
        except Exception as exc:
            self.figures = measurement.final or {}
            self.error = f"lost part of this test's measurement: {type(exc).__name__}: {exc}"
        for device, figures in self.figures.items():
            figures_without_kept(figures, kept.get(device))
        if walk is not None and walk.started:
            try:
                self._kinds(walk, kept)
            except Exception as exc:  # memlab's trouble, never the test's
                for figures in self.figures.values():
                    figures.kinds, figures.kinds_note = None, f"{type(exc).__name__}: {exc}"
        self.kind_walk = None
        self.item = None
        if self.others:
            self._drop_unused_gpus()

    def _drop_unused_gpus(self) -> None:
        """The other GPUs that the test allocated nothing on leave its
        figures (its result and its baseline name only the GPUs it used)."""
        unused = set()
        for device in self.others:
            f = self.figures.get(device)
            if f is None or not f.allocs:
                unused.add(device)
        if unused:
            self.devices = [(spec, d) for spec, d in self.devices if d not in unused]
            for device in unused:
                self.figures.pop(device, None)

    def write_snapshots(self, folder) -> None:
        """--memlab-snapshot: this run's allocation log per device, once."""
        from ..reports import snapshot

        for device, figures in (self.figures or {}).items():
            if figures.alloc_log is None:
                continue
            entries, dropped = figures.alloc_log
            figures.alloc_log = None   # written once; the item lives on
            try:
                snapshot.write(folder, self.nodeid, device, entries, dropped)
            except Exception as exc:   # memlab's trouble, never the test's
                self.error = self.error or f"the snapshot was not written: {type(exc).__name__}: {exc}"

    # -- the result ----------------------------------------------------------------
    def result(self, top: int, detail: str, with_baseline: bool, writes_baseline: bool = False) -> TestResult:
        """The test's result (its figures as the reports read them); with
        detail "all", or "flagged" for a test memlab failed, warned of or
        suspects of a leak, what the JSON and HTML reports show besides
        (timelines are fetched only then: the engine keeps the last one).
        The lines and kinds at the peak are made only where a report or a
        baseline being written keeps them: a run that only compares with
        the baseline reads them where a test regressed, in its message
        (tens of microseconds a test, milliseconds for a training test's
        kinds)."""
        want_sites = writes_baseline or bool(detail)
        if detail == "flagged" and not (self.failed or self.warned or self.suspects or self.said or self.explained):
            detail = ""
        result = TestResult(self.nodeid, failed_by_memlab=sorted(self.failed) if self.failed else (),
                            warned=sorted(self.warned) if self.warned else (),
                            memlab_error=self.error, user_failed=self.user_failed, said=self.said,
                            unjudged=self.unjudged,
                            processes=self.processes() if self.ranks or self.children else (),
                            out_of_memory=[e.as_dict() for e in self.explained] if self.explained else ())
        if self.measurement is None:
            return result
        for spec, device in self.devices:
            figures = (self.figures or {}).get(device)
            if figures is None:
                continue
            d = result.devices[device] = DeviceResult.from_figures(figures, spec, top,
                                                                   sites=want_sites)
            d.name = self.names.get(device, device)
            if device != CPU:   # (machine_gpu's answer for the CPU: none)
                d.gpu = machine_gpu(device)
            if device in self.leaked and figures.measured:
                d.leaked = self.leaked[device]   # the figure agrees with the verdict
            if device in self.measurement.first_use:
                d.first_use, d.first_use_held = self.measurement.first_use[device]
            elif figures.kept == 0:
                d.first_use = 0          # it kept nothing (else: told at the session's end, or not told)
            changes = self.site_changes.get(device)
            if changes:
                d.site_changes = [c.as_dict() for c in changes]
            change = self.changes.get(device)
            if change is not None:
                d.baseline_peak, d.baseline = change.old, change.kind
            elif device in self.not_compared and figures.measured:
                d.baseline = "not compared"
            elif with_baseline and figures.measured:
                d.baseline = "new"
            if detail and figures.measured:
                d.detail = self._detail(device, figures, top)
            figures.kind_lives = figures.kinds_pending = None   # every block of the test: not kept past its result
        return result

    def _detail(self, device: str, figures, top: int) -> dict:
        """What the JSON and HTML reports show of one device beyond the
        figures: the timeline (x: allocator events since the test began;
        each point the min and max of own and total bytes over its span),
        the marks and phases on it, where the own peak fell and the line
        that reached it, and the leak report."""
        meter = self.measurement.meters.get(device)
        if figures.timeline is None and getattr(meter, "timeline", False):
            figures.timeline = meter.timeline_points(self.measurement.DETAIL_POINTS)
        seq0, last, points = figures.timeline or (0, 0, [])
        marks = [{"label": m.label, "kind": m.kind, "at": m.seq[device] - seq0}
                 for m in self.measurement.timeline_marks(device)]
        peak_at = peak_line = None
        if figures.seq_at_peak is not None and figures.peak:
            peak_at = figures.seq_at_peak - seq0
            chain = figures.attribution.peak_chain if figures.attribution is not None else []
            peak_line = str(chain[0]) if chain else None
        leak = self.leaks.get(device)
        kinds = None
        resolve(figures)
        if figures.kind_lives is not None and points:
            lives, since = figures.kind_lives
            kinds = kinds_over_time(lives, [p[0] for p in points], since)
        return {
            "events": last - seq0,
            "timeline": [[seq - seq0, lo, hi, tlo, thi] for seq, lo, hi, tlo, thi in points],
            "kinds": kinds,
            "marks": marks,
            "peak_at": peak_at,
            "peak_line": peak_line,
            "leak": leak_report(leak, top) if leak is not None else None,
        }
