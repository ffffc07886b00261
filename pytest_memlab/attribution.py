"""Line-level attribution: which code is the user's, the tracer's lifetime,
and allocation sites turned into what a person reads.

The C tracer (csrc/tracer.c) asks :class:`Scope` once per code object
whether it is user code; user frames get line events, the rest none.  The
engine then records, per allocation, the user call chain it came from (a
site), and per scope the bytes each site held at the scope's peak.
"""

from __future__ import annotations

import fnmatch
import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from ._core import engine
from .sizes import format_size

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _library_roots() -> tuple[str, ...]:
    roots = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            roots.add(os.path.realpath(sysconfig.get_path(name)))
        except KeyError:
            pass
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        roots.add(os.path.realpath(os.path.join(prefix, "lib")))
    return tuple(sorted(roots))


class Scope:
    """Decides whether a code object is user code, once per file, plus the
    functions that the laboratory API was given explicitly."""

    def __init__(self) -> None:
        self.rootdir: str | None = None
        self.include: tuple[str, ...] = ()
        self.codes: dict[object, int] = {}   # code -> how many profilers hold it
        self.paths_on = False                # the plugin's path rule is in force
        self._by_file: dict[str, bool] = {}
        self._libs = _library_roots()

    def configure(self, rootdir: str | os.PathLike, include: tuple[str, ...] = ()) -> None:
        self.rootdir = os.path.realpath(str(rootdir))
        self.include = tuple(include)
        self._by_file.clear()

    def file_in_scope(self, filename: str) -> bool:
        if filename.startswith("<") and filename.endswith(">"):
            return False  # <string>, <frozen ...>: no source to show
        path = os.path.realpath(os.path.abspath(filename))
        if path.startswith(_PACKAGE_DIR + os.sep):
            return False
        if self.include:
            rel = os.path.relpath(path, self.rootdir) if self.rootdir else path
            return any(fnmatch.fnmatch(path, g) or fnmatch.fnmatch(rel, g) for g in self.include)
        if self.rootdir is None or not (path + os.sep).startswith(self.rootdir + os.sep):
            return False
        if any(part in ("site-packages", "dist-packages") for part in Path(path).parts):
            return False
        return not any(path.startswith(lib + os.sep) for lib in self._libs if lib != self.rootdir
                       and not self.rootdir.startswith(lib + os.sep))

    def __call__(self, code) -> bool:
        if code in self.codes:
            return True
        if not self.paths_on:
            return False
        filename = code.co_filename
        verdict = self._by_file.get(filename)
        if verdict is None:
            verdict = self._by_file[filename] = self.file_in_scope(filename)
        return verdict


class Tracing:
    """The one tracer of the process, shared: the plugin turns the path rule
    on for a measured test, profilers add their functions; the C tracer runs
    while anyone holds it."""

    def __init__(self) -> None:
        self.scope = Scope()
        self.users = 0
        self.off_reason = ""

    def conflict(self) -> str:
        """Why the tracer cannot run now ("" if it can)."""
        if sys.version_info < (3, 12):
            other = sys.gettrace()
            if other is not None and self.users == 0:
                name = type(other).__module__ + "." + type(other).__qualname__
                return (f"another trace function is active ({name}; coverage or a debugger?): on Python "
                        f"{sys.version_info.major}.{sys.version_info.minor} memlab would replace it, so line "
                        "attribution is off (on Python 3.12+ both work)")
        return ""

    def _remember(self, paths: bool, codes) -> bool:
        """Adds to the scope; True if that changed what is in it."""
        changed = False
        if paths and not self.scope.paths_on:
            self.scope.paths_on = changed = True
        for code in codes:
            count = self.scope.codes.get(code, 0)
            self.scope.codes[code] = count + 1
            changed |= count == 0
        return changed

    def extend(self, codes) -> None:
        """A holder adds functions while the tracer runs (released with it)."""
        if self._remember(False, codes) and self.users > 0:
            engine.tracer_redecide()

    def acquire(self, *, paths: bool = False, codes=()) -> bool:
        """Starts or joins the tracer; False (with off_reason) if it cannot run."""
        changed = self._remember(paths, codes)
        if self.users == 0:
            reason = self.conflict()
            if reason:
                self.off_reason = reason
                self._forget(paths, codes)
                return False
            engine.tracer_start(self.scope)
        elif changed:
            engine.tracer_redecide()
        self.users += 1
        return True

    def _forget(self, paths: bool, codes) -> None:
        if paths:
            self.scope.paths_on = False
        for code in codes:
            count = self.scope.codes.get(code, 0) - 1
            if count <= 0:
                self.scope.codes.pop(code, None)
            else:
                self.scope.codes[code] = count

    def release(self, *, paths: bool = False, codes=()) -> None:
        self.users -= 1
        self._forget(paths, codes)
        if self.users == 0:
            engine.tracer_stop()
        elif paths or codes:
            engine.tracer_redecide()


tracing = Tracing()


@dataclass(frozen=True)
class Frame:
    """One line of user code."""

    file: str          # as shown: relative to rootdir when under it
    path: str          # absolute
    line: int
    function: str

    @property
    def source(self) -> str:
        return linecache.getline(self.path, self.line).strip()

    def __str__(self) -> str:
        src = self.source
        return f"{self.file}:{self.line} {self.function}" + (f": {src}" if src else "")

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function}


def _shown(path: str) -> str:
    root = tracing.scope.rootdir
    if root and (path + os.sep).startswith(root + os.sep):
        return os.path.relpath(path, root)
    return path


def frame_of(code, lineno: int) -> Frame:
    path = os.path.realpath(os.path.abspath(code.co_filename))
    return Frame(_shown(path), path, lineno, getattr(code, "co_qualname", code.co_name))


def chain_of(site: int) -> list[Frame]:
    """A site's user call chain, innermost first ([] when unknown)."""
    if site == 0:
        return []
    return [frame_of(code, lineno) for code, lineno in engine.site(site)]


@dataclass
class SiteBytes:
    bytes: int
    chain: list[Frame]


@dataclass
class Attribution:
    """Where a scope's own peak came from."""

    peak_chain: list[Frame] = field(default_factory=list)
    at_peak: list[SiteBytes] = field(default_factory=list)   # heaviest first
    complete: bool = True

    @classmethod
    def from_scope(cls, figures: dict) -> "Attribution":
        at_peak = [SiteBytes(b, chain_of(site)) for site, b in figures.get("at_peak", ()) if b > 0]
        at_peak.sort(key=lambda s: -s.bytes)
        return cls(chain_of(figures.get("peak_site", 0)), at_peak, figures.get("sites_complete", True))

    def describe(self, peak: int, top: int) -> list[str]:
        """The lines a failure prints under its first line."""
        if not self.at_peak and not self.peak_chain:
            return []
        lines = []
        if self.peak_chain:
            lines.append(f"  peak reached in {self.peak_chain[0]}")
            lines.extend(f"                <- {caller}" for caller in self.peak_chain[1:])
        lines.append("  live at the peak, by the line that allocated it (user call chain):")
        for entry in self.at_peak[:top]:
            share = f"{100 * entry.bytes / peak:.0f}%" if peak else ""
            size = format_size(entry.bytes)
            if entry.chain:
                lines.append(f"    {size:>10} {share:>4}  {entry.chain[0]}")
                pad = " " * 21
                lines.extend(f"    {pad}<- {caller}" for caller in entry.chain[1:])
            else:
                lines.append(f"    {size:>10} {share:>4}  (outside user code)")
        rest = self.at_peak[top:]
        if rest:
            lines.append(f"    ... and {len(rest)} more sites, {format_size(sum(e.bytes for e in rest))}")
        if not self.complete:
            lines.append("  (site figures incomplete: memlab ran out of memory for its tables)")
        return lines


@dataclass
class LineStat:
    """One line's figures for one device over a measurement."""

    code: object          # the code object the line belongs to
    frame: Frame
    hits: int
    allocated: int        # bytes allocated while it was the innermost user line
    peak_total: int       # highest device total while it ran, callees included
    peak_reserved: int
    last_total: int       # device total when it last finished

    def as_dict(self) -> dict:
        return {**self.frame.as_dict(), "hits": self.hits, "bytes": self.allocated,
                "peak_total": self.peak_total}


def line_stats(slot: int, codes=None) -> list[LineStat]:
    """Per-line figures for a device slot (0 the CPU, 1 + i cuda:i)."""
    if slot >= engine.LINE_SLOTS:
        return []
    out = []
    for _, code, lineno, hits, alloc, peak, peak_r, last in engine.tracer_line_stats():
        if codes is not None and code not in codes:
            continue
        out.append(LineStat(code, frame_of(code, lineno), hits, alloc[slot], peak[slot], peak_r[slot], last[slot]))
    return out
