"""What grew where: a test's heaviest sites at its peak, as a baseline keeps
them, and their difference from one run to another.

A site here is the line that allocated, named by its file, its function and
the line's text, not its number: a site is still the same site after lines
above it move.  The engine's sites are call chains; those of one line (a
helper called from several places) are added up.  A baseline keeps the few
heaviest per test and device, small enough to review in a pull request (at
most SITES_BYTES of JSON a test and device: the lightest go first).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..sizes import format_size

SITES_KEPT = 5          # sites a baseline entry keeps at most
SITES_BYTES = 900       # and at most this much JSON of them
TEXT_MAX = 100          # characters of a line's text kept


def site_key(site: dict) -> tuple:
    return (site.get("file", ""), site.get("function", ""), site.get("text", ""))


def sites_at_peak(attribution, limit: int = SITES_KEPT) -> list[dict]:
    """The heaviest lines live at the peak ({bytes, file, function, text}),
    each line once (the chains through it added up), heaviest first,
    within SITES_BYTES of JSON."""
    if attribution is None:
        return []
    by_line: dict[tuple, int] = {}
    for entry in attribution.at_peak:
        if entry.bytes <= 0:
            continue
        if entry.chain:
            f = entry.chain[0]
            text = f.source
            key = (f.file, f.function, text[:TEXT_MAX])
        else:
            key = ("", "", "(outside user code)")
        by_line[key] = by_line.get(key, 0) + entry.bytes
    ranked = sorted(by_line.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    sites = [{"bytes": n, "file": file, "function": function, "text": text}
             for (file, function, text), n in ranked]
    while sites and len(json.dumps(sites)) > SITES_BYTES:
        sites.pop()
    return sites


@dataclass(frozen=True)
class SiteChange:
    """One line's bytes at the peak, then and now (0: it was not there)."""

    file: str
    function: str
    text: str
    old: int
    new: int

    @property
    def delta(self) -> int:
        return self.new - self.old

    def as_dict(self) -> dict:
        return {"file": self.file, "function": self.function, "text": self.text, "old": self.old, "new": self.new}

    def describe(self) -> str:
        where = f"{self.file} {self.function}: {self.text}" if self.file else self.text
        if self.old == 0:
            how = "new"
        elif self.new == 0:
            how = "gone"
        else:
            how = f"{format_size(self.old)} -> {format_size(self.new)}"
        sign = "+" if self.delta > 0 else "-"
        return f"{sign + format_size(abs(self.delta)):>11}  {where}  ({how})"


def site_changes(old: list[dict] | None, new: list[dict] | None) -> list[SiteChange]:
    """The lines whose bytes at the peak differ: those that are new or grew,
    most first; then those that shrank or went, most first.  A line that
    only one side kept among its heaviest is compared with 0 on the other
    side only when the other side's list was not full (else it may have
    been just below the cut: left out)."""
    old, new = old or [], new or []
    before = {site_key(s): s.get("bytes", 0) for s in old}
    after = {site_key(s): s.get("bytes", 0) for s in new}
    old_floor = min(before.values()) if len(old) >= SITES_KEPT and before else 0
    new_floor = min(after.values()) if len(new) >= SITES_KEPT and after else 0
    changes = []
    for key in list(after) + [k for k in before if k not in after]:
        o, n = before.get(key), after.get(key)
        if o is None:
            if old_floor and n <= old_floor:
                continue   # perhaps just below the old list's cut
            o = 0
        if n is None:
            if new_floor and o <= new_floor:
                continue
            n = 0
        if o != n:
            changes.append(SiteChange(*key, o, n))
    grew = sorted((c for c in changes if c.delta > 0), key=lambda c: -c.delta)
    shrank = sorted((c for c in changes if c.delta < 0), key=lambda c: c.delta)
    return grew + shrank


def describe_changes(changes: list[SiteChange], top: int = 5, indent: str = "  ") -> list[str]:
    """The lines of a regression's first section: what grew where."""
    if not changes:
        return []
    lines = [f"{indent}what changed at the peak, by line (against the baseline):"]
    lines += [f"{indent}  {c.describe()}" for c in changes[:top]]
    rest = changes[top:]
    if rest:
        lines.append(f"{indent}  ... and {len(rest)} more lines")
    return lines
