"""Measuring one device over one interval (a meter), and one test over its
devices (a Measurement, which is also what the ``memlab`` fixture returns).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ._core import BRIDGE, COUNTERS, Core, engine
from .attribution import Attribution, LineStat, line_stats
from .devices import cuda_index, resolve, slot_of
from .sizes import parse_size
from .tracing import WINDOWED, tracing


class MemoryBudgetExceeded(AssertionError):
    """A ``memlab.limit`` region used more memory than its budget."""


@dataclass(slots=True)
class DeviceFigures:
    """What one device showed over one scope.  Sizes in bytes."""

    device: str
    measured: bool
    reason: str = ""                 # why not measured, or how measured
    backend: str = ""
    peak: int | None = None          # own peak
    peak_total: int | None = None    # device total at its highest
    total_at_peak: int | None = None
    reserved_peak: int | None = None
    start_total: int | None = None
    live: int | None = None          # own bytes still allocated
    allocs: int | None = None
    frees: int | None = None
    estimated: bool = False          # own figures estimated from counters
    seq_at_peak: int | None = None   # device event number of the own peak
    timeline: tuple | None = None    # (seq0, last, [(seq, own_min, own_max, total_min, total_max)])
    alloc_log: tuple | None = None   # ([(addr, size, time_us, site)], dropped): --memlab-snapshot
    attribution: Attribution | None = None   # where the own peak came from
    lines: list[LineStat] = field(default_factory=list)


class EngineMeter:
    """One scope of the C engine on one device."""

    def __init__(self, core: Core, device: str, detached: bool = False, timeline: bool = False,
                 log: bool = False):
        self.core = core
        self.device = device
        self.slot = slot_of(device)
        self.detached = detached
        self.timeline = timeline    # the device's timeline follows this scope
        self.log = log              # and its allocation log (--memlab-snapshot)
        self.scope_id: int | None = None

    def begin(self) -> None:
        bridge = self.core.bridge
        total = reserved = -1
        if self.slot != 0:
            torch_cuda = self.core.torch.cuda
            # Never initialise CUDA for a test that may not use it: until it
            # is initialised it holds nothing, and the reporter hears its
            # first allocations with their totals all the same.
            if torch_cuda.is_initialized():
                total, reserved = bridge.cuda_totals(torch_cuda, self.slot - 1)
                if bridge.tracker is None:
                    bridge.attach_tracker()
            else:
                total = reserved = 0
        log_max = 0
        if self.log:
            from .snapshot import MAX_ENTRIES

            log_max = MAX_ENTRIES
        self.scope_id = bridge.open_scope(self.slot, self.detached, total, reserved, self.timeline, log_max)

    def _figures(self, s: dict) -> DeviceFigures:
        return DeviceFigures(
            device=self.device, measured=True, backend=BRIDGE,
            peak=s["peak"], peak_total=s["peak_total"], total_at_peak=s["total_at_peak"],
            reserved_peak=s["reserved_peak"], start_total=s["start_total"], live=s["own"],
            allocs=s["allocs"], frees=s["frees"], seq_at_peak=s["seq_at_peak"],
        )

    def stats(self, sites: bool = False) -> DeviceFigures:
        """Figures so far; with sites, where the peak came from too."""
        raw = engine.stats(self.slot, self.scope_id, sites=sites)
        figures = self._figures(raw)
        if sites:
            figures.attribution = Attribution(raw)
        return figures

    def total_now(self) -> int:
        return engine.totals(self.slot)[0]

    def seq(self) -> int:
        """The device's event number now: where a mark falls on the timeline."""
        return engine.seq(self.slot)

    def own_live(self) -> int:
        """Bytes of blocks allocated in this scope and still allocated."""
        return engine.own(self.slot, self.scope_id)

    def live_blocks(self) -> list:
        """(addr, size, scope, site) of this scope's blocks still allocated."""
        return engine.blocks(self.slot, self.scope_id)

    def end(self, park: bool = False) -> DeviceFigures:
        s = self.core.bridge.close_scope(self.slot, self.scope_id, park)
        figures = self._figures(s)
        figures.attribution = Attribution(s)
        return figures


class CounterMeter:
    """The fallback: torch.cuda's counters.  The total peak is exact; the own
    peak is estimated as the growth of the total over its starting value (a
    lower bound: what was freed meanwhile of older tensors hides some)."""

    _open: dict[str, list["CounterMeter"]] = {}

    def __init__(self, core: Core, device: str, detached: bool = False, timeline: bool = False,
                 log: bool = False):
        self.core = core
        self.device = device
        self.index = cuda_index(device)
        self.seen_max = 0
        self.seen_max_reserved = 0

    def _fold(self) -> None:
        cuda = self.core.torch.cuda
        for meter in self._open.get(self.device, []):
            meter.seen_max = max(meter.seen_max, cuda.max_memory_allocated(self.index))
            meter.seen_max_reserved = max(meter.seen_max_reserved, cuda.max_memory_reserved(self.index))

    def begin(self) -> None:
        cuda = self.core.torch.cuda
        cuda.init()
        self._fold()  # enclosing meters keep what they saw before the reset
        cuda.reset_peak_memory_stats(self.index)
        self.start = cuda.memory_allocated(self.index)
        self.seen_max = self.start
        self.seen_max_reserved = cuda.memory_reserved(self.index)
        self._open.setdefault(self.device, []).append(self)

    def stats(self, sites: bool = False) -> DeviceFigures:
        cuda = self.core.torch.cuda
        peak_total = max(self.seen_max, cuda.max_memory_allocated(self.index))
        return DeviceFigures(
            device=self.device, measured=True, backend=COUNTERS, estimated=True,
            reason="own peak estimated from torch.cuda counters",
            peak=max(0, peak_total - self.start), peak_total=peak_total,
            reserved_peak=max(self.seen_max_reserved, cuda.max_memory_reserved(self.index)),
            start_total=self.start, live=max(0, cuda.memory_allocated(self.index) - self.start),
        )

    def total_now(self) -> int:
        return self.core.torch.cuda.memory_allocated(self.index)

    def end(self, park: bool = False) -> DeviceFigures:
        figures = self.stats()
        stack = self._open.get(self.device, [])
        if self in stack:
            stack.remove(self)
        for meter in stack:  # enclosing meters saw this one's peak too
            meter.seen_max = max(meter.seen_max, figures.peak_total)
            meter.seen_max_reserved = max(meter.seen_max_reserved, figures.reserved_peak)
        return figures


def make_meter(core: Core, device: str, detached: bool = False, timeline: bool = False, log: bool = False):
    cls = EngineMeter if core.name == BRIDGE else CounterMeter
    return cls(core, device, detached, timeline, log)


@dataclass
class Mark:
    label: str
    time: float
    own: dict = field(default_factory=dict)    # device -> own bytes then
    total: dict = field(default_factory=dict)  # device -> device total then
    seq: dict = field(default_factory=dict)    # device -> its event number then (the timeline's x)
    kind: str = "mark"                         # "mark" (memlab.mark) or "phase" (marked by itself)
    end: dict = field(default_factory=dict)    # a phase: device -> event number where it ended


class Measurement:
    """The running test's measurement: the ``memlab`` fixture.

    ``peak``, ``live``, ``total`` and ``peak_total`` speak of the test's
    primary device (its ``cuda_memory`` device, else the CPU); ``figures()``
    takes any measured device.
    """

    # Points of a timeline a report keeps per test and device (the engine
    # keeps up to TIMELINE_MAX; merging keeps every peak and trough).
    DETAIL_POINTS = 512

    def __init__(self, core: Core, devices: list[str], trace: bool = True, park: bool = False,
                 timeline: bool = False, log: bool = False):
        self.core = core
        self.detail = False      # fetch the timelines at the end (a report asked for them)
        self.park = park         # leave the tracer and torch's hooks ready for the next test
        self.trace = trace and core.name == BRIDGE
        self.trace_note = ""
        self._tracing = 0        # windows open now (and the span on 3.12+)
        self._traced_once = False
        self.meters = {}
        self.unmeasured: dict[str, str] = {}
        self.resolved: dict[str, str] = {}  # requested ("cuda") -> concrete
        for device in devices:
            concrete, reason = resolve(core, device)
            self.resolved[device] = concrete
            if reason:
                self.unmeasured[concrete] = reason
            else:
                self.meters[concrete] = make_meter(core, concrete, timeline=timeline, log=log)
        self.devices = list(self.meters) + list(self.unmeasured)
        self.marks: list[Mark] = []
        self.final: dict[str, DeviceFigures] | None = None
        self._t0 = 0.0

    # -- bracketing (the plugin calls these) --------------------------------
    def begin(self) -> None:
        self._t0 = time.perf_counter()
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
            engine.tracer_reset_lines()
            if not WINDOWED:
                self._trace_on()

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

    def window(self) -> "TraceWindow":
        """A region where user code may run (fixture setup, the test call,
        teardown): traced on Pythons where tracing costs every frame."""
        return TraceWindow(self)

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
            while self._tracing:
                self._trace_off()
        except Exception as exc:  # a scope decision raised: say so
            error = error or exc
        for device, meter in meters.items():
            fig = figures[device]
            if not fig.measured or meter.__class__ is not EngineMeter:
                continue
            if self._traced_once:
                fig.lines = line_stats(meter.slot)
            if self.detail and meter.timeline:
                fig.timeline = engine.timeline(meter.slot, self.DETAIL_POINTS)
            if meter.log:
                fig.alloc_log = engine.alloc_log_take(meter.slot)
        for device, reason in self.unmeasured.items():
            figures[device] = DeviceFigures(device, False, reason=reason)
        self.final = {d: figures[d] for d in self.devices}
        if error is not None:
            raise error
        return self.final

    def check_leaks(self, allowed: dict[str, int], top: int = 5, item=None) -> dict:
        """The leak protocol, before the measurement ends: for each device
        in allowed (device -> bytes allowed), whether the test's own blocks
        still allocated exceed the allowance once the process is settled.
        Returns device -> Leak for those that do.  Settling (a garbage
        collection, cuBLAS workspaces, a synchronisation) happens only when
        some device is over at first sight."""
        over = [d for d, limit in allowed.items()
                if isinstance(self.meters.get(d), EngineMeter) and self.meters[d].own_live() > limit]
        if not over:
            return {}
        from . import leaks

        started = time.perf_counter()
        leaks.settle(self.core, over)
        excused, look_past = leaks.released_by_pytest(item) if item is not None else (set(), set())
        found = {}
        for device in over:
            meter = self.meters[device]
            if meter.own_live() <= allowed[device]:
                continue
            leak = leaks.find(self.core, device, meter.live_blocks(), allowed[device], top, started,
                              excused, look_past)
            if leak.bytes > allowed[device]:
                found[device] = leak
        return found

    # -- the fixture's API ---------------------------------------------------
    @property
    def primary(self) -> str:
        if not self.devices:
            raise RuntimeError("this test measures no device")
        return self.devices[0]

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
            mark.own[device] = s.live
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
        for kind, slot, seq, label in engine.tracer_phases()[0]:
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
            else:
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
        from .storage import MemReporter, unreachable_blocks

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


def unpark() -> None:
    """Takes back what measured tests left parked for the next one (the
    tracer's events, torch's wrapped profiler hooks): before a test that
    memlab does not measure, and at the end of the session."""
    from ._core import unpark as unpark_bridge

    tracing.unpark()
    unpark_bridge()


class TraceWindow:
    def __init__(self, measurement: Measurement):
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
            from .text import budget_failure
            from .verdict import Exceeded

            raise MemoryBudgetExceeded(budget_failure(
                Exceeded(self.device, "peak", self.figures.peak, "limit", self.budget), self.figures, top=5))
        return False
