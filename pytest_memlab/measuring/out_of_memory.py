"""A measured test that runs out of memory: the request, the device then,
and who held what was allocated (this test's lines, the blocks earlier
tests left and who holds them, the rest), added to the test's own failure.

The moment: on CUDA, torch calls out-of-memory observers on the
allocating thread, with the GIL and without the allocator's lock, before
it raises; the observer (attached once, the first time a measured test
opens CUDA) takes the figures then, while the test's temporaries are
still allocated.  It returns at once when no test is measured.  On the CPU
torch raises at once, for a request the machine cannot serve; the
figures are taken when the failure is reported, while its traceback still
holds the test's frames and their tensors.

Nothing here runs unless a test ran out of memory.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

from ..devices import CPU
from ..engine.attribution import Frame, SiteBytes, bytes_by_site, chain_of, frame_of
from ..engine.bridge import on_cuda_start
from ..engine import tracing as tracing_module
from ..engine.tracing import tracing
from ..sizes import format_size

# DefaultCPUAllocator's message (c10/core/impl/alloc_cpu.cpp), stable since torch 1.x
_CPU = re.compile(r"can't allocate memory: you tried to allocate (\d+) bytes")
_CUDA_DEVICE = re.compile(r"GPU (\d+) has a total capacity")
_CUDA_REQUEST = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
HOLDER_SECONDS = 5.0     # the holder search of the blocks earlier tests left


@dataclass
class Moment:
    """A device's figures when a request failed."""

    device: str
    request: int | None
    allocated: int | None = None
    reserved: int | None = None
    free: int | None = None
    capacity: int | None = None
    own: list = field(default_factory=list)      # [SiteBytes] this test's live blocks by site
    chain: list = field(default_factory=list)    # [Frame] the user call chain that asked, innermost first
    at_error: bool = True                        # taken before the stack unwound
    phase: str = ""                              # from the allocating thread's stack, where it shows one
    when: str = ""                               # when the figures were taken, where not at the error
    note: str = ""


# -- what failed ------------------------------------------------------------------
def _cuda_started(torch) -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def _torch_out_of_memory(torch):
    """torch's out-of-memory error class (torch.OutOfMemoryError, or
    torch.cuda's in older torch), or None."""
    return getattr(torch, "OutOfMemoryError", None) or getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)


def out_of_memory_words(exc: BaseException | None) -> str | None:
    """An error, in a few words, where it is an out-of-memory on any device:
    torch's OutOfMemoryError (explained or not), or a RuntimeError that says
    so (the CPU allocator's "can't allocate memory", another backend's "out
    of memory"); else None.  --memlab-pack re-runs such a test alone."""
    if exc is None:
        return None
    oom = _torch_out_of_memory(sys.modules.get("torch"))
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if (oom is not None and isinstance(exc, oom)) or (isinstance(exc, RuntimeError) and (
            "out of memory" in text.lower() or "can't allocate memory" in text.lower())):
        return f"{type(exc).__name__}: {text[:120]}"
    return None


def failed_request(exc: BaseException) -> tuple[str, int | None] | None:
    """(device, requested bytes or None) when exc is torch's out-of-memory
    error, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    oom = _torch_out_of_memory(torch)
    text = str(exc)
    if oom is not None and isinstance(exc, oom):
        m = _CUDA_DEVICE.search(text)
        if m is None and not _cuda_started(torch):   # another device's (or a test's own): no CUDA to explain
            return None
        r = _CUDA_REQUEST.search(text)
        request = int(float(r.group(1)) * _UNITS[r.group(2)]) if r else None   # rounded: the observer's is exact
        return f"cuda:{m.group(1) if m else 0}", request
    if isinstance(exc, RuntimeError):
        m = _CPU.search(text)
        if m:
            return CPU, int(m.group(1))
    return None


# -- the moment ---------------------------------------------------------------------
def stack_of_frame(frame) -> list:
    """[(frame, line)] from frame outwards: innermost first."""
    stack = []
    while frame is not None:
        stack.append((frame, frame.f_lineno))
        frame = frame.f_back
    return stack


def stack_of_traceback(tb) -> list:
    """[(frame, line)] of a traceback, innermost first (the line each
    frame was at when the error went through it)."""
    stack = []
    while tb is not None:
        stack.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return stack[::-1]


def user_chain(stack) -> list[Frame]:
    """The in-scope frames of a stack (innermost first), as Frames."""
    scope = tracing.scope
    if scope.rootdir is None:
        return []
    return [frame_of(f.f_code, line) for f, line in stack if scope.file_in_scope(f.f_code.co_filename)]


def _cpu_figures() -> tuple[int | None, int | None]:
    """The machine's available and physical memory."""
    capacity = free = None
    try:
        capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    return free, capacity


def take_moment(measurement, device: str, request: int | None, frame=None, at_error: bool = True) -> Moment:
    """The device's figures now; frame: the allocating thread's Python
    frame (the observer's caller), whose user chain asked."""
    moment = Moment(device, request, at_error=at_error)
    meter = measurement.meters.get(device) if measurement is not None else None
    if meter is not None and hasattr(meter, "live_blocks"):
        moment.own = [SiteBytes(b, chain) for b, chain in bytes_by_site(meter.live_blocks())]
    if device == CPU:
        # the CPU's ledger keeps a test's blocks only while it is measured:
        # what is allocated is this test's and, added by explain, what
        # earlier tests left (as memlab heard them)
        moment.free, moment.capacity = _cpu_figures()
    else:
        cuda = sys.modules["torch"].cuda
        index = int(device.split(":")[1])
        stats = cuda.memory_stats(index)
        moment.allocated = stats.get("allocated_bytes.all.current")
        moment.reserved = stats.get("reserved_bytes.all.current")
        moment.free, moment.capacity = cuda.mem_get_info(index)
    if frame is not None:
        stack = stack_of_frame(frame)
        moment.chain = user_chain(stack)
        moment.phase = phase_of(stack)
    if meter is not None and hasattr(meter, "seq"):
        # the point on the test's timeline (the HTML report marks it)
        from .measurement import Mark

        size = format_size(request) if request is not None else "a request"
        measurement.marks.append(Mark(f"out of memory: {size}", 0.0, seq={device: meter.seq()}, kind="oom"))
    return moment


def cpu_failures(measurement) -> tuple[int, int, int] | None:
    """(count, bytes, site) of the CPU requests torch's allocator could not
    serve so far (memlab's CPU allocator hears them before the error is
    raised), where the measurement measures the CPU with the engine."""
    meter = measurement.meters.get(CPU) if measurement is not None else None
    if meter is None or not hasattr(meter, "failed_requests"):
        return None
    return meter.failed_requests()


def cpu_failure_count(measurement) -> int:
    """How many CPU requests failed so far (0 where the CPU is not measured
    with the engine): a test's or a child's count when it begins."""
    failures = cpu_failures(measurement)
    return failures[0] if failures is not None else 0


def cpu_moment(measurement, before: int) -> Moment | None:
    """The latest CPU request that failed since the count was before, as
    memlab's allocator heard it (its bytes and the line that asked), with
    the live blocks now."""
    failures = cpu_failures(measurement)
    if failures is None or failures[0] <= before:
        return None
    _, size, site = failures
    moment = take_moment(measurement, CPU, size, at_error=False)
    moment.chain = chain_of(site)
    return moment


class Observer:
    """torch's CUDA out-of-memory observer: one per process (torch has no
    detach), forwarding to the test measured now, if any."""

    attached = False
    run = None          # the TestRun measured now (the plugin sets it)

    @classmethod
    def attach(cls, torch, starting: bool = False) -> None:
        """starting: called as CUDA initialises (its allocators exist; its
        flag is not set yet)."""
        if cls.attached:
            return
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None or not (starting or torch.cuda.is_initialized()):
            return
        attach(cls._observed)
        cls.attached = True

    @classmethod
    def attach_as_cuda_starts(cls, torch) -> None:
        """The bridge's hook as CUDA initialises (engine/bridge.py)."""
        cls.attach(torch, starting=True)

    @classmethod
    def _observed(cls, device, alloc, device_allocated, device_free) -> None:
        run = cls.run
        if run is None or run.measurement is None:
            return
        try:
            run.out_of_memory = [*run.out_of_memory, take_moment(run.measurement, f"cuda:{int(device)}", int(alloc),
                                                                 sys._getframe(1))]
        except Exception as exc:   # memlab's trouble, never the test's
            run.error = run.error or f"the out-of-memory figures were not taken: {type(exc).__name__}: {exc}"


on_cuda_start(Observer.attach_as_cuda_starts)


# -- whose it was -------------------------------------------------------------------
@dataclass
class Holder:
    """A share of the allocated bytes: this test's line, an earlier test's
    blocks, or the rest."""

    kind: str               # "own", "earlier test", "outside"
    bytes: int
    chain: list = field(default_factory=list)     # own: the line's user call chain
    test: str = ""                                # earlier test: its node id
    sites: list = field(default_factory=list)     # earlier test: [(bytes, chain)]
    holders: list = field(default_factory=list)   # earlier test: reference paths that hold its tensors


def earlier_tests(session, core, device: str, seconds: float = HOLDER_SECONDS) -> list[Holder]:
    """The blocks that earlier tests left on device and that are still
    allocated, per test, with who holds them (the holder search, now)."""
    from .leak_search import allocated_blocks, find_held, released_by_pytest

    left = session.suspects.still_held(device) if session is not None else []
    if not left:
        return []
    excused, look_past = released_by_pytest(None)
    leaks = find_held(core, device, [(blocks, 0) for _, blocks in left], None, excused, look_past,
                      seconds=seconds, alive=allocated_blocks(core.torch, device))
    out = []
    for i, (suspect, blocks) in enumerate(left):
        holder = Holder("earlier test", sum(b[1] for b in blocks), test=suspect.nodeid)
        leak = leaks[i] if leaks else None
        if leak is not None:
            for site in leak.sites:
                holder.sites.append((site.bytes, site.chain))
                for t in site.tensors:
                    holder.holders += [h for h in t.holders if h not in holder.holders]
        else:
            holder.sites = bytes_by_site(blocks)
        out.append(holder)
    return sorted(out, key=lambda h: -h.bytes)


def phase_of(stack) -> str:
    """The outermost phase function of a stack ([(frame, line)], innermost
    first): forward (of which module), backward, optimizer step; "" where
    none ran."""
    t = tracing_module
    codes = t._phase_codes()
    names = {1 + t.PHASE_FORWARD: "forward", 1 + t.PHASE_BACKWARD: "backward", 1 + t.PHASE_STEP: "optimizer step"}
    found = ""
    for frame, _ in stack:
        kind = codes.get(frame.f_code)
        if kind is not None:
            found = names.get(kind, "")
            if kind == 1 + t.PHASE_FORWARD:
                module = frame.f_locals.get("self")
                if module is not None:
                    found += f" ({type(module).__name__})"
    return found


# -- the section ----------------------------------------------------------------------
@dataclass
class Explanation:
    moment: Moment
    phase: str
    holders: list
    caught: bool = False     # the test caught the error (it passed, or failed otherwise)
    measured: bool = True    # the test measures the device
    rendered: str = ""       # text(top), as the failure shows it
    whose: str = "this test"  # whose own blocks: a measured child's are "this process"

    def as_dict(self) -> dict:
        m = self.moment
        return {
            "device": m.device, "request": m.request, "phase": self.phase or None, "caught": self.caught,
            "at_error": m.at_error,
            "line": [f.as_dict() for f in m.chain],
            "allocated": m.allocated, "reserved": m.reserved, "free": m.free, "capacity": m.capacity,
            "outside_pytorch": _outside_pytorch(m),
            "holders": [_holder_dict(h) for h in self.holders],
            "measured": self.measured,
            "text": self.rendered,
        }

    def text(self, top: int) -> str:
        m = self.moment
        request = format_size(m.request) if m.request is not None else "an unknown size"
        lines = [f"memlab: {m.device} ran out of memory: {request} requested"
                 + (f" in {self.phase}" if self.phase else "")]
        if m.chain:
            lines.append(f"  asked at {m.chain[0]}")
            lines += [f"      <- {f}" for f in m.chain[1:]]
        state = []
        if m.allocated is not None:
            heard = " (tensors memlab heard)" if m.device == CPU else ""
            state.append(f"allocated {format_size(m.allocated)}{heard}")
        if m.reserved is not None and m.allocated is not None:
            state.append(f"reserved but unallocated {format_size(m.reserved - m.allocated)}")
        if m.free is not None:
            state.append(f"free {format_size(m.free)}")
        if m.capacity is not None:
            state.append(f"capacity {format_size(m.capacity)}")
        outside = _outside_pytorch(m)
        if outside is not None:
            state.append(f"outside PyTorch {format_size(outside)}")
        when = "at the error" if m.at_error else (m.when or "when the failure was reported")
        lines.append(f"  the {'device' if m.device != CPU else 'machine'} {when}: " + ", ".join(state))
        if (m.reserved is not None and m.allocated is not None and m.request is not None
                and m.reserved - m.allocated >= m.request):
            lines.append(f"  the {format_size(m.reserved - m.allocated)} reserved but unallocated would have served "
                         "the request, but in pieces each too small for it: fragmentation "
                         "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets PyTorch grow a segment instead)")
        if not self.measured:
            lines.append(f"  (this test does not measure {m.device}: mark it "
                         f"{'cpu_memory' if m.device == CPU else 'cuda_memory'} to see who held it)")
            return "\n".join(lines)
        if not self.holders:
            if not self.caught:
                lines.append("  nothing memlab measured was allocated then")
            return "\n".join(lines)
        total = m.allocated or sum(h.bytes for h in self.holders) or 1
        lines.append(f"  who held the {format_size(m.allocated or 0)} allocated, largest first:")
        for h in self.holders:
            share = f"{100 * h.bytes / total:.0f}%"
            if h.kind == "own":
                where = str(h.chain[0]) if h.chain else "a line out of scope"
                lines.append(f"  {format_size(h.bytes):>10} {share:>4}  {self.whose}: {where}")
                lines += [f"                        <- {f}" for f in h.chain[1:3]]
            elif h.kind == "earlier test":
                held = f" (held by: {'; '.join(h.holders[:3])})" if h.holders else ""
                lines.append(f"  {format_size(h.bytes):>10} {share:>4}  left by {h.test}{held}")
                for b, chain in h.sites[:top]:
                    where = str(chain[0]) if chain else "a line out of scope"
                    lines.append(f"                        {format_size(b)} allocated at {where}")
            else:
                lines.append(f"  {format_size(h.bytes):>10} {share:>4}  {h.test}")
        if m.note:
            lines.append(f"  ({m.note})")
        return "\n".join(lines)


def _outside_pytorch(m: Moment) -> int | None:
    if m.device == CPU or None in (m.capacity, m.free, m.reserved):
        return None
    return max(0, m.capacity - m.free - m.reserved)


def _holder_dict(h: Holder) -> dict:
    out = {"kind": h.kind, "bytes": h.bytes}
    if h.kind == "own":
        out["line"] = [f.as_dict() for f in h.chain]
    elif h.kind == "earlier test":
        out["test"] = h.test
        out["sites"] = [{"bytes": b, "line": [f.as_dict() for f in chain]} for b, chain in h.sites]
        out["held_by"] = list(h.holders)
    else:
        out["what"] = h.test
    return out


def explain(run, exc: BaseException, tb, session, core, top: int, caught: bool = False,
            moment: Moment | None = None, whose: str = "this test") -> Explanation | None:
    """The section for a test that ran out of memory (exc: the error, tb
    its traceback), or None where exc is no out-of-memory."""
    if moment is None:
        failed = failed_request(exc) if exc is not None else None
        if failed is None:
            return None
        device, request = failed
        moment = next((m for m in reversed(run.out_of_memory) if m.device == device), None)
        if moment is None:
            moment = take_moment(run.measurement, device, request, at_error=False)
    stack = stack_of_traceback(tb)
    if not moment.chain:
        moment.chain = user_chain(stack)
    measured = run.measurement is not None and moment.device in run.measurement.meters
    holders = _holders(moment, session, core) if measured else []
    explanation = Explanation(moment, phase_of(stack) or moment.phase, holders, caught, measured=measured, whose=whose)
    explanation.rendered = explanation.text(top)
    return explanation


def _holders(moment: Moment, session, core) -> list[Holder]:
    """Who held the device's allocated bytes at the moment, largest first:
    the test's own lines, the earlier tests' blocks, the rest."""
    holders = [Holder("own", s.bytes, chain=s.chain) for s in moment.own if s.bytes]
    try:
        holders += earlier_tests(session, core, moment.device)
    except Exception as exc:   # the search is memlab's; the section goes on without it
        moment.note = f"the blocks earlier tests left were not searched: {type(exc).__name__}: {exc}"
    if moment.device == CPU:
        moment.allocated = sum(h.bytes for h in holders)
    elif moment.allocated is not None:
        rest = moment.allocated - sum(h.bytes for h in holders)
        if rest > 0:
            holders.append(Holder("outside", rest, test="allocated outside this test and not among the leaks of "
                                                        "earlier tests (broader fixtures, what pytest keeps of an "
                                                        "earlier failure, between tests, before memlab measured, "
                                                        "or not heard)"))
    holders.sort(key=lambda h: -h.bytes)
    return holders
