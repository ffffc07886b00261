"""The terminal summary: the table of measured tests, worst first, the
heaviest tests' lines, and what the baseline comparison or update found."""

from __future__ import annotations

import linecache
import os

from ..figures import across, own_device
from ..sizes import format_size, plural
from .backend_words import backend_words


def baseline_change(d) -> str:
    """The table's baseline cell: the own peak's change, or why there is none."""
    if d.baseline in ("new", "not compared"):
        return d.baseline
    if d.baseline_peak is None or d.peak is None:
        return "-"
    if d.peak == d.baseline_peak:
        return "same"
    if d.baseline_peak == 0:
        return "+" + format_size(d.peak)
    return f"{100 * (d.peak - d.baseline_peak) / d.baseline_peak:+.1f}%"


_FAILURE_WORDS = {"baseline": "grew since the baseline", "leaks": "leaked", "leak growth": "grew at each repetition"}


def failure_words(key: str) -> str:
    """A finding's key ("cpu max", "cuda:0 baseline [rank 1]") as the
    summary says it: "cpu over max", "cuda:0 grew since the baseline [rank 1]"."""
    own, bracket, process = key.partition(" [")
    device, _, name = own.partition(" ")
    if name.endswith(" baseline"):   # a phase's peak: "backward baseline"
        words = f"{name[:-len(' baseline')]} grew since the baseline"
    else:
        words = _FAILURE_WORDS.get(name, f"over {name}")
    return f"{device} {words}" + (f" [{process}" if bracket else "")


def own_peak_text(d) -> str:
    """The own peak, with what the test kept past its teardown beside it:
    the own peak leaves that out by definition (a leak or a first use is
    not part of it), and a bare ``0 B`` beside an 8 MiB leak reads as a
    test that allocated nothing."""
    if d.kept:
        return f"{format_size(d.peak)} (+{format_size(d.kept)} kept)"
    return format_size(d.peak)


WIDTH = 100   # the terminal table fits this many columns


def _middle_cut(text: str, width: int) -> str:
    """text in at most width characters, its middle elided."""
    if len(text) <= width:
        return text
    keep = width - 3
    head = keep // 3      # the end (test name, parameters) says more than the start
    return text[:head] + "..." + text[len(text) - (keep - head):]


def cut_nodeid(nodeid: str, width: int) -> str:
    """A node id in at most width characters: the path is cut, the test's
    name kept whole where it fits (``test_demo_b...::test_grew_since``)."""
    if len(nodeid) <= width:
        return nodeid
    path, sep, name = nodeid.rpartition("::")
    if sep and len(name) + len(sep) + 4 <= width:
        room = width - len(name) - len(sep) - 3
        return path[:room] + "..." + sep + name
    return _middle_cut(nodeid, width)


def _end_cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def use_text(peak, budget) -> str:
    """The share of max used, in whole percent rounded half up (as the HTML
    report rounds it): 12.5% is 13%."""
    if budget is None:
        return "-"
    if not budget or peak is None:
        return "inf"
    percent = (200 * peak + budget) // (2 * budget)
    if percent > 999:   # far over: the ratio reads at a glance where 3600% is noise
        return f"{(2 * peak + budget) // (2 * budget)}x"
    return f"{percent}%"


def _worst_first(rd) -> tuple:
    r, d = rd
    use = d.peak / d.max if d.max and d.peak is not None else -1.0
    return (not r.failed_by_memlab, -use, -(d.peak or 0), r.nodeid)


def first_use_lines(measured: list, verbosity: int = 0) -> list[tuple[str, bool]]:
    """The tests that paid a first use the leak check told apart (memory
    kept for the process: a library's workspace, a cache), left out of
    their compared peaks, heaviest first: 3 by default, all under -v, none
    under -q.  (What else a test kept, freed after it or not told apart,
    is its JSON figure kept.)"""
    paid = sorted(((d.first_use, r.nodeid, d) for r, d in measured if d.first_use), key=lambda x: -x[0])
    if not paid or verbosity < 0:
        return []
    out = [(f"first use, kept for the process and left out of the compared peaks: "
            f"{plural(len(paid), 'test')}, {format_size(sum(n for n, _, _ in paid))}", False)]
    for n, nodeid, d in paid[: None if verbosity > 0 else 3]:
        held = "; ".join(d.first_use_held) if d.first_use_held else "no holder named"
        out.append((f"  {format_size(n)} {d.device} {nodeid}: {held}", False))
    if verbosity <= 0 and len(paid) > 3:
        out.append((f"  ... and {len(paid) - 3} more (-v lists them)", False))
    return out


def summary(results: dict, backend: str, notes: set[str], table: bool, verbosity: int = 0,
            top: int = 5, torch_version: str | None = None, rootdir=None) -> list[tuple[str, bool]]:
    """The terminal summary's lines, each with whether it is bold.  With
    table: the measured tests worst first (those memlab failed, then by the
    share of their budget used, then by own peak) in at most WIDTH columns,
    10 rows under -q, 20 by default, all under -v; then the heaviest tests'
    top lines (3 tests by default, 10 under -v, none under -q).  -qq keeps
    the counts only.  The head line says how the run was measured in
    words; -vv adds the backend's own name (the JSON report keeps it)."""
    out: list[tuple[str, bool]] = []
    rows = [(r, d) for r in results.values() for d in r.devices.values()]
    measured = [(r, d) for r, d in rows if d.measured]
    tests_measured = sum(1 for r in results.values() if any(d.measured for d in r.devices.values()))
    not_measured = len(results) - tests_measured
    head = f"{plural(tests_measured, 'test')} measured"
    words = backend_words(backend, torch_version)
    if words.startswith("measured "):
        head = f"{plural(tests_measured, 'test')} {words}"
    if not_measured:
        head += f"; {not_measured} not measured (below)"
    if words and not words.startswith("measured "):
        head += f" ({words})"
    out.append((head, False))
    if backend and verbosity > 1:
        out.append((f"backend: {backend}", False))
    for note in sorted(notes):
        out.append((f"line attribution off: {note}", False))
    by_reason: dict[str, list[str]] = {}
    for r in results.values():
        for d in r.devices.values():
            if not d.measured:
                by_reason.setdefault(f"{d.device}: {d.reason}", []).append(r.nodeid)
        if r.memlab_error:
            by_reason.setdefault(f"pytest-memlab error: {r.memlab_error}", []).append(r.nodeid)
    for reason, nodeids in by_reason.items():
        if len(nodeids) <= 3:
            out += [(f"not measured: {nodeid} {reason}", False) for nodeid in nodeids]
        else:
            out.append((f"not measured: {len(nodeids)} tests ({nodeids[0]}, ...) {reason}", False))
    warned = [r for r in results.values() if r.warned]
    if warned:
        out.append((f"{plural(len(warned), 'test')} left tensors allocated after teardown "
                    f"({', '.join(sorted({k for r in warned for k in r.warned}))}); see the warnings above", False))
    out += [(line, True) for r in results.values() for line in r.said]
    failed = [r for r in results.values() if r.failed_by_memlab]
    if failed:
        why = sorted({failure_words(k) for r in failed for k in r.failed_by_memlab})
        out.append((f"{plural(len(failed), 'test')} failed by memlab ({', '.join(why)}); see above", False))
    if verbosity > -2:
        out += children_lines(results, verbosity)
        out += first_use_lines(measured, verbosity)
    if not table or verbosity <= -2 or not measured:
        return out
    measured.sort(key=_worst_first)
    limit = None if verbosity > 0 else (10 if verbosity < 0 else 20)
    shown = measured[:limit]
    # No column of its own for what a test left after teardown: the own
    # peak's cell says it (own_peak_text), the leak's verdict is above.
    header = ("test", "device", "own peak", "total peak", "reserved", "max", "use")
    compared = any(d.baseline for _, d in shown)
    if compared:
        header += ("baseline",)
    cells = [header]
    for r, d in shown:
        budget = d.max
        use = use_text(d.peak, budget)
        cells.append((
            r.nodeid, d.device, own_peak_text(d), format_size(d.peak_total),
            format_size(d.reserved_peak) if d.reserved_peak is not None else "-",
            format_size(budget) if budget is not None else "-", use,
        ) + ((baseline_change(d),) if compared else ()))
    # Columns that say nothing here give their room to the node ids: the
    # device when every row has the same one (the head line names it), the
    # reserved peak where no device has a reserved pool.
    drop = set()
    # The file every row shares is said once, above the rows (the node ids
    # keep their test names whole in the room it frees).
    modules = {str(row[0]).rpartition("::")[0] for row in cells[1:]}
    module = next(iter(modules)) if len(modules) == 1 and "" not in modules else ""
    if module:
        cells = [cells[0]] + [(str(row[0])[len(module) + 2:],) + tuple(row[1:]) for row in cells[1:]]
    where = f", in {module}" if module else ""
    if len({row[1] for row in cells[1:]}) == 1:
        drop.add(1)
        out.append((f"on {cells[1][1]}{where}:", False))
    elif where:
        out.append((f"{where[2:]}:", False))
    if all(row[4] == "-" for row in cells[1:]):
        drop.add(4)
    cells = [tuple(c for i, c in enumerate(row) if i not in drop) for row in cells]
    header = cells[0]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(header))]
    widths[0] = min(widths[0], max(20, WIDTH - sum(widths[1:]) - 2 * (len(header) - 1)))
    left = 1 if 1 in drop else 2    # left-aligned: the test, and the device when shown
    for n, row in enumerate(cells):
        row = (cut_nodeid(str(row[0]), widths[0]),) + tuple(row[1:])
        line = "  ".join(str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        out.append((line.rstrip(), n == 0))
    if len(shown) < len(measured):
        rest = len(measured) - len(shown)
        out.append((f"... and {rest} more {'row' if rest == 1 else 'rows'} (-v shows all)", False))
    heaviest = [(r, d) for r, d in sorted(measured, key=lambda rd: -(rd[1].peak or 0)) if d.top]
    heaviest = heaviest[:0 if verbosity < 0 else (10 if verbosity > 0 else 3)]
    if heaviest:
        out.append(("the heaviest tests, by the lines that allocated most "
                    "(allocated over the test, not held at once):", True))
    for r, d in heaviest:
        kept = f"; {format_size(d.kept)} kept past teardown, not in it" if d.kept else ""
        said = f" ({d.device}, own peak {format_size(d.peak)}{kept})"
        out.append((cut_nodeid(r.nodeid, WIDTH - len(said)) + said, False))
        for t in d.top[:top]:
            out.append((_end_cut(f"  {format_size(t['bytes']):>10} allocated by {t['file']}:{t['line']} "
                                 f"{t['function']}{_source(t, rootdir)}", WIDTH), False))
    return out


def _source(t: dict, rootdir) -> str:
    """A heaviest line's text, read where its file is (its path is shown
    relative to rootdir when under it)."""
    path = os.path.join(str(rootdir), t["file"]) if rootdir is not None else t["file"]
    text = linecache.getline(path, t["line"]).strip()
    return f": {text}" if text else ""


def children_lines(results: dict, verbosity: int = 0) -> list[tuple[str, bool]]:
    """The tests that started processes: per device each process's own
    peak, the max and the process that reached it, the spread; and the
    processes whose figures are missing, with why (shown always: a figure
    the summary lacks must be said)."""
    out: list[tuple[str, bool]] = []
    with_children = [r for r in results.values() if r.processes]
    limit = None if verbosity > 0 else 10
    for r in sorted(with_children, key=lambda r: r.nodeid)[:limit]:
        out.append((f"{r.nodeid}: {plural(len(r.processes), 'child process', 'child processes')}", False))
        for kind, a in across(r.processes).items():
            # each process on its own device: named where they differ
            named = len(set(a["devices"].values())) > 1
            peaks = []
            for p in r.processes:
                own = own_device(p.get("devices", {}), kind) if p.get("state") == "done" else None
                if own is None:
                    continue
                on = f" on {own[0]}" if named else ""
                peaks.append(f"{p['label']} {format_size(own[1])}{on}")
            device = kind if named else next(iter(a["devices"].values()))
            shown = ", ".join(peaks[:8]) + (f", ... ({len(peaks) - 8} more)" if len(peaks) > 8 else "")
            if a["processes"] > 1:
                # over the ranks alone where other children (a DataLoader's workers) are listed beside them
                over = " over ranks" if a.get("over") == "ranks" and len(peaks) > a["processes"] else ""
                shown += f"; max{over} {format_size(a['max'])} ({a['worst']}), spread {format_size(a['spread'])}"
            out.append((f"  {device} own peak: {shown}", False))
        for p in r.processes:
            if p.get("state") != "done":
                out.append((f"  {p['label']} (pid {p['pid']}): no figures: {p.get('why', '')}", True))
    if limit is not None and len(with_children) > limit:
        out.append((f"... and {len(with_children) - limit} more tests with child processes (-v shows all)", False))
    return out


def _listing(label: str, names: list[str], limit: int = 10) -> list[tuple[str, bool]]:
    if not names:
        return []
    out = [(f"  {label}:", False)]
    out += [(f"    {n}", False) for n in names[:limit]]
    if len(names) > limit:
        out.append((f"    ... and {len(names) - limit} more", False))
    return out


def baseline_summary(path, env: str, results: dict, differences: list[str], stale: list[str],
                     written: dict | None = None, skipped: list[str] | None = None,
                     changes: dict | None = None) -> list[tuple[str, bool]]:
    """What the comparison with (or the update of) the baseline found:
    counts first, then the new tests, the improvements and the stale
    entries by name."""
    out: list[tuple[str, bool]] = []
    devices = [(r.nodeid, d) for r in results.values() for d in r.devices.values() if d.measured]
    other_gpu = [n for n, d in devices if d.baseline == "not compared"]
    if differences:
        how = ("its GPU figures were not compared, the rest ran all the same" if other_gpu and written is None
               else "the comparisons ran all the same")
        out.append((f"baseline {path} [{env}] was measured elsewhere: {'; '.join(differences)} ({how})", False))
    if written is not None:
        changes = changes or {}
        parts = [f"{plural(len(written), 'test')} written ({len(changes.get('new', []))} new, "
                 f"{len(changes.get('changed', []))} changed)"]
        if changes.get("pruned"):
            parts.append(f"{plural(len(changes['pruned']), 'stale entry', 'stale entries')} pruned")
        out.append((f"baseline {path} [{env}] updated: {', '.join(parts)}", False))
        out += _listing("not written, because they failed by their own doing or did not run", sorted(skipped or []))
        out += _listing("pruned", changes.get("pruned", []))
        if stale and not changes.get("pruned"):
            out.append((f"  {plural(len(stale), 'stale entry', 'stale entries')} kept "
                        "(--memlab-prune-baseline drops them)", False))
            out += _listing("stale", stale)
        return out
    by = {}
    # A test whose own figure held but a rank or a phase of it grew (its
    # finding key: "cpu baseline [rank 1]", "cpu forward baseline") is
    # counted as regressed too: the summary agrees with the failures.
    grew = {r.nodeid for r in results.values()
            if any(k.partition(" [")[0].endswith(" baseline") for k in r.failed_by_memlab)}
    for nodeid, d in devices:
        kind = d.baseline or "same"
        if nodeid in grew and kind in ("same", "improved"):
            kind, grew = "regressed", grew - {nodeid}
        by.setdefault(kind, []).append((nodeid, d))
    compared = len(devices) - len(by.get("new", [])) - len(by.get("not compared", []))
    line = f"baseline {path} [{env}]: {compared} compared"
    for kind, words in (("regressed", "regressed"), ("improved", "improved beyond the tolerance"),
                        ("new", "new (not in the baseline)"),
                        ("not compared", "not compared (written on another GPU kind: keep a baseline per GPU "
                                         "kind, --memlab-baseline-env=NAME)")):
        if by.get(kind):
            line += f", {len(by[kind])} {words}"
    if stale:
        line += f", {plural(len(stale), 'stale entry', 'stale entries')}"
    out.append((line, bool(by.get("regressed"))))
    out += _listing("improved (write the baseline again to keep it tight)",
                    [f"{n} [{d.device}] {format_size(d.baseline_peak)} -> {format_size(d.peak)}"
                     for n, d in by.get("improved", [])])
    out += _listing("new, listed not failed (--memlab-update-baseline adds them)",
                    sorted({n for n, _ in by.get("new", [])}))
    out += _listing("stale, tests the baseline has that no longer exist (--memlab-prune-baseline drops them)", stale)
    return out
