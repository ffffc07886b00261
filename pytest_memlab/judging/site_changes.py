"""What grew where: a test's heaviest sites at its peak, as a baseline keeps
them, and their difference from one run to another.

A site here is the line that allocated with the user lines that called it
(its callers, innermost first), each named by its file, its function and
the line's text, not its number: a site is still the same site after lines
above it move.  A helper that every test calls is one line with many
callers: keeping the callers is what lets a difference name the line that
changed (``b = cpu_bytes(8 * MiB)``, new) rather than the helper whose
bytes it grew.  A baseline keeps the few heaviest per test and device,
small enough to review in a pull request (at most SITES_BYTES of JSON a
test and device: the lightest go first).  Files written before callers were
kept (sites without ``callers``) are compared line by line, as then.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..sizes import format_size

SITES_KEPT = 5          # sites a baseline entry keeps at most
SITES_BYTES = 1800      # and at most this much JSON of them
TEXT_MAX = 100          # characters of a line's text kept
CALLERS_KEPT = 3        # callers kept of a site's chain (the engine's are up to 8 long)

OUTSIDE = ("", "", "(outside user code)")


def site_key(site: dict) -> tuple:
    """The allocating line: (file, function, text)."""
    return (site.get("file", ""), site.get("function", ""), site.get("text", ""))


def _frame_key(frame) -> tuple:
    return (frame.file, frame.function, frame.source[:TEXT_MAX])


def sites_at_peak(attribution, limit: int = SITES_KEPT) -> list[dict]:
    """The heaviest sites live at the peak ({bytes, file, function, text,
    callers}), each chain once (the engine's chains cut to CALLERS_KEPT
    callers and added up), heaviest first, within SITES_BYTES of JSON."""
    if attribution is None:
        return []
    by_chain: dict[tuple, int] = {}
    for entry in attribution.at_peak:
        if entry.bytes <= 0:
            continue
        if entry.chain:
            key = tuple(_frame_key(f) for f in entry.chain[:1 + CALLERS_KEPT])
        else:
            key = (OUTSIDE,)
        by_chain[key] = by_chain.get(key, 0) + entry.bytes
    ranked = sorted(by_chain.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    sites = [{"bytes": n, "file": chain[0][0], "function": chain[0][1], "text": chain[0][2],
              "callers": [{"file": f, "function": fn, "text": t} for f, fn, t in chain[1:]]}
             for chain, n in ranked]
    while sites and len(json.dumps(sites)) > SITES_BYTES:
        sites.pop()
    return sites


def _chain(site: dict, with_callers: bool) -> tuple:
    """A site's key: its chain of (file, function, text), innermost first
    (the allocating line alone where callers are not compared)."""
    if not with_callers:
        return (site_key(site),)
    return (site_key(site),) + tuple(site_key(c) for c in site.get("callers") or () if isinstance(c, dict))


@dataclass(frozen=True)
class SiteChange:
    """One site's bytes at the peak, then and now (0: it was not there).
    ``chain`` is the allocating line and its callers, innermost first;
    ``lead`` the index in it of the line that changed, shown first: the
    outermost line that is new at the peak, else the outermost that grew
    (or shrank), else the allocating line."""

    chain: tuple
    old: int
    new: int
    lead: int = 0

    @property
    def file(self) -> str:
        return self.chain[0][0]

    @property
    def function(self) -> str:
        return self.chain[0][1]

    @property
    def text(self) -> str:
        return self.chain[0][2]

    @property
    def changed_line(self) -> tuple:
        return self.chain[self.lead]

    @property
    def delta(self) -> int:
        return self.new - self.old

    def as_dict(self) -> dict:
        out = {"file": self.file, "function": self.function, "text": self.text, "old": self.old, "new": self.new}
        if len(self.chain) > 1:
            out["callers"] = [{"file": f, "function": fn, "text": t} for f, fn, t in self.chain[1:]]
            out["changed"] = self.lead
        return out

    def describe(self, indent: str = "") -> list[str]:
        """The line that changed first, with what it changed by; then the
        lines it called down to the one that allocated (->), and those that
        called it (<-)."""
        if self.old == 0:
            how = "new"
        elif self.new == 0:
            how = "gone"
        else:
            how = f"{format_size(self.old)} -> {format_size(self.new)}"
        sign = "+" if self.delta > 0 else "-"
        lines = [f"{indent}{sign + format_size(abs(self.delta)):>11}  {_where(self.changed_line)}  ({how})"]
        pad = indent + " " * 15
        lines += [f"{pad}-> {_where(self.chain[i])}" for i in range(self.lead - 1, -1, -1)]
        lines += [f"{pad}<- {_where(self.chain[i])}" for i in range(self.lead + 1, len(self.chain))]
        return lines


def _where(line: tuple) -> str:
    file, function, text = line
    return f"{file} {function}: {text}" if file else text


def _line_bytes(chains: dict) -> dict:
    """Each line's bytes at the peak over the chains through it (a chain
    that passes a line twice counts once)."""
    out: dict = {}
    for chain, n in chains.items():
        for line in set(chain):
            out[line] = out.get(line, 0) + n
    return out


def _lead(chain: tuple, before: dict, after: dict) -> int:
    for test in (lambda o, n: o == 0 and n > 0, lambda o, n: n > o, lambda o, n: n < o):
        for i in range(len(chain) - 1, -1, -1):
            if test(before.get(chain[i], 0), after.get(chain[i], 0)):
                return i
    return 0


def site_changes(old: list[dict] | None, new: list[dict] | None) -> list[SiteChange]:
    """The sites whose bytes at the peak differ: those that are new or
    grew, most first; then those that shrank or went, most first.  A site
    that only one side kept among its heaviest is compared with 0 on the
    other side only when the other side's list was not full (else it may
    have been just below the cut: left out).  Sites are compared with their
    callers where both sides kept them, else by the allocating line."""
    old, new = old or [], new or []
    with_callers = all("callers" in s for s in old + new)
    before: dict = {}
    after: dict = {}
    for sites, into in ((old, before), (new, after)):
        for s in sites:
            key = _chain(s, with_callers)
            into[key] = into.get(key, 0) + s.get("bytes", 0)
    old_floor = min(before.values()) if len(old) >= SITES_KEPT and before else 0
    new_floor = min(after.values()) if len(new) >= SITES_KEPT and after else 0
    lines_before, lines_after = _line_bytes(before), _line_bytes(after)
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
            changes.append(SiteChange(key, o, n, _lead(key, lines_before, lines_after)))
    grew = sorted((c for c in changes if c.delta > 0), key=lambda c: -c.delta)
    shrank = sorted((c for c in changes if c.delta < 0), key=lambda c: c.delta)
    return grew + shrank


def describe_changes(changes: list[SiteChange], top: int = 5, indent: str = "  ") -> list[str]:
    """The lines of a regression's first section: what grew where, each
    led by the line that changed."""
    if not changes:
        return []
    lines = [f"{indent}what changed at the peak, by the line that changed (against the baseline):"]
    for c in changes[:top]:
        lines += c.describe(indent + "  ")
    rest = changes[top:]
    if rest:
        lines.append(f"{indent}  ... and {len(rest)} more lines")
    return lines
