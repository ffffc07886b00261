"""Line-level attribution: allocation sites and lines turned into what a
person reads (files, lines, functions, source).

The engine records, per allocation, the user call chain it came from (a
site, interned by the C tracer), and per scope the bytes each site held at
the scope's peak; the tracer keeps per-line figures.  Turning their ids into
frames is cached per code object and line: a test that passes never needs
more than its few heaviest lines.
"""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass, field

from ._core import engine
from .tracing import tracing


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


# Caches keyed by the rootdir too: paths are shown relative to it.
_FRAMES: dict = {}   # (rootdir, code, lineno) -> Frame
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
        _FRAMES[(root, code, lineno)] = frame
    return frame


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
    """Where a scope's own peak came from: site ids from the engine, turned
    into frames only when someone reads them."""

    peak_site: int = 0
    site_bytes: list = field(default_factory=list)   # (site, bytes) at the peak
    complete: bool = True

    @classmethod
    def from_scope(cls, figures: dict) -> "Attribution":
        return cls(figures.get("peak_site", 0), [(s, b) for s, b in figures.get("at_peak", ()) if b > 0],
                   figures.get("sites_complete", True))

    @property
    def peak_chain(self) -> list[Frame]:
        return chain_of(self.peak_site)

    @property
    def at_peak(self) -> list[SiteBytes]:
        """What was live at the peak, by allocating site, heaviest first."""
        return [SiteBytes(b, chain_of(site)) for site, b in sorted(self.site_bytes, key=lambda sb: -sb[1])]


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
