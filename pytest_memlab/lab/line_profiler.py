"""The laboratory API that pytorch_memlab's users know, on memlab's engine:
``LineProfiler``, ``profile``, ``profile_every``, ``set_target_gpu``.

Differences from pytorch_memlab, on purpose:
- nothing empties the CUDA cache or resets the user's peak statistics: the
  figures come from memlab's own engine;
- per-line figures come from the C tracer: the peak of a line includes what
  its callees allocated, and memory allocated by backward on autograd's
  threads lands on the line that called ``backward()``;
- CPU tensors are profiled too (``target_gpu="cpu"``), and the default
  target is cuda:0 where there is CUDA, else the CPU;
- ``active_bytes.*`` columns are shown as allocated bytes (memlab counts
  allocations; the two differ only while ``record_stream`` holds freed
  blocks), and the output says so.
"""

from __future__ import annotations

import atexit
import functools
import html
import inspect
import sys
from dataclasses import dataclass

from ..devices import CPU, DeviceError, cuda_available, parse_device, resolve
from ..engine.attribution import line_stats
from ..engine.backend import BRIDGE, core
from ..engine.meters import make_meter
from ..engine.slots import slot_of
from ..engine.tracing import tracing
from ..sizes import format_size

DEFAULT_COLUMNS = ("active_bytes.all.peak", "reserved_bytes.all.peak")

# column -> (LineRecord field, is a size, note)
_ACTIVE_NOTE = ("active_bytes.* shown as allocated bytes: memlab counts allocations, which equal "
                "active bytes unless record_stream delays frees")
COLUMNS = {
    "allocated_bytes.all.peak": ("peak_total", True, ""),
    "allocated_bytes.all.current": ("last_total", True, ""),
    "active_bytes.all.peak": ("peak_total", True, _ACTIVE_NOTE),
    "active_bytes.all.current": ("last_total", True, _ACTIVE_NOTE),
    "reserved_bytes.all.peak": ("peak_reserved", True, ""),
    "allocated_by_line": ("allocated", True, ""),
    "hits": ("hits", False, ""),
}


def _code_of(func):
    """The code object behind a function, method, or decorated function."""
    seen = set()
    while True:
        if id(func) in seen:
            break
        seen.add(id(func))
        if isinstance(func, (staticmethod, classmethod)):
            func = func.__func__
        elif inspect.ismethod(func):
            func = func.__func__
        elif hasattr(func, "__wrapped__"):
            func = func.__wrapped__
        else:
            break
    code = getattr(func, "__code__", None)
    if code is None:
        raise TypeError(f"cannot profile {func!r}: it has no Python code object")
    return func, code


def _target_device(target) -> str:
    """'cpu' or 'cuda:N' for a target_gpu value (None: cuda:0 where there is
    CUDA, else the CPU)."""
    if target is None:
        return "cuda:0" if cuda_available(core()) else CPU
    try:
        return parse_device(target, default_cuda="cuda:0")
    except DeviceError:
        raise ValueError(f"target_gpu={target!r} is not a device (an int, 'cuda:N', 'cpu' or a torch.device)") from None


@dataclass
class LineRecord:
    hits: int = 0
    allocated: int = 0
    peak_total: int = 0
    peak_reserved: int = 0
    last_total: int = 0


class LineProfiler:
    """Profiles memory line by line in the functions it is given.

        with LineProfiler(func) as prof:
            func()
        prof.display()          # in IPython; or prof.print_stats()
    """

    def __init__(self, *functions, target_gpu=None, **kwargs):
        self.target_gpu = target_gpu
        self.functions: dict[object, object] = {}  # code -> function
        self.records: dict[tuple[object, str], dict[int, LineRecord]] = {}  # (code, device) -> line -> record
        self.enabled = False
        self._depth = 0
        self._meters: dict[str, object] = {}
        self._traced = False
        self.off_reason = ""
        for func in functions:
            self.add_function(func)

    # -- what to profile ---------------------------------------------------
    def add_function(self, func) -> None:
        func, code = _code_of(func)
        if code in self.functions:
            return
        self.functions[code] = func
        if self._traced:
            tracing.extend((code,))

    # -- on and off --------------------------------------------------------
    def __enter__(self):
        self.enable()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.disable()

    def _watch(self, device: str) -> None:
        if device in self._meters:
            return
        c = core()
        if c.name != BRIDGE:
            self.off_reason = f"the engine is not fed ({c.reason})"
            return
        concrete, reason = resolve(c, device)
        if reason:
            self.off_reason = f"{device}: {reason}"
            return
        meter = make_meter(c, concrete)
        meter.begin()
        self._meters[concrete] = meter

    def enable(self) -> None:
        self._depth += 1
        if self.enabled:
            return
        self.enabled = True
        self._watch(_target_device(self.target_gpu))
        if not self._meters:
            return
        first = tracing.users == 0
        self._traced = tracing.acquire(codes=tuple(self.functions))
        if not self._traced:
            self.off_reason = tracing.off_reason
        elif first:
            tracing.reset_lines()

    def disable(self) -> None:
        if self._depth > 0:
            self._depth -= 1
        if self._depth > 0 or not self.enabled:
            return
        self.enabled = False
        try:
            if self._traced:
                self._collect()
        finally:
            if self._traced:
                self._traced = False
                tracing.release(codes=tuple(self.functions))
            for meter in self._meters.values():
                meter.end()
            self._meters.clear()

    def _collect(self) -> None:
        codes = set(self.functions)
        for device in self._meters:
            for stat in line_stats(slot_of(device), codes=codes):
                rec = self.records.setdefault((stat.code, device), {}).setdefault(stat.frame.line, LineRecord())
                rec.hits += stat.hits
                rec.allocated += stat.allocated
                rec.peak_total = max(rec.peak_total, stat.peak_total)
                rec.peak_reserved = max(rec.peak_reserved, stat.peak_reserved)
                rec.last_total = stat.last_total

    def clear(self) -> None:
        self.records.clear()

    def switch_target(self, target) -> None:
        """set_target_gpu's work: measure that device too from now on."""
        self.target_gpu = target
        if self.enabled:
            self._watch(_target_device(target))

    # -- showing -----------------------------------------------------------
    def display(self, func=None, columns=DEFAULT_COLUMNS) -> "LineRecords":
        """The figures of func (a function, its name, or None for all), as an
        object that IPython shows as a table and str() as text."""
        return LineRecords(self, func, tuple(columns))

    def print_stats(self, func=None, columns=DEFAULT_COLUMNS, stream=None) -> None:
        (stream or sys.stdout).write(str(self.display(func, columns)))


def _selects(func, fn, code) -> bool:
    """display(func): None for all, a function (or a wrapper of it), or a name."""
    if func is None or func is fn:
        return True
    if isinstance(func, str):
        return func in (getattr(fn, "__name__", None), getattr(fn, "__qualname__", None))
    try:
        return _code_of(func)[1] is code
    except TypeError:
        return False


class LineRecords:
    """A profiler's figures for display."""

    def __init__(self, profiler: LineProfiler, func, columns: tuple[str, ...]):
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:
            raise ValueError(f"unknown column {', '.join(map(repr, unknown))} (known: {', '.join(COLUMNS)})")
        self.columns = columns
        self.notes = sorted({COLUMNS[c][2] for c in columns if COLUMNS[c][2]})
        self.sections = []
        for code, fn in profiler.functions.items():
            if not _selects(func, fn, code):
                continue
            devices = [d for (c, d) in profiler.records if c is code]
            if not devices:
                continue
            self.sections.append((code, fn, devices, {d: profiler.records[(code, d)] for d in devices}))

    def _source(self, code):
        try:
            lines, first = inspect.getsourcelines(code)
        except (OSError, TypeError):
            import linecache

            first = code.co_firstlineno
            lines = [linecache.getline(code.co_filename, ln) for ln in range(first, max(
                [ln for _, _, ln in code.co_lines() if ln is not None] or [first]) + 1)]
        return first, [ln.rstrip("\n") for ln in lines]

    def _cell(self, device: str, column: str, rec: LineRecord | None) -> str:
        if rec is None:
            return ""
        field, is_size, _ = COLUMNS[column]
        if field == "peak_reserved" and device == "cpu":
            return "-"  # the CPU allocator keeps no reserved pool
        value = getattr(rec, field)
        return format_size(value) if is_size else str(value)

    def _rows(self):
        for code, fn, devices, records in self.sections:
            first, lines = self._source(code)
            heads = [(d, c) for d in devices for c in self.columns]
            rows = []
            for i, src in enumerate(lines):
                lineno = first + i
                cells = [self._cell(d, c, records[d].get(lineno)) for d, c in heads]
                rows.append((cells, lineno, src))
            yield getattr(fn, "__qualname__", code.co_name), heads, rows, len(devices) > 1

    def __str__(self) -> str:
        out = []
        for name, heads, rows, multi in self._rows():
            out.append(f"## {name}\n")
            labels = [((d + " ") if multi else "") + c for d, c in heads]
            parts = [label.split(".") for label in labels]
            depth = max((len(p) for p in parts), default=1)
            widths = [max([len(x) for x in p] + [len(cells[i]) for cells, _, _ in rows] + [4])
                      for i, p in enumerate(parts)]
            for level in range(depth):
                head = "  ".join((p[level] if level < len(p) else "").rjust(w) for p, w in zip(parts, widths))
                out.append(head + ("  line  code" if level == 0 else ""))
            for cells, lineno, src in rows:
                out.append("  ".join(c.rjust(w) for c, w in zip(cells, widths)) + f"  {lineno:>4}  {src}")
            out.append("")
        for note in self.notes:
            out.append(f"({note})")
        return "\n".join(out) + "\n"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        parts = []
        for name, heads, rows, multi in self._rows():
            parts.append(f"<h4>{html.escape(name)}</h4><table><thead><tr>")
            parts += [f"<th>{html.escape((d + ' ') if multi else '')}{html.escape(c)}</th>" for d, c in heads]
            parts.append("<th>line</th><th>code</th></tr></thead><tbody>")
            for cells, lineno, src in rows:
                parts.append("<tr>" + "".join(f"<td style='text-align:right'>{html.escape(c)}</td>" for c in cells)
                             + f"<td>{lineno}</td><td style='text-align:left'><pre style='margin:0'>"
                             f"{html.escape(src)}</pre></td></tr>")
            parts.append("</tbody></table>")
        parts += [f"<p><em>{html.escape(n)}</em></p>" for n in self.notes]
        return "".join(parts)


global_line_profiler = LineProfiler()


def clear_global_line_profiler() -> None:
    global_line_profiler.clear()


def set_target_gpu(gpu_id) -> None:
    """The device the global profiler (profile, profile_every) measures; can
    change during profiling, and then both devices are shown."""
    global_line_profiler.switch_target(gpu_id)


def _profiled(func):
    """Wraps func so that the global profiler runs while it does."""
    global_line_profiler.add_function(func)

    @functools.wraps(func)
    def run(*args, **kwargs):
        global_line_profiler.enable()
        try:
            return func(*args, **kwargs)
        finally:
            global_line_profiler.disable()

    return run


def profile(func=None, columns=DEFAULT_COLUMNS):
    """Profiles func line by line; the figures (the maximum over its runs)
    are printed when the program exits.  ``@profile`` or
    ``@profile(columns=...)``."""
    if func is None:
        return functools.partial(profile, columns=columns)
    wrapped = _profiled(func)
    atexit.register(lambda: global_line_profiler.print_stats(func, columns))
    return wrapped


def profile_every(output_interval: int = 1, enable: bool = True, columns=DEFAULT_COLUMNS):
    """Profiles the decorated function and prints its figures every
    ``output_interval`` runs."""
    if output_interval < 1:
        raise ValueError(f"output_interval={output_interval!r} must be at least 1")

    def decorate(func):
        if not enable:
            return func
        wrapped = _profiled(func)
        count = [0]

        @functools.wraps(func)
        def run(*args, **kwargs):
            try:
                return wrapped(*args, **kwargs)
            finally:
                count[0] += 1
                if count[0] % output_interval == 0:
                    global_line_profiler.print_stats(func, columns)

        return run

    return decorate
