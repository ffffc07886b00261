"""Meters: one device measured over one interval.  An EngineMeter is a
scope of the C engine (exact, with line attribution); a CounterMeter reads
torch.cuda's counters where the bridge is unavailable.  Both give
DeviceFigures, whose field names are the engine's (see the README's figure
model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import _engine as engine
from ..devices import CPU, cuda_index
from ..figures import PHASE_NAMES
from .attribution import Attribution, LineStat
from .backend import BRIDGE, COUNTERS, Core
from .slots import SLOT_CPU, slot_of

class Watch:
    """Leak suspects' addresses on one device, watched by the engine until
    an allocation or a free is heard there (then the suspect's block is
    gone, whether or not memlab heard it go)."""

    def __init__(self, device: str):
        self.slot = slot_of(device)

    def add(self, addrs: list) -> None:
        engine.watch(self.slot, addrs)

    def still(self, addrs: list) -> list:
        return engine.watched(self.slot, addrs)

    def clear(self) -> None:
        engine.unwatch(self.slot)


# Allocation log entries kept per test and device (--memlab-snapshot); past
# it entries are counted, not kept.
ALLOC_LOG_MAX = 1 << 20


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
    # What the test kept (see Kept): the own peak above leaves it out
    peak_with_kept: int | None = None   # the own peak counting it
    kept: int | None = None             # bytes of its blocks still held after teardown
    # Each phase's own peak (forward, backward, step: those that ran on the
    # measuring thread while it was traced), without what it kept, as peak;
    # name -> (bytes, site of the allocation that reached it, 0: live at the
    # phase's start)
    phase_peaks: dict = field(default_factory=dict)
    # The bytes live at the own peak by kind (measuring/memory_kinds.py), for
    # a test with phases; else None, and kinds_note says why where it matters
    kinds: dict | None = None
    kinds_note: str = ""
    phase_kinds: dict = field(default_factory=dict)   # phase name -> kinds at that phase's peak
    kinds_pending: tuple | None = None   # how kinds are made, until asked (figures.resolve_kinds)
    kind_lives: tuple | None = None   # (memory_kinds.Blocks, the log's first event): the timeline's kinds


@dataclass(slots=True)
class Kept:
    """A scope's peak without the blocks it keeps past its end: memory a
    test allocates once for the whole process (a library's workspace, a
    cache filled on first use), which lands in whichever test needs it
    first, and what it leaks; either way not what the test needs while it
    runs, so that the peak does not depend on what ran before it."""

    peak: int
    seq: int                 # the event number where it was reached
    site: int                # the site whose allocation reached it
    bytes: int               # what is kept
    blocks: list             # (addr, size, seq, site) kept, in allocation order
    phases: dict = field(default_factory=dict)   # phase name -> (peak, site), as peak


def head_phase_peaks(head_phases) -> dict:
    """Each phase's peak before the first kept block, {name: (bytes,
    site)}, from engine.kept's head phases (None: no phase ran)."""
    return {name: (most, at) for name, (most, at) in zip(PHASE_NAMES, head_phases or ()) if most >= 0}


def peak_without_kept(raw, transient=frozenset()) -> Kept | None:
    """The peak without the live blocks of raw (engine.kept's answer),
    except those at the addresses in transient (what pytest releases right
    after teardown: they count as freed).  None where the engine did not
    follow the scope."""
    if raw is None:
        return None
    (best, seq, site, head_phases), blocks = raw
    phases = head_phase_peaks(head_phases)
    cum = 0
    kept = []
    for addr, size, span_max, span_seq, alloc_seq, alloc_site, span_site, span_phases in blocks:
        if addr not in transient:
            cum += size
            kept.append((addr, size, alloc_seq, alloc_site))
        if span_max - cum > best:
            best, seq, site = span_max - cum, span_seq, span_site
        if span_phases is None:   # no phase ran in its span
            continue
        for name, (most, at) in zip(PHASE_NAMES, span_phases):
            if most >= 0 and (name not in phases or most - cum > phases[name][0]):
                phases[name] = (most - cum, at)
    return Kept(best, seq, site, cum, kept, phases)


def leave_out_kept(figures: DeviceFigures, kept: Kept) -> None:
    """figures' own peak without what the scope kept (the figures of
    record: budgets and baselines judge these).  Where the peak without it
    came at another moment, the lines live then are those at the peak with
    it, less the kept blocks: the attribution says so."""
    figures.peak_with_kept = figures.peak
    figures.kept = kept.bytes
    figures.phase_peaks = dict(kept.phases)
    if not kept.blocks:
        return
    taken = figures.seq_at_peak or 0     # where the lines at the peak were taken
    same_moment = kept.seq == taken
    figures.peak = kept.peak
    if not same_moment:
        figures.seq_at_peak = kept.seq
        figures.total_at_peak = None
    if figures.attribution is not None:
        figures.attribution = figures.attribution.without(
            [(site, size) for _, size, seq, site in kept.blocks if seq <= taken], kept.site, same_moment)


def figures_without_kept(figures: DeviceFigures, kept: Kept | None) -> None:
    """A closed scope's figures of record: without what it kept where the
    engine followed it (kept), else, where nothing is left, its peak is
    the peak with it and it kept nothing."""
    if kept is not None:
        leave_out_kept(figures, kept)
    elif figures.measured and figures.peak is not None and figures.live == 0:
        figures.peak_with_kept, figures.kept = figures.peak, 0


class EngineMeter:
    """One scope of the C engine on one device."""

    def __init__(self, core: Core, device: str, detached: bool = False, timeline: bool = False,
                 log: bool = False):
        self.core = core
        self.device = device
        self.slot = SLOT_CPU if device == CPU else slot_of(device)   # (the CPU's answer, written out)
        self.detached = detached
        self.timeline = timeline    # the device's timeline follows this scope
        self.log = log              # and its allocation log (--memlab-snapshot)
        self.scope_id: int | None = None

    def begin(self) -> None:
        bridge = self.core.bridge
        total = reserved = -1
        if self.slot == 0:
            if bridge.cpu_allocator is None:   # given back at an earlier session's end
                bridge.install_cpu_allocator()
        else:
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
        log_max = ALLOC_LOG_MAX if self.log else 0
        self.scope_id = bridge.open_scope(self.slot, self.detached, total, reserved, self.timeline, log_max)

    def _figures(self, s: dict) -> DeviceFigures:
        return DeviceFigures(
            device=self.device, measured=True, backend=BRIDGE,
            peak=s["peak"], peak_total=s["peak_total"], total_at_peak=s["total_at_peak"],
            reserved_peak=s["reserved_peak"], start_total=s["start_total"], live=s["live"],
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

    def failed_requests(self) -> tuple[int, int, int]:
        """(count, bytes, site): the requests the device's allocator could
        not serve so far (memlab's CPU allocator hears them before torch
        raises), the latest one's bytes and call chain."""
        return engine.failed(self.slot)   # (a tuple)

    def seq(self) -> int:
        """The device's event number now: where a mark falls on the timeline."""
        return engine.seq(self.slot)

    def live(self) -> int:
        """Bytes of blocks allocated in this scope and still allocated."""
        return engine.live(self.slot, self.scope_id)

    def kept(self, transient=frozenset()) -> Kept | None:
        """This scope's peak without its blocks still allocated now, those
        at the addresses in transient aside; None where the engine does not
        follow it (a scope without a timeline, or one inside which another
        test was measured)."""
        return peak_without_kept(self.kept_raw(), transient)

    def kept_raw(self) -> tuple | None:
        """engine.kept's answer for this scope, for peak_without_kept: its
        blocks say whether anything is kept at all (most tests keep
        nothing, and then nothing pytest holds needs looking for)."""
        return engine.kept(self.slot, self.scope_id)

    def live_blocks(self) -> list:
        """(addr, size, scope, site) of this scope's blocks still allocated."""
        return engine.blocks(self.slot, self.scope_id)

    def timeline_points(self, points: int) -> tuple:
        """The device's latest timeline (this scope's, once it closed),
        merged into at most points points: (seq0, last, [(seq, own_min,
        own_max, total_min, total_max)])."""
        return engine.timeline(self.slot, points)

    def take_alloc_log(self, keep: bool = False) -> tuple | None:
        """The allocation log of this scope (--memlab-snapshot, the memory
        by kind): ([(addr, size, time_us, site, seq, counts)], dropped),
        taken once; with keep, a copy (the log goes on)."""
        return engine.alloc_log_take(self.slot, keep)

    def start_alloc_log(self, entries: int) -> None:
        """Logs this scope's allocations and frees from now on (at most
        entries: past them they are counted)."""
        engine.alloc_log_start(self.slot, self.scope_id, entries)

    def end_plain(self, failed: int, park: bool = False) -> tuple | None:
        """end where the scope's blocks are all freed, the device's count
        of failed requests is still failed and nothing is kept (a plain
        run's end: plain_run.py): (peak, peak_total, reserved_peak, head),
        head engine.kept's (None where the engine does not follow the
        scope); else None, the scope still open.  One engine call for all
        that a plain test's end asks of it."""
        return self.core.bridge.close_plain(self.slot, self.scope_id, failed, park)

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


