"""The words for a verdict's findings (:mod:`.findings`): failure and
warning texts, diagnosis first.  The terminal summary is
:mod:`pytest_memlab.reports.terminal`'s."""

from __future__ import annotations

from ..engine.attribution import Frame, SiteBytes, chain_of
from ..figures import KIND_BUDGETS, KIND_WORDS
from ..figures import resolve_kinds as resolve
from ..sizes import format_size, plural


def _frame(d: dict) -> Frame:
    """A frame a child process wrote (file as shown, absolute path, line, function)."""
    return Frame(str(d.get("file", "")), str(d.get("path") or d.get("file", "")), int(d.get("line", 0)),
                 str(d.get("function", "")))


def describe_attribution(attribution, peak: int, top: int, context: str = "") -> list[str]:
    """Where the own peak was reached (with the phase and mark it fell
    after: context) and what was live then, by site."""
    at_peak = attribution.at_peak
    peak_chain = attribution.peak_chain
    if not at_peak and not peak_chain:
        return [f"  peak reached {context}"] if context else []
    lines = []
    if peak_chain:
        where = f"{context}, in" if context else "in"
        lines.append(f"  peak reached {where} {peak_chain[0]}")
        lines.extend(f"                <- {caller}" for caller in peak_chain[1:])
    elif context:
        lines.append(f"  peak reached {context}")
    if attribution.moment:
        lines.append("  live at the peak, by the line that allocated it (user call chain):")
    else:   # the peak without what it kept came at another moment than the one the lines were taken
        lines.append("  live at its peak counting what it kept past teardown, less that, by the line "
                     "that allocated it (user call chain):")
    lines += _site_lines(at_peak, peak, top)
    if not attribution.complete:
        lines.append("  (site figures incomplete: memlab ran out of memory for its tables)")
    return lines


def _site_lines(at_peak: list, peak: int, top: int) -> list[str]:
    """Sites live at a peak (each with .bytes and .chain), heaviest first,
    with their share of it."""
    lines = []
    for entry in at_peak[:top]:
        share = f"{100 * entry.bytes / peak:.0f}%" if peak else ""
        size = format_size(entry.bytes)
        if entry.chain:
            lines.append(f"    {size:>10} {share:>4}  {entry.chain[0]}")
            pad = " " * 21
            lines.extend(f"    {pad}<- {caller}" for caller in entry.chain[1:])
        else:
            lines.append(f"    {size:>10} {share:>4}  (outside user code)")
    rest = at_peak[top:]
    if rest:
        lines.append(f"    ... and {len(rest)} more sites, {format_size(sum(e.bytes for e in rest))}")
    return lines


def kinds_lines(figures, kinds: dict | None = None, where: str = "the peak") -> list[str]:
    """What the bytes live at the own peak (or kinds, at where) were, by
    kind, heaviest first (a test with phases; measuring/memory_kinds.py):
    one line, wrapped."""
    if kinds is None:
        kinds = resolve(figures)
    total = sum(kinds.values()) if kinds else 0
    if not total:
        return []
    parts = []
    for kind, size in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])):
        if size:
            share = f" ({100 * size / total:.0f}%)" if not parts else ""
            parts.append(f"{KIND_WORDS[kind]} {format_size(size)}{share}")
    lines, line = [], f"  at {where}, by kind: "
    for i, part in enumerate(parts):
        text = part + (", " if i < len(parts) - 1 else "")
        if len(line) + len(text) > 100 and not line.endswith(": "):
            lines.append(line.rstrip())
            line = "    "
        line += text
    lines.append(line)
    return lines


def budget_failure(exceeded, figures, top: int = 5, context: str = "") -> str:
    """A budget failure, shortest first: the figure, the budget and the
    excess; then where the own peak was reached and what was live then."""
    e = exceeded
    by_kind = e.budget_name in KIND_BUDGETS
    budget = f"{e.budget_name}={format_size(e.budget)}" if by_kind else f"{e.budget_name} {format_size(e.budget)}"
    lines = [f"{e.device} {e.what} {format_size(e.value)} exceeds {budget} by {format_size(e.value - e.budget)}"]
    if figures.attribution is not None and figures.peak:
        lines += describe_attribution(figures.attribution, figures.peak, top, context)
    if e.what == "peak" or by_kind:
        lines += kinds_lines(figures)
    lines.append(f"  exactly {e.value} B against {e.budget} B")
    if figures.estimated:
        lines.append(f"  ({figures.reason})")
    return "\n".join(lines)


def phase_budget_failure(exceeded, figures) -> str:
    """A phase over its budget: the phase's own peak, the budget and the
    excess; then the line whose allocation reached it (or that it was live
    when the phase began), and every phase's peak beside the test's."""
    e = exceeded
    phase = e.budget_name
    lines = [f"{e.device} {e.what} {format_size(e.value)} exceeds {phase}={format_size(e.budget)} "
             f"by {format_size(e.value - e.budget)}"]
    site = figures.phase_peaks[phase][1]
    if site:
        lines += _chain_lines(chain_of(site), "  ")
    else:
        lines.append(f"  live when the {phase} began (no allocation in it went higher)")
    every = ", ".join(f"{name} {format_size(peak)}" for name, (peak, _) in figures.phase_peaks.items())
    lines.append(f"  the phases' peaks: {every}; the test's own peak {format_size(figures.peak)}")
    resolve(figures)
    phase_kinds = getattr(figures, "phase_kinds", {}).get(phase)
    if phase_kinds:
        lines += kinds_lines(figures, phase_kinds, f"the {phase}'s peak")
    lines.append(f"  exactly {e.value} B against {e.budget} B")
    return "\n".join(lines)


def child_budget_failure(exceeded, child, processes: list[dict]) -> str:
    """A child process over a budget: which one, its figure, its heaviest
    lines; then every process's figure on that device, so that the rank
    that broke the budget stands among the others."""
    e = exceeded
    lines = [f"{e.process} (pid {child.pid}): {e.device} {e.what} {format_size(e.value)} exceeds "
             f"{e.budget_name} {format_size(e.budget)} by {format_size(e.value - e.budget)}"]
    at_peak = child.at_peak.get(e.device) if e.what == "peak" else None
    if at_peak:
        # as the test's own failure: what was live at its peak, by site
        lines.append("  live at the peak, by the line that allocated it (user call chain):")
        lines += _site_lines([SiteBytes(int(x.get("bytes", 0)), [_frame(c) for c in x.get("chain") or ()])
                              for x in at_peak], e.value, len(at_peak))   # the child kept --memlab-top
    else:   # a total or reserved peak, or a child of an older record: its heaviest lines over its life
        for t in child.top.get(e.device, []):   # as many as --memlab-top (the child kept them)
            lines.append(f"  {format_size(t['bytes']):>10}  allocated at {t['file']}:{t['line']} {t['function']}")
    field = {"peak": "peak", "total peak": "peak_total"}.get(e.what)
    if field is not None:
        every = [f"{p['label']} {format_size(p['devices'][e.device][field])}" for p in processes
                 if p.get("devices", {}).get(e.device, {}).get(field) is not None]
        lines.append(f"  every process's {e.what} on {e.device}: " + ", ".join(every))
    missing = [p["label"] for p in processes if p.get("state") != "done"]
    if missing:
        lines.append(f"  no figures from: {', '.join(missing)}")
    lines.append(f"  exactly {e.value} B against {e.budget} B")
    return "\n".join(lines)


def _chain_lines(chain, indent: str) -> list[str]:
    if not chain:
        return [f"{indent}(allocated outside user code)"]
    return [f"{indent}allocated at {chain[0]}"] + [f"{indent}          <- {c}" for c in chain[1:]]


def leak_report(leak, top: int = 5) -> str:
    """A leak, shortest first: the bytes and the allowance; then per
    allocating site the tensors living there and who holds each."""
    lines = [f"{leak.device} leaked {format_size(leak.bytes)} after teardown (allowed {format_size(leak.allowed)})"]
    for site in leak.sites[:top]:
        n = len(site.tensors)
        owned = site.bytes - site.unowned
        head = (f"  {plural(n, 'tensor')}, {format_size(owned)}" if n else
                f"  {format_size(site.bytes)} in {plural(site.blocks, 'block')}")
        lines.append(head)
        lines += _chain_lines(site.chain, "    ")
        for t in site.tensors[:top]:
            lines.append(f"    {t.describe()}  {format_size(t.bytes)}")
            if t.holders:
                lines += [f"      held by: {h}" for h in t.holders]
            elif t.requires_grad:
                lines.append("      held by: autograd or C++ only (no path from a module, class, closure or frame); "
                             "it requires grad, so a retained autograd graph may hold it")
            else:
                lines.append("      held by: no path from a module, class, closure or frame was found")
            if t.graph:
                lines.append(f"      {t.graph}")
        if n > top:
            lines.append(f"    ... and {n - top} more tensors")
        if site.unowned and n:
            lines.append(f"    and {format_size(site.unowned)} that no Python tensor owns")
        if site.unowned:
            lines.append("    (bytes no Python tensor owns are held by autograd, such as a retained graph's "
                         "saved tensors, or by C++" + (", or were freed on a plain thread, where memlab "
                                                       "does not hear CPU frees)" if leak.device == "cpu" else ")"))
    rest = leak.sites[top:]
    if rest:
        lines.append(f"  ... and {len(rest)} more sites, {format_size(sum(s.bytes for s in rest))}")
    if leak.note:
        lines.append(f"  ({leak.note})")
    lines.append(f"  exactly {leak.bytes} B against {leak.allowed} B allowed")
    return "\n".join(lines)


def growth_report(device: str, kept: list[int]) -> str:
    """What each repetition of --memlab-leak-repeat kept."""
    steps = ", ".join("+" + format_size(k) for k in kept)
    return (f"{device} kept {format_size(sum(kept) // len(kept))} more after every repetition "
            f"({plural(len(kept), 'repetition')} of the test's call: {steps}): something the test "
            f"reaches grows each run (a cache, a list, a fixture's state)\n"
            f"  exactly {sum(kept)} B over {len(kept)} repetitions")


def _change_words(c) -> str:
    verb = "grew" if c.new > c.old else "shrank"
    pct = f"{100 * (c.new - c.old) / c.old:+.1f}%" if c.old else f"{format_size(c.new - c.old)} over 0 B"
    what = f"{c.phase} peak" if getattr(c, "phase", "") else "peak"
    return f"{what} {verb} from {format_size(c.old)} to {format_size(c.new)} ({pct})"


def phase_regression(change, figures) -> str:
    """A phase whose own peak grew beyond the tolerance against the
    baseline: the phase, old and new, and every phase's peak now."""
    c = change
    every = ", ".join(f"{name} {format_size(peak)}" for name, (peak, _) in (figures.phase_peaks or {}).items())
    return "\n".join([
        f"{c.device} {_change_words(c)}, over the tolerance {c.tolerance} (baseline {c.path})",
        f"  the phases' peaks now: {every}; the own peak {format_size(figures.peak)}",
        f"  exactly {c.new} B against {c.old} B in the baseline; the tolerance allows {c.allowed} B more",
    ])


def spread_failure(kind: str, spread: int, budget: int, high, low) -> str:
    """The ranks' own peaks, each on its own device, apart by more than
    the marker's spread allows: both ranks named, with what each held at
    its peak, by line.  high and low: (ChildFigures, its device)."""
    (hi, hi_device), (lo, lo_device) = high, low
    hi_peak, lo_peak = hi.devices[hi_device].peak, lo.devices[lo_device].peak
    lines = [f"{kind} spread between ranks {format_size(spread)} exceeds spread {format_size(budget)} by "
             f"{format_size(spread - budget)}: {hi.label} {format_size(hi_peak)} on {hi_device}, "
             f"{lo.label} {format_size(lo_peak)} on {lo_device}"]
    for child, device, peak in ((hi, hi_device, hi_peak), (lo, lo_device, lo_peak)):
        at_peak = child.at_peak.get(device) or []
        lines.append(f"  {child.label} (pid {child.pid}), own peak {format_size(peak)} on {device}"
                     + (", live at its peak by the line that allocated it (user call chain):" if at_peak else ""))
        lines += _site_lines([SiteBytes(int(x.get("bytes", 0)), [_frame(c) for c in x.get("chain") or ()])
                              for x in at_peak], peak, len(at_peak))
        kinds = getattr(child.devices[device], "kinds", None)
        if kinds:   # where a phase ran in it: what its peak was made of
            lines += [line.replace("  at its peak", "    at its peak", 1)
                      for line in kinds_lines(None, kinds, "its peak")]
    lines.append(f"  exactly {spread} B against {budget} B")
    return "\n".join(lines)


def kind_changes(old: dict | None, new: dict | None) -> list[str]:
    """Which kinds of the bytes at the own peak changed against the
    baseline's, largest growth first: one line, or none where either side
    has no kinds."""
    if not old or not new:
        return []
    moved = [(new.get(k, 0) - old.get(k, 0), k) for k in KIND_WORDS if new.get(k, 0) != old.get(k, 0)]
    if not moved:
        return ["  by kind at the peak: no kind changed"]
    moved.sort(key=lambda dk: (-dk[0], dk[1]))
    parts = [f"{KIND_WORDS[k]} {'+' if d > 0 else '-'}{format_size(abs(d))} "
             f"({format_size(old.get(k, 0))} -> {format_size(new.get(k, 0))})" for d, k in moved]
    return ["  by kind at the peak: " + ", ".join(parts)]


def phase_lines(old_phases: dict | None, figures) -> list[str]:
    """Each phase's own peak against the baseline's, where both have it:
    one line beside a regression of the peak (which fails the test once)."""
    old = old_phases or {}
    new = getattr(figures, "phase_peaks", None) or {}
    parts = [f"{name} {format_size(old[name])} -> {format_size(peak)}"
             for name, (peak, _) in new.items() if isinstance(old.get(name), int)]
    return [f"  by phase against the baseline: {', '.join(parts)}"] if parts else []


def baseline_failure(change, figures, top: int = 5, context: str = "", changes=(), old_kinds=None,
                     old_phases=None) -> str:
    """A regression (or, with --memlab-fail-on-improvement, an improvement)
    against the baseline: old and new figure, the change, the tolerance
    and the file; for a regression, what grew where first (changes: the
    lines whose bytes at the peak changed, judging.site_changes), then
    where the peak came from."""
    from .site_changes import describe_changes

    c = change
    if c.kind == "regressed":
        lines = [f"{c.device} {_change_words(c)}, over the tolerance {c.tolerance} (baseline {c.path})"]
        lines += phase_lines(old_phases, figures)
        if not c.process:
            lines += kind_changes(old_kinds, resolve(figures))
        if changes is None:
            lines.append("  (no line among the heaviest the baseline keeps changed: what grew is below them)")
        else:
            lines += describe_changes(list(changes), top)
        if figures.attribution is not None and figures.peak:
            lines += describe_attribution(figures.attribution, figures.peak, top, context)
        if not c.process:
            lines += kinds_lines(figures)
        lines.append(f"  exactly {c.new} B against {c.old} B in the baseline; the tolerance allows "
                     f"{c.allowed} B more")
    else:
        lines = [f"{c.device} {_change_words(c)}, beyond the tolerance {c.tolerance} (baseline {c.path})",
                 "  the baseline is no longer tight (--memlab-fail-on-improvement): write it again with "
                 "--memlab-update-baseline",
                 f"  exactly {c.new} B against {c.old} B in the baseline; the tolerance allows "
                 f"{c.allowed} B less"]
    return "\n".join(lines)




def cache_report(cache) -> str:
    """A cache, once: its holder, its bytes, the tests that filled it."""
    first, rest = cache.tests[0], cache.tests[1:]
    # a parameter's values: each test left its own value's state
    what = "on values of their own" if cache.holder.startswith("test ") else "adding keys of their own"
    others = f" (and {plural(len(rest), 'later test')} {what})" if rest else ""
    return (f"{cache.device} cache: {format_size(cache.bytes)} kept by {cache.holder}, "
            f"filled by {first}{others}")
