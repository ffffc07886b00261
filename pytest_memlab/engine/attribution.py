"""Line-level attribution: allocation sites and lines turned into what a
person reads (files, lines, functions, source).

The engine records, per allocation, the user call chain it came from (a
site, interned by the C tracer), and per scope the bytes each site held at
the scope's peak; the tracer keeps per-line figures.  Turning their ids into
frames is cached per line and per site, by their ids: the engine interns
them once a process (and keeps their code objects), so an id names one
line for good, and a cache keyed by it never hashes a code object (which
CPython does from the code's whole contents each time: about 4 us for a
large function).  A test that passes never needs more than its few
heaviest lines.
"""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass
from typing import NamedTuple

from .. import _engine as engine
from .heap import untrack
from .tracing import tracing


class Frame(NamedTuple):
    """One line of user code.  (A named tuple: one is made for every
    measured test's heaviest line, and a tuple is the cheapest immutable,
    hashable record to make.)"""

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


# Caches keyed by the rootdir too: paths are shown relative to it.
_FRAMES: dict = {}   # (rootdir, code, lineno) -> Frame
_LINE_FRAMES: dict = {}   # (rootdir, the engine's line id) -> Frame
_CHAINS: dict = {}   # (rootdir, the engine's site id) -> (Frame, ...)
_PATHS: dict = {}    # (rootdir, co_filename) -> (absolute path, shown path)


def _paths_of(root: str | None, filename: str) -> tuple[str, str]:
    paths = _PATHS.get((root, filename))
    if paths is None:
        path = os.path.realpath(os.path.abspath(filename))
        shown = os.path.relpath(path, root) if root and (path + os.sep).startswith(root + os.sep) else path
        paths = _PATHS[(root, filename)] = (path, shown)
    return paths


def frame_of(code, lineno: int) -> Frame:
    root = tracing.scope.rootdir
    frame = _FRAMES.get((root, code, lineno))
    if frame is None:
        path, shown = _paths_of(root, code.co_filename)
        frame = Frame(shown, path, lineno, getattr(code, "co_qualname", code.co_name))
        # Kept for the process, and of strings and an int: the collector
        # never untracks a named tuple itself (only an exact tuple), and
        # kornia's suite made 5,200 of them, each walked at every full
        # collection.
        untrack([frame])
        _FRAMES[(root, code, lineno)] = frame
    return frame


def line_frame(line_id: int, code, lineno: int) -> Frame:
    """frame_of for one of the engine's lines, by its id."""
    key = (tracing.scope.rootdir, line_id)
    frame = _LINE_FRAMES.get(key)
    if frame is None:
        frame = _LINE_FRAMES[key] = frame_of(code, lineno)
    return frame


def chain_of(site: int) -> list[Frame]:
    """A site's user call chain, innermost first ([] when unknown)."""
    if site == 0:
        return []
    key = (tracing.scope.rootdir, site)
    chain = _CHAINS.get(key)
    if chain is None:
        chain = _CHAINS[key] = tuple(frame_of(code, lineno) for code, lineno in engine.site(site))
    return list(chain)


def bytes_by_site(blocks) -> list[tuple[int, list[Frame]]]:
    """Blocks ((addr, size, scope, site), as the engine lists them) summed
    by site, heaviest first: [(bytes, chain)]."""
    by_site: dict[int, int] = {}
    for _, size, _, site in blocks:
        by_site[site] = by_site.get(site, 0) + size
    return sorted(((b, chain_of(site)) for site, b in by_site.items()), key=lambda e: -e[0])


@dataclass
class SiteBytes:
    bytes: int
    chain: list[Frame]


class Attribution:
    """Where a scope's own peak came from: the engine's figures for the
    scope, read (and their site ids turned into frames) only when someone
    asks; most tests never do."""

    __slots__ = ("_scope", "moment")

    def __init__(self, scope: dict, moment: bool = True):
        self._scope = scope
        self.moment = moment   # False: the lines are at another moment than the figure's peak

    def without(self, kept: list, peak_site: int, moment: bool) -> "Attribution":
        """The same, less the kept blocks' bytes ([(site, bytes)]) and
        reached by peak_site: where a scope's peak leaves out what it kept
        (meters.leave_out_kept).  moment: whether that peak came at the
        moment these lines were taken."""
        at_peak = dict(self.site_bytes)
        for site, size in kept:
            if site in at_peak:
                at_peak[site] -= size
        scope = dict(self._scope)
        scope["at_peak"] = [(s, b) for s, b in at_peak.items() if b > 0]
        scope["peak_site"] = peak_site
        return Attribution(scope, moment and self.moment)

    @property
    def peak_site(self) -> int:
        return self._scope.get("peak_site", 0)

    @property
    def site_bytes(self) -> list:
        """(site, bytes) held at the peak."""
        return [(s, b) for s, b in self._scope.get("at_peak", ()) if b > 0]

    @property
    def complete(self) -> bool:
        return self._scope.get("sites_complete", True)

    @property
    def peak_chain(self) -> list[Frame]:
        return chain_of(self.peak_site)

    @property
    def at_peak(self) -> list[SiteBytes]:
        """What was live at the peak, by allocating site, heaviest first."""
        return [SiteBytes(b, chain_of(site)) for site, b in sorted(self.site_bytes, key=lambda sb: -sb[1])]


class LineStat:
    """One line's figures for one device over a measurement; its frame
    (paths, names) is made when someone reads it."""

    __slots__ = ("line_id", "code", "lineno", "hits", "allocated", "peak_total", "peak_reserved", "last_total",
                 "_frame")

    def __init__(self, line_id: int, code, lineno: int, hits: int, allocated: int, peak_total: int,
                 peak_reserved: int, last_total: int):
        self.line_id = line_id              # the engine's id of the line (for good in the process)
        self.code = code                    # the code object the line belongs to
        self.lineno = lineno
        self.hits = hits
        self.allocated = allocated          # bytes allocated while it was the innermost user line
        self.peak_total = peak_total        # highest device total while it ran, callees included
        self.peak_reserved = peak_reserved
        self.last_total = last_total        # device total when it last finished
        self._frame = None

    @property
    def frame(self) -> Frame:
        if self._frame is None:
            self._frame = line_frame(self.line_id, self.code, self.lineno)
        return self._frame

    def as_dict(self) -> dict:
        return {**self.frame.as_dict(), "hits": self.hits, "bytes": self.allocated,
                "peak_total": self.peak_total}

    def __repr__(self) -> str:
        return (f"LineStat({self.frame}, hits={self.hits}, allocated={self.allocated}, "
                f"peak_total={self.peak_total})")


def line_stats(slot: int, codes=None, allocated_only: bool = False, top: int = 0) -> list[LineStat]:
    """Per-line figures for a device slot (0 the CPU, 1 + i cuda:i): the
    lines that ran or allocated since the tracer's lines were last reset
    (with allocated_only, those that allocated on it: a test's heaviest
    lines, of the hundreds it ran; with top, only the top that allocated
    the most, heaviest first: kornia's tests allocate on 18 lines each, and
    the reports keep 5)."""
    if slot >= engine.LINE_SLOTS:
        return []
    return [LineStat(*row) for row in engine.tracer_line_stats(slot, allocated_only, top)
            if codes is None or row[1] in codes]
