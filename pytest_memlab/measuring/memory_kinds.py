"""Memory by kind: what the bytes live at a test's peak were.

A block's kind comes from what the engine already hears, and from a walk at
the phase boundaries the tracer hears (never work in the allocator's path):

- **parameter, buffer, gradient, optimizer state**: its storage was one of
  the module's parameters or buffers, a parameter's ``.grad`` or a tensor of
  the optimizer's state, seen by the walk while the block lived (the walk
  notes the device's event number, so an address taken again later is not
  confused with the block that had it);
- **activation**: made in a forward and still live when that forward ended
  (kept for the backward);
- **temporary**: made and freed within one phase;
- **input**: a forward's positional argument (a tensor, or one in a
  list, tuple or dict of them), seen as the forward started;
- **other**: the rest (a loss made between phases, a backward's or step's
  output that is no gradient or state).

The engine logs each device's allocations and frees from the test's first
phase on (a test without phases pays nothing); at the end the blocks live at
the own peak of record (its moment, less what the test kept) are summed by
kind, so the kinds add up to the own peak, exactly.
"""

from __future__ import annotations

import bisect
import itertools
import weakref

from ..engine.heap import storage_address
from ..engine.slots import slot_of
# The kinds' names and words, and their resolving on first use, are the
# figures' (a leaf the verdicts and reports read them from); known here too.
from ..figures import KIND_WORDS, KINDS, PHASE_NAMES  # noqa: F401
from ..figures import resolve_kinds as resolve  # noqa: F401

# A walk's finding wins over another's for the same block in this order
# (a parameter is also in the optimizer's groups).
_RANK = {"parameter": 0, "buffer": 1, "gradient": 2, "optimizer_state": 3, "input": 4}
# Entries of a device's allocation log kept for a test's kinds (40 bytes
# each); past it they are counted and the kinds are not given.
KIND_LOG_MAX = 1 << 21

FORWARD, BACKWARD, STEP = 1, 2, 3   # csrc/phases.h
NEVER = 1 << 63                      # the event number of a free that never came


class KindWalk:
    """The tracer's phase hook during one measured test: at each boundary,
    the storages of the module's and the optimizer's tensors, with each
    device's event number.  Never raises into the test: trouble is kept in
    ``error`` and the kinds are not given.

    What it walks is what may be new since it last looked, so that a long
    training loop pays per step for its gradients, not for its whole model
    and state: a module's parameters and buffers at its first forward; the
    gradients at each backward's end (through the optimizers' flat groups
    where it knows one, else through the modules seen); an optimizer's
    parameters at its first step, its gradients at a step no backward came
    before, its state at a step's end while the state grows (Adam's is made
    at the first step and then updated in place).  It holds the modules and
    optimizers weakly: measuring keeps nothing alive."""

    def __init__(self, meters: dict):
        self.meters = {meter.slot: meter for meter in meters.values()}
        self.started: set[int] = set()
        self._modules: dict = {}        # id -> weak reference, top-level modules seen
        self._optimizers: dict = {}     # id -> weak reference, optimizers seen
        self._state_noted: dict = {}    # optimizer's id -> its state entries when last noted
        self._backward_since_step = False
        self.marks: dict = {}           # (slot, addr) -> [(seq, kind)]
        self.error = ""
        self._slots: dict = {}          # torch.device -> slot (-1: not measured)

    def __call__(self, kind: int, subject, inputs=None) -> None:
        try:
            self._on(kind, subject, inputs)
        except Exception as exc:  # memlab's trouble, never the test's
            self.error = self.error or f"{type(exc).__name__}: {exc}"

    def _on(self, kind: int, subject, inputs) -> None:
        if not self.started:
            self._start_logs()
        seqs: dict = {}   # slot -> its event number: nothing is allocated during a walk
        if kind == FORWARD:
            if inputs:
                self._note_inputs(inputs, seqs)
            if subject is not None and _first_sight(self._modules, subject) is not None:
                self._note_module(subject, seqs)
        elif kind == -BACKWARD:
            self._backward_since_step = True
            optimizers = [o for o in (ref() for ref in self._optimizers.values()) if o is not None]
            if optimizers:
                for optimizer in optimizers:
                    self._note_grads(optimizer, seqs)
            else:
                for ref in self._modules.values():
                    module = ref()
                    if module is not None:
                        for p in module.parameters():
                            self._note(p.grad, "gradient", seqs)
        elif kind == STEP and subject is not None and hasattr(subject, "param_groups"):
            if _first_sight(self._optimizers, subject) is not None:
                self._state_noted[id(subject)] = -1
                for group in subject.param_groups:
                    for p in group.get("params", ()):
                        self._note(p, "parameter", seqs)
                self._note_grads(subject, seqs)
            elif not self._backward_since_step:
                self._note_grads(subject, seqs)
            self._backward_since_step = False
        elif kind == -STEP and subject is not None and id(subject) in self._state_noted:
            state = getattr(subject, "state", {})
            if len(state) != self._state_noted[id(subject)]:
                self._state_noted[id(subject)] = len(state)
                for values in state.values():
                    if isinstance(values, dict):
                        for value in values.values():
                            if hasattr(value, "untyped_storage"):
                                self._note(value, "optimizer_state", seqs)

    def _start_logs(self) -> None:
        for slot, meter in self.meters.items():
            if not meter.log and meter.scope_id is not None:
                meter.start_alloc_log(KIND_LOG_MAX)
            self.started.add(slot)

    def _note(self, tensor, kind: str, seqs: dict) -> None:
        """Notes tensor's storage as kind, with its device's event number
        now (seqs: those the walk read already).  Run for every gradient of
        every step: the common path is a few lookups."""
        if tensor is None:
            return
        slot = self._slots.get(tensor.device)
        if slot is None:
            slot = self._slot_of(tensor.device)
        if slot < 0 or getattr(tensor, "is_meta", False):
            return
        try:
            addr = storage_address(tensor)
        except Exception:   # a tensor without storage (a subclass, a functional tensor)
            return
        if not addr:
            return
        seq = seqs.get(slot)
        if seq is None:
            seq = seqs[slot] = self.meters[slot].seq()
        mark = self.marks.get((slot, addr))
        if mark is None:
            self.marks[(slot, addr)] = [(seq, kind)]
        else:
            mark.append((seq, kind))

    def _slot_of(self, device) -> int:
        """The slot of a device first seen, -1 where it is not measured."""
        name = "cpu" if device.type == "cpu" else (f"cuda:{device.index}" if device.type == "cuda" else "")
        try:
            slot = slot_of(name) if name else -1
        except (ValueError, IndexError):
            slot = -1
        slot = self._slots[device] = slot if slot in self.meters else -1
        return slot

    def _note_inputs(self, inputs, seqs: dict) -> None:
        for value in inputs:
            if isinstance(value, (list, tuple)):
                items = value
            elif isinstance(value, dict):
                items = value.values()
            else:
                items = (value,)
            for item in items:
                if hasattr(item, "untyped_storage"):
                    self._note(item, "input", seqs)

    def _note_module(self, module, seqs: dict) -> None:
        note = self._note
        for p in module.parameters():
            note(p, "parameter", seqs)
            note(p.grad, "gradient", seqs)
        for b in module.buffers():
            note(b, "buffer", seqs)

    def _note_grads(self, optimizer, seqs: dict) -> None:
        note = self._note
        for group in optimizer.param_groups:
            for p in group.get("params", ()):
                note(p.grad, "gradient", seqs)


def _first_sight(seen: dict, obj):
    """Records obj (weakly) in seen, keyed by its id; returns the new
    weak reference the first time, None after (an id that a freed object
    had, taken by a new one, is a first sight)."""
    ref = seen.get(id(obj))
    if ref is not None and ref() is obj:
        return None
    ref = seen[id(obj)] = weakref.ref(obj)
    return ref


def defer(figures, walk, slot: int, kept, entries: list, dropped: int, phases: list) -> None:
    """Keeps what figures' kinds are made of (the walk's findings, the
    allocation log, the phase log, what the test kept) for resolve: the
    classification is Python over every event of the log, paid only where
    a failure, a report, a baseline or a kind's budget reads the kinds."""
    figures.kinds, figures.kinds_note, figures.phase_kinds = None, "", {}
    figures.kinds_pending = (_classify, (walk.error, slot, walk.marks, entries, dropped, phases, kept))


def _classify(figures, error, slot: int, marks, entries: list, dropped: int, phases: list, kept) -> None:
    """figures' bytes at the own peak by kind (and each phase's, and the
    blocks for the timeline), from what defer kept: run by
    figures.resolve_kinds the first time the kinds are asked for."""
    if error:
        figures.kinds_note = f"the walk at a phase's boundary failed: {error}"
        return
    try:
        spans = phase_spans(phases, slot)
        blocks = Blocks(entries, kept.blocks, spans, marks, slot)
        figures.kinds, figures.kinds_note = kinds_at_peak(blocks, dropped, spans, kept.seq, figures.peak)
        if figures.kinds is not None:
            figures.kind_lives = (blocks, entries[0][4] if entries else 0)
            figures.phase_kinds = kinds_at_phase_peaks(blocks, spans, figures.phase_peaks, PHASE_NAMES)
    except Exception as exc:  # memlab's trouble, never the test's
        figures.kinds, figures.kinds_note = None, f"{type(exc).__name__}: {exc}"


def phase_spans(phases: list, slot: int) -> list[tuple[int, int, int]]:
    """(kind, start seq, end seq) of each phase on slot's timeline, from the
    tracer's phase log ((kind, slot, seq, label); a negative kind ends it);
    one still running at the end ends never."""
    spans, running = [], {}
    for kind, s, seq, _label in phases:
        if s != slot:
            continue
        if kind > 0:
            running[kind] = seq
        elif -kind in running:
            spans.append((-kind, running.pop(-kind), seq))
    spans.extend((kind, start, NEVER) for kind, start in running.items())
    spans.sort(key=lambda span: span[1])
    return spans


class Blocks:
    """Every block of the test that the allocation log (engine's entries,
    from the first phase on) and the blocks it kept (kept_blocks: (addr,
    size, seq, site)) tell of, as lives: (size, allocated seq or -1 before
    the log, freed seq or never, kept).  A block's kind is found when it is
    first asked for: the kinds at the peak and at each phase's peak ask for
    the blocks live then, a few hundred, not for the tens of thousands a
    training test made and freed (the timeline's kinds ask for all)."""

    def __init__(self, entries: list, kept_blocks: list, spans: list, marks: dict, slot: int):
        kept = {(addr, seq) for addr, _size, seq, _site in kept_blocks}
        born: dict[int, tuple[int, int]] = {}   # addr -> (seq, size), open blocks
        lives = []                               # (size, allocated, freed, kept)
        addrs = []
        for addr, size, _time, _site, seq, counts in entries:
            if size > 0:
                if addr in born:   # its free was not heard: gone when the address came back
                    a, s = born.pop(addr)
                    lives.append((s, a, seq, False))
                    addrs.append(addr)
                if counts:
                    born[addr] = (seq, size)
            elif counts:
                a, _s = born.pop(addr, (-1, 0))
                lives.append((-size, a, seq, False))
                addrs.append(addr)
        logged = set()
        for addr, (a, size) in born.items():
            logged.add((addr, a))
            lives.append((size, a, NEVER, (addr, a) in kept))
            addrs.append(addr)
        first = entries[0][4] if entries else NEVER
        for addr, size, a, _site in kept_blocks:   # kept, made before the log began
            if (addr, a) not in logged and a < first:
                lives.append((size, a, NEVER, True))
                addrs.append(addr)
        self.lives = lives
        self._addrs = addrs
        self._kinds: list = [None] * len(lives)
        self._made_in = _Innermost(spans)
        self._marks = marks
        self._slot = slot

    def kind(self, i: int) -> str:
        kind = self._kinds[i]
        if kind is None:
            _size, a, f, _kept = self.lives[i]
            kind = self._kinds[i] = _kind(a, f, self._made_in, self._marks.get((self._slot, self._addrs[i])))
        return kind

    def live_at(self, seqs: list) -> list[dict]:
        """kind -> bytes of the blocks the test did not keep, live at each
        of seqs (a few event numbers)."""
        out = []
        lives, kind = self.lives, self.kind
        for seq in seqs:
            bytes_by_kind = dict.fromkeys(KINDS, 0)
            for i in [i for i, (_size, a, f, kept) in enumerate(lives) if a <= seq < f and not kept]:
                bytes_by_kind[kind(i)] += lives[i][0]
            out.append(bytes_by_kind)
        return out


def kinds_at_peak(blocks: Blocks, dropped: int, spans: list, peak_seq: int, own_peak: int) -> tuple[dict | None, str]:
    """Bytes by kind of the blocks live at event peak_seq that the test did
    not keep.  Returns (kind -> bytes, "") or (None, why not)."""
    if dropped:
        return None, f"the allocation log dropped {dropped} events"
    if not spans:
        return None, "no phase ran"
    if peak_seq < spans[0][1]:
        return None, "the peak came before the first phase"
    out = blocks.live_at([peak_seq])[0]
    if sum(out.values()) != own_peak:
        return None, f"the blocks live at the peak sum to {sum(out.values())} B, not the own peak {own_peak} B"
    return out, ""


def kinds_at_phase_peaks(blocks: Blocks, spans: list, phase_peaks: dict, names: tuple) -> dict:
    """phase name -> bytes by kind at that phase's own peak (the test's
    own bytes, what it kept left out, at their most while a phase of that
    kind ran, counting what was live when it began), for each phase whose
    peak the engine gave (phase_peaks: name -> (bytes, site)) and the
    blocks reach to the byte; names: the phase names by kind - 1."""
    changes = [(a, size) for size, a, f, kept in blocks.lives if not kept]
    changes += [(f, -size) for size, a, f, kept in blocks.lives if not kept and f != NEVER]
    changes.sort(key=lambda c: c[0])
    seqs = [c[0] for c in changes]
    owns = list(itertools.accumulate(c[1] for c in changes))   # own bytes after each change
    best: dict = {}   # name -> (own, seq): the first moment of its most
    for kind, start, end in spans:
        # the own bytes when it began, then after each change while it ran
        i, j = bisect.bisect_right(seqs, start), bisect.bisect_right(seqs, end)
        most, seq = (owns[i - 1] if i else 0), start
        if j > i:
            top = max(owns[i:j])
            if top > most:
                most, seq = top, seqs[owns.index(top, i, j)]
        name = names[kind - 1]
        if name not in best or most > best[name][0] or (most == best[name][0] and seq < best[name][1]):
            best[name] = (most, seq)
    wanted = [name for name, (own, _seq) in best.items() if name in phase_peaks and phase_peaks[name][0] == own]
    return dict(zip(wanted, blocks.live_at([best[name][1] for name in wanted])))


def kinds_over_time(blocks: Blocks, seqs: list, since: int) -> dict:
    """kind -> [bytes live after each event of seqs (ascending)] for the
    kinds that ever had any, with None before event since (the first
    phase, where the log began); kept blocks count, as on the timeline."""
    changes = []
    for i, (size, a, f, _kept) in enumerate(blocks.lives):
        kind = blocks.kind(i)
        changes.append((a, size, kind))
        if f != NEVER:
            changes.append((f, -size, kind))
    changes.sort(key=lambda c: c[0])
    now = dict.fromkeys(KINDS, 0)
    series = {kind: [] for kind in KINDS}
    i = 0
    for seq in seqs:
        while i < len(changes) and changes[i][0] <= seq:
            _at, size, kind = changes[i]
            now[kind] += size
            i += 1
        for kind in KINDS:
            series[kind].append(now[kind] if seq >= since else None)
    return {kind: values for kind, values in series.items() if any(values)}


class _Innermost:
    """The innermost phase running at an event: spans sorted by start, each
    with the span enclosing it (phases nest: a closure's forward inside an
    optimizer's step), so a lookup is a bisection and a short climb, not a
    pass over every span of a long training test."""

    def __init__(self, spans: list):
        self.spans = spans
        self.starts = [span[1] for span in spans]
        self.parent = []
        stack: list[int] = []
        for i, (_kind, start, _end) in enumerate(spans):
            while stack and spans[stack[-1]][2] < start:
                stack.pop()
            self.parent.append(stack[-1] if stack else -1)
            stack.append(i)

    def at(self, a: int):
        """The span running when event a happened (start < a <= end), or None."""
        i = bisect.bisect_left(self.starts, a) - 1
        while i >= 0 and self.spans[i][2] < a:
            i = self.parent[i]
        return self.spans[i] if i >= 0 else None


def _kind(a: int, f: int, made_in: _Innermost, marks: list | None) -> str:
    if marks:
        # marks come in event order: the first one at or after a, while before f
        found, i = [], bisect.bisect_left(marks, (a, ""))
        while i < len(marks) and marks[i][0] < f:
            found.append(marks[i][1])
            i += 1
        if found:
            return min(found, key=_RANK.__getitem__)
    span = made_in.at(a)
    if span is not None:
        kind, _start, end = span
        if f <= end:
            return "temporary"
        return "activation" if kind == FORWARD else "other"
    return "other"
