"""A test's measurement over its devices: what the ``memlab`` fixture
returns, with its marks, phases, regions (``memlab.limit``) and the leak
protocol's first look.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field

from ..devices import CPU, resolve
from ..engine.attribution import line_stats
from ..engine.backend import BRIDGE, Core
from ..engine.meters import DeviceFigures, EngineMeter, make_meter
from ..engine.tracing import WINDOWED, tracing
from ..sizes import parse_size


class MemoryBudgetExceeded(AssertionError):
    """A ``memlab.limit`` region used more memory than its budget."""



@dataclass
class Mark:
    label: str
    time: float
    live: dict = field(default_factory=dict)   # device -> the test's live bytes then
    total: dict = field(default_factory=dict)  # device -> device total then
    seq: dict = field(default_factory=dict)    # device -> its event number then (the timeline's x)
    kind: str = "mark"                         # "mark" (memlab.mark), "phase" (marked by itself), "oom" (out of memory)
    end: dict = field(default_factory=dict)    # a phase: device -> event number where it ended


def _collections() -> tuple[int, int]:
    """What any collection changes: the counts of the two older
    generations (a collection of generation g adds one to g + 1's and
    zeroes those up to g's).  gc.get_stats() is exact but builds a list of
    dicts, a few microseconds in every measured test (check_leaks reads it
    for the few tests over at first sight).  The counts can come back to
    where they were only after several collections, a full one among them;
    check_leaks then leaves out a middle collection, and what it would
    have freed is a suspect for the session's batch, where a full
    collection frees it: the same verdict."""
    return gc.get_count()[1:]


class TraceWindows:
    """The tracer held through a test's windows (where user code may run):
    counted, so that nested windows hold it once; the last to close lets
    it go (parked where park).  Before 3.12 each window turns it on and
    off; from 3.12 one window spans the whole measurement.  Its user has
    trace (whether to trace at all), final (None while it measures), park,
    _tracing (windows open), _traced_once and trace_note (why the tracer
    could not run)."""

    __slots__ = ()

    def _trace_on(self) -> None:
        if self._tracing == 0:
            if not tracing.acquire(paths=True):
                self.trace_note = tracing.off_reason
                return
            self._traced_once = True
        self._tracing += 1

    def _trace_off(self) -> None:
        if self._tracing > 0:
            self._tracing -= 1
            if self._tracing == 0:
                tracing.release(paths=True, park=self.park)

    def _trace_end(self) -> None:
        """Every window closed at once: _trace_off's last step."""
        if self._tracing:
            self._tracing = 0
            tracing.release(paths=True, park=self.park)

    def window(self) -> "TraceWindow | contextlib.nullcontext":
        """A region where user code may run (fixture setup, the test call,
        teardown): traced on Pythons where tracing costs every frame; from
        3.12 on one shared no-op (about ten are opened a test)."""
        return TraceWindow(self) if WINDOWED else _NO_WINDOW


class Measurement(TraceWindows):
    """The running test's measurement: the ``memlab`` fixture.

    ``peak``, ``live``, ``total`` and ``peak_total`` speak of the test's
    primary device (its ``cuda_memory`` device, else the CPU); ``figures()``
    takes any measured device.
    """

    # Points of a timeline a report keeps per test and device (the engine
    # keeps up to TIMELINE_MAX; merging keeps every peak and trough).
    DETAIL_POINTS = 512

    def __init__(self, core: Core, devices: list[str], trace: bool = True, park: bool = False,
                 timeline: bool = False, log: bool = False, others: tuple[str, ...] = (),
                 lines: bool = True, lines_top: int = 0):
        self.core = core
        # The per-line figures at the end (the heaviest lines a report or
        # the terminal table shows): a test with nothing to show them skips
        # reading every line that ran (on 3.11, each traced line of its code).
        self.lines = lines
        self.lines_top = lines_top   # of them, only the top that allocated the most (0: every line that allocated)
        self.park = park         # leave the tracer and torch's hooks ready for the next test
        self.trace = trace and core.name == BRIDGE
        self.trace_note = ""
        self._tracing = 0        # windows open now (and the span on 3.12+)
        self._traced_once = False
        self.meters = {}
        self.unmeasured: dict[str, str] = {}
        self.resolved: dict[str, str] = {}  # requested ("cuda") -> concrete
        bridged = core.name == BRIDGE
        for device in devices:
            # (resolve's and make_meter's answers for the CPU through the
            # bridge, most tests' device, written out: every measured test)
            concrete, reason = (device, "") if bridged and device == CPU else resolve(core, device)
            self.resolved[device] = concrete
            if reason:
                self.unmeasured[concrete] = reason
            elif bridged:
                self.meters[concrete] = EngineMeter(core, concrete, False, timeline, log)
            else:
                self.meters[concrete] = make_meter(core, concrete, timeline=timeline, log=log)
        self.measured = list(self.meters) + list(self.unmeasured)
        # GPUs measured that the test did not ask for: named in ``devices``
        # once it allocated there (a test's API reads the same on one GPU
        # as on eight)
        self.others = frozenset(self.resolved.get(d, d) for d in others) if others else frozenset()
        self.marks: list[Mark] = []
        self.final: dict[str, DeviceFigures] | None = None
        # device -> (bytes, [named]) of what it kept that is no leak (check_leaks)
        self.first_use: dict[str, tuple[int, list[str]]] = {}
        self.left: dict[str, list] = {}   # device -> blocks of a leak confirmed at teardown
        self._t0 = 0.0
        self._collections = 0   # the collector's collections when the test began (check_leaks)

    @property
    def bridged(self) -> bool:
        """Whether torch's allocators are heard (the torch bridge loaded):
        else a marker's budgets may go unjudged (verdicts, session)."""
        return self.core.name == BRIDGE

    # -- bracketing (the plugin calls these) --------------------------------
    def begin(self) -> None:
        self._t0 = time.perf_counter()
        self._collections = gc.get_count()[1:]   # (_collections, written out: every measured test)
        started = []
        try:
            for meter in self.meters.values():
                meter.begin()
                started.append(meter)
        except BaseException:
            for meter in reversed(started):
                meter.end()
            raise
        self.trace = self.trace and bool(self.meters)
        if self.trace:
            tracing.reset_lines()
            if not WINDOWED:
                self._trace_on()

    def adopt(self, meter, t0: float, collections: tuple, windows: TraceWindows) -> None:
        """begin's state, for the meter of its one device that a plain run
        began (plain_run.py), as begin begins it, and the windows it holds
        open now (they close through this measurement from here on)."""
        self._t0, self._collections = t0, collections
        self.meters[meter.device] = meter
        if self.trace:
            self._tracing, self._traced_once = windows._tracing, windows._traced_once
            self.trace_note = windows.trace_note

    def end(self) -> dict[str, DeviceFigures]:
        figures: dict[str, DeviceFigures] = {}
        error = None
        meters = self.meters
        for device in reversed(meters):
            try:
                figures[device] = meters[device].end(self.park)
            except Exception as exc:  # keep closing the others
                error = error or exc
                figures[device] = DeviceFigures(device, False, reason=f"measurement failed: {exc}")
        try:
            self._trace_end()
        except Exception as exc:  # a scope decision raised: say so
            error = error or exc
        for device, meter in meters.items():
            fig = figures[device]
            if not fig.measured or meter.__class__ is not EngineMeter:
                continue
            if self._traced_once and self.lines:
                fig.lines = line_stats(meter.slot, allocated_only=True, top=self.lines_top)   # the reports read those
            if meter.log:
                fig.alloc_log = meter.take_alloc_log()
        for device, reason in self.unmeasured.items():
            figures[device] = DeviceFigures(device, False, reason=reason)
        self.final = {d: figures[d] for d in self.measured}
        if error is not None:
            raise error
        return self.final

    def check_leaks(self, allowed: dict[str, int], top: int = 5, item=None,
                    deferred: frozenset = frozenset(), failure=None) -> tuple[dict, dict, dict]:
        """The leak protocol, before the measurement ends: for each device
        in allowed (device -> bytes allowed), whether the test's own blocks
        still allocated exceed the allowance once the process is settled.
        Returns (device -> Leak for those that do, device -> the blocks of
        a suspect left to the session's batch, device -> the bytes judged
        where the holder search judged them: the test's leaked figure, which
        leaves out what pytest itself still holds, a function fixture's
        value).

        Settling costs per suite, not per test.  Only a device over at
        first sight costs anything: young-generation collections first
        (what the test's own reference cycles hold usually goes there).  A
        device in deferred (the warn policy) still over is a suspect: its
        blocks are kept, and one scan and one holder search at the
        session's end (a full collection only where a tensor left may be
        garbage) confirm many suspects at once
        (:meth:`.leak_suspects.LeakSuspects.confirm`).  Only a device whose leaks fail the
        test pays a full settling (a full collection, cuBLAS workspaces, a
        synchronisation) here."""
        over = [d for d, limit in allowed.items()
                if isinstance(self.meters.get(d), EngineMeter) and self.meters[d].live() > limit]
        if not over:
            return {}, {}, {}
        # The youngest generation first, then the middle one: an explicit
        # collection of the middle one moves what survives it into the
        # oldest and counts toward the next full collection, which on a
        # large heap costs more than every young one of the suite.  So the
        # middle one only where the collector ran since the test began:
        # else every object the test made is still in the youngest, and
        # the young collection freed all of its own cycles that any
        # collection short of a full one could (the large-heap suite: 19
        # middle collections promoted 15,300 objects, none of them needed).
        collected_since = _collections() != self._collections
        for generation in (0, 1):
            if generation == 1 and not collected_since:
                break
            gc.collect(generation)
            over = [d for d in over if self.meters[d].live() > allowed[d]]
            if not over:
                return {}, {}, {}
        suspects = {d: self.meters[d].live_blocks() for d in over if d in deferred}
        judged: dict = {}
        if suspects and failure is not None and self.core.torch is not None:
            # a failed call's frames, which pytest keeps a while: their
            # tensors are told now, while the frames still say whose they are
            from .leak_search import storages_held_by_pytest

            held = storages_held_by_pytest(item, failure, self.core.torch)
            kept = {d: [b for b in blocks if b[0] not in held] for d, blocks in suspects.items()}
            judged.update((d, sum(b[1] for b in blocks)) for d, blocks in kept.items())
            suspects = {d: blocks for d, blocks in kept.items() if blocks}
        now = [d for d in over if d not in deferred]
        if not now:
            return {}, suspects, judged
        from . import leak_search as leaks

        started = time.perf_counter()
        leaks.settle(self.core, now)
        excused, look_past = leaks.released_by_pytest(item, failure)
        params = leaks.parameter_roots(getattr(getattr(item, "session", None), "items", None))
        found = {}
        for device in now:
            meter = self.meters[device]
            if meter.live() <= allowed[device]:
                continue
            blocks = meter.live_blocks()
            leak = leaks.find(self.core, device, blocks, allowed[device], top, started,
                              excused, look_past, params)
            judged[device] = leak.bytes
            self.first_use[device] = (leak.outside, leaks.first_use_held(leak, self.core.torch))
            if leak.bytes > allowed[device]:
                found[device] = leak
                self.left[device] = blocks   # what a later out-of-memory names as this test's
        return found, suspects, judged

    # -- the fixture's API ---------------------------------------------------
    @property
    def devices(self) -> list[str]:
        """The devices measured: those the test asked for, and each other
        GPU once the test allocated there."""
        return [d for d in self.measured if d not in self.others or self._used(d)]

    def _used(self, device: str) -> bool:
        if self.final is not None:
            figures = self.final.get(device)
            return figures is not None and bool(figures.allocs)
        meter = self.meters.get(device)
        return meter is not None and bool(meter.stats().allocs)

    @property
    def primary(self) -> str:
        if not self.measured:
            raise RuntimeError("this test measures no device")
        return self.measured[0]

    def figures(self, device: str | None = None, sites: bool = False) -> DeviceFigures:
        """Figures so far (or final, after the test) for a device."""
        device = device or self.primary
        if self.final is not None:
            return self.final[device]
        if device in self.unmeasured:
            return DeviceFigures(device, False, reason=self.unmeasured[device])
        if device not in self.meters:
            raise KeyError(f"{device} is not measured in this test (measured: {', '.join(self.devices)})")
        return self.meters[device].stats(sites=sites)

    @property
    def peak(self) -> int | None:
        """Own peak so far: most bytes held at once by tensors allocated in
        this test."""
        return self.figures().peak

    @property
    def live(self) -> int | None:
        """Own bytes allocated in this test and still held now."""
        return self.figures().live

    @property
    def peak_total(self) -> int | None:
        return self.figures().peak_total

    @property
    def total(self) -> int | None:
        """The device's whole allocated total now (on the CPU: the bytes of
        tensors allocated while measuring that are still held)."""
        meter = self.meters.get(self.primary)
        return None if meter is None else meter.total_now()

    def mark(self, label: str) -> Mark:
        """Records a labelled point on the test's timeline."""
        mark = Mark(str(label), time.perf_counter() - self._t0)
        for device, meter in self.meters.items():
            s = meter.stats()
            mark.live[device] = s.live
            mark.total[device] = meter.total_now()
            if isinstance(meter, EngineMeter):
                mark.seq[device] = meter.seq()
        self.marks.append(mark)
        return mark

    def phases(self) -> list[Mark]:
        """The phases that marked themselves so far (the start of each
        top-level module forward, of backward, of each optimizer step),
        with where each ended; empty where the tracer did not run."""
        if not self._traced_once:
            return []
        by_slot = {meter.slot: device for device, meter in self.meters.items() if isinstance(meter, EngineMeter)}
        marks, open_ = [], {}
        for kind, slot, seq, label in tracing.phases():
            device = by_slot.get(slot)
            if device is None:
                continue
            if kind > 0:
                mark = Mark(label, 0.0, seq={device: seq}, kind="phase")
                marks.append(mark)
                open_[(device, kind)] = mark
            else:
                mark = open_.pop((device, -kind), None)
                if mark is not None:
                    mark.end[device] = seq
        return marks

    def timeline_marks(self, device: str) -> list[Mark]:
        """memlab.mark labels and phases on device's timeline, in order."""
        marks = [m for m in self.marks + self.phases() if device in m.seq]
        return sorted(marks, key=lambda m: m.seq[device])

    def context(self, device: str, seq: int | None) -> str:
        """Where event seq fell among the phases and marks: "during
        backward, after mark 'after forward'" ("" when nothing marks it)."""
        if seq is None:
            return ""
        words = []
        phase = mark = None
        for m in self.timeline_marks(device):
            if m.seq[device] >= seq:   # a mark at event n came after it: the peak did not
                break
            if m.kind == "phase":
                phase = m
            elif m.kind == "mark":
                mark = m
        if phase is not None:
            ended = phase.end.get(device)
            words.append(f"during {phase.label}" if ended is None or seq <= ended else f"after {phase.label}")
        if mark is not None:
            words.append(f"after mark {mark.label!r}")
        return ", ".join(words)

    def tensors(self, device: str | None = None, verbose: bool = False):
        """The storage report now (pytorch_memlab's MemReporter report, with
        memory by kind), and the blocks this test allocated that no Python
        tensor reaches (autograd's saved tensors, C++ caches), by site."""
        from ..lab.tensor_report import MemReporter, unreachable_blocks

        def add_blocks(report):
            for dev, meter in self.meters.items():
                if isinstance(meter, EngineMeter) and (device is None or dev == device):
                    unreachable_blocks(report, dev, meter.live_blocks())

        return MemReporter().collect(device, engine_blocks=add_blocks)

    def limit(self, max, device: str | None = None) -> "Limit":
        """A budget on a region: ``with memlab.limit("1G"): ...`` raises
        MemoryBudgetExceeded at the end of the block if the region's own
        peak exceeds it."""
        budget = parse_size(max)
        device = device or self.primary
        if device not in self.meters:
            reason = self.unmeasured.get(device, f"{device} is not measured in this test")
            raise RuntimeError(f"memlab.limit({max!r}) cannot measure {device}: {reason}")
        return Limit(self.core, device, budget)


_NO_WINDOW = contextlib.nullcontext()


class TraceWindow:
    def __init__(self, measurement: TraceWindows):
        self.measurement = measurement

    def __enter__(self):
        m = self.measurement
        self.on = WINDOWED and m.trace and m.final is None
        if self.on:
            m._trace_on()
        return self

    def __exit__(self, *exc):
        if self.on:
            self.measurement._trace_off()
        return False


class Limit:
    """``memlab.limit``: a region measured in a scope of its own."""

    def __init__(self, core: Core, device: str, budget: int):
        self.device = device
        self.budget = budget
        self.figures: DeviceFigures | None = None
        self._meter = make_meter(core, device)

    def __enter__(self) -> "Limit":
        self._meter.begin()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        __tracebackhide__ = True
        self.figures = self._meter.end()
        if exc_type is None and self.figures.peak is not None and self.figures.peak > self.budget:
            from ..judging.findings import Exceeded
            from ..judging.messages import budget_failure

            raise MemoryBudgetExceeded(budget_failure(
                Exceeded(self.device, "peak", self.figures.peak, "limit", self.budget), self.figures, top=5))
        return False
