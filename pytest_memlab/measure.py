"""Measuring one device over one interval (a meter), and one test over its
devices (a Measurement, which is also what the ``memlab`` fixture returns).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ._core import BRIDGE, COUNTERS, Core, engine
from .attribution import Attribution, LineStat, line_stats, tracing
from .sizes import format_size, parse_size


class MemoryBudgetExceeded(AssertionError):
    """A ``memlab.limit`` region used more memory than its budget."""


@dataclass
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
    attribution: Attribution | None = None   # where the own peak came from
    lines: list[LineStat] = field(default_factory=list)

    def as_properties(self, prefix: str = "memlab") -> list[tuple[str, object]]:
        if not self.measured:
            return [(f"{prefix}.{self.device}.measured", "false")]
        props = [
            (f"{prefix}.{self.device}.peak", self.peak),
            (f"{prefix}.{self.device}.peak_total", self.peak_total),
            (f"{prefix}.{self.device}.leaked", self.live),
        ]
        if self.reserved_peak is not None:
            props.append((f"{prefix}.{self.device}.reserved_peak", self.reserved_peak))
        return props


def slot_of(device: str) -> int:
    """The engine's slot of a device: 0 the CPU, 1 + i cuda:i."""
    return engine.SLOT_CPU if device == "cpu" else 1 + int(device.split(":")[1])


class EngineMeter:
    """One scope of the C engine on one device."""

    def __init__(self, core: Core, device: str, detached: bool = False):
        self.core = core
        self.device = device
        self.slot = slot_of(device)
        self.detached = detached
        self.scope_id: int | None = None

    def begin(self) -> None:
        bridge = self.core.bridge
        total = reserved = -1
        if self.device != "cpu":
            torch = self.core.torch
            index = int(self.device.split(":")[1])
            torch.cuda.init()
            total = torch.cuda.memory_allocated(index)
            reserved = torch.cuda.memory_reserved(index)
        bridge.install()  # on this thread, until the scope ends
        if self.device == "cpu":
            bridge.cpu(True)
        else:
            bridge.cuda(True)
        try:
            self.scope_id = engine.begin(self.slot, detached=self.detached, total=total, reserved=reserved)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        bridge = self.core.bridge
        if self.device == "cpu":
            bridge.cpu(False)
        else:
            bridge.cuda(False)
        bridge.uninstall()

    def _figures(self, s: dict) -> DeviceFigures:
        return DeviceFigures(
            device=self.device, measured=True, backend=BRIDGE,
            peak=s["peak"], peak_total=s["peak_total"], total_at_peak=s["total_at_peak"],
            reserved_peak=s["reserved_peak"], start_total=s["start_total"], live=s["own"],
            allocs=s["allocs"], frees=s["frees"],
        )

    def stats(self) -> DeviceFigures:
        return self._figures(engine.stats(self.slot, self.scope_id))

    def total_now(self) -> int:
        return engine.totals(self.slot)[0]

    def end(self) -> DeviceFigures:
        try:
            raw = engine.end(self.slot, self.scope_id)
        finally:
            self._release()
        figures = self._figures(raw)
        figures.attribution = Attribution.from_scope(raw)
        return figures


class CounterMeter:
    """The fallback: torch.cuda's counters.  The total peak is exact; the own
    peak is estimated as the growth of the total over its starting value (a
    lower bound: what was freed meanwhile of older tensors hides some)."""

    _open: dict[str, list["CounterMeter"]] = {}

    def __init__(self, core: Core, device: str, detached: bool = False):
        self.core = core
        self.device = device
        self.index = int(device.split(":")[1])
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

    def stats(self) -> DeviceFigures:
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

    def end(self) -> DeviceFigures:
        figures = self.stats()
        stack = self._open.get(self.device, [])
        if self in stack:
            stack.remove(self)
        for meter in stack:  # enclosing meters saw this one's peak too
            meter.seen_max = max(meter.seen_max, figures.peak_total)
            meter.seen_max_reserved = max(meter.seen_max_reserved, figures.reserved_peak)
        return figures


def resolve_device(core: Core, device: str) -> tuple[str, str]:
    """Turns a spec's device into a concrete one, or says why it cannot be
    measured: returns (device, reason); reason is empty when measurable."""
    if core.name not in (BRIDGE, COUNTERS):
        return device, core.reason
    if device == "cpu":
        if core.name != BRIDGE:
            return device, f"CPU memory is measured only through the torch bridge ({core.reason})"
        return device, ""
    cuda = core.torch.cuda
    if not cuda.is_available():
        return device, "CUDA is not available"
    if device == "cuda":
        return f"cuda:{cuda.current_device()}", ""
    index = int(device.split(":")[1])
    if index >= cuda.device_count():
        return device, f"{device} does not exist ({cuda.device_count()} CUDA devices)"
    return device, ""


def make_meter(core: Core, device: str, detached: bool = False):
    cls = EngineMeter if core.name == BRIDGE else CounterMeter
    return cls(core, device, detached)


@dataclass
class Mark:
    label: str
    time: float
    own: dict = field(default_factory=dict)    # device -> own bytes then
    total: dict = field(default_factory=dict)  # device -> device total then


class Measurement:
    """The running test's measurement: the ``memlab`` fixture.

    ``peak``, ``live``, ``total`` and ``peak_total`` speak of the test's
    primary device (its ``cuda_memory`` device, else the CPU); ``figures()``
    takes any measured device.
    """

    def __init__(self, core: Core, devices: list[str], trace: bool = True):
        self.core = core
        self.trace = trace and core.name == BRIDGE
        self.traced = False
        self.trace_note = ""
        self.meters = {}
        self.unmeasured: dict[str, str] = {}
        self.resolved: dict[str, str] = {}  # requested ("cuda") -> concrete
        for device in devices:
            concrete, reason = resolve_device(core, device)
            self.resolved[device] = concrete
            if reason:
                self.unmeasured[concrete] = reason
            else:
                self.meters[concrete] = make_meter(core, concrete)
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
        if self.trace and self.meters:
            self.traced = tracing.acquire(paths=True)
            if self.traced:
                engine.tracer_reset_lines()
            else:
                self.trace_note = tracing.off_reason

    def end(self) -> dict[str, DeviceFigures]:
        figures: dict[str, DeviceFigures] = {}
        error = None
        for device, meter in reversed(list(self.meters.items())):
            try:
                figures[device] = meter.end()
            except Exception as exc:  # keep closing the others
                error = error or exc
                figures[device] = DeviceFigures(device, False, reason=f"measurement failed: {exc}")
        if self.traced:
            self.traced = False
            try:
                tracing.release(paths=True)
            except Exception as exc:  # a scope decision raised: say so
                error = error or exc
            for device, fig in figures.items():
                if fig.measured:
                    fig.lines = line_stats(slot_of(device))
        for device, reason in self.unmeasured.items():
            figures[device] = DeviceFigures(device, False, reason=reason)
        self.final = {d: figures[d] for d in self.devices}
        if error is not None:
            raise error
        return self.final

    # -- the fixture's API ---------------------------------------------------
    @property
    def primary(self) -> str:
        if not self.devices:
            raise RuntimeError("this test measures no device")
        return self.devices[0]

    def figures(self, device: str | None = None) -> DeviceFigures:
        """Figures so far (or final, after the test) for a device."""
        device = device or self.primary
        if self.final is not None:
            return self.final[device]
        if device in self.unmeasured:
            return DeviceFigures(device, False, reason=self.unmeasured[device])
        if device not in self.meters:
            raise KeyError(f"{device} is not measured in this test (measured: {', '.join(self.devices)})")
        return self.meters[device].stats()

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
        self.marks.append(mark)
        return mark

    @contextmanager
    def limit(self, max, device: str | None = None):
        """A budget on a region: if the region's own peak exceeds ``max``,
        raises MemoryBudgetExceeded at the end of the block."""
        budget = parse_size(max)
        device = device or self.primary
        if device not in self.meters:
            reason = self.unmeasured.get(device, f"{device} is not measured in this test")
            raise RuntimeError(f"memlab.limit({max!r}) cannot measure {device}: {reason}")
        meter = make_meter(self.core, device)
        meter.begin()
        region = Region(device, budget)
        try:
            yield region
        finally:
            region.figures = meter.end()
        if region.figures.peak is not None and region.figures.peak > budget:
            raise MemoryBudgetExceeded(
                budget_failure(device, "peak", region.figures.peak, "limit", budget, region.figures, top=5)
            )


@dataclass
class Region:
    device: str
    budget: int
    figures: DeviceFigures | None = None


def budget_failure(device: str, what: str, value: int, name: str, budget: int, figures: DeviceFigures,
                   top: int = 5) -> str:
    """A failure, shortest first: the figure, the budget and the excess; then
    where the own peak was reached and what was live then, by site."""
    lines = [f"{device} {what} {format_size(value)} exceeds {name} {format_size(budget)} by {format_size(value - budget)}"]
    if figures.attribution is not None and figures.peak:
        lines += figures.attribution.describe(figures.peak, top)
    lines.append(f"  exactly {value} B against {budget} B")
    if figures.estimated:
        lines.append(f"  ({figures.reason})")
    return "\n".join(lines)
