"""The pull-request summary: a short Markdown section appended to the job's
summary page (``$GITHUB_STEP_SUMMARY`` on GitHub Actions, or the file
``--memlab-summary=PATH`` names): the tests memlab failed, the largest
changes against the baseline with the line that grew, the leaks and the
caches.  Tables only where there is something to list; every figure is the
run's (the same as the terminal's and the JSON report's).
"""

from __future__ import annotations

from pathlib import Path

from ..sizes import format_size

ROWS = 10   # rows a table shows at most; the rest are counted


def _cell(text) -> str:
    """A table cell: pipes and line breaks would end it."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text) -> str:
    return "`" + str(text).replace("`", "'") + "`" if text else ""


def _table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows[:ROWS]]
    if len(rows) > ROWS:
        out.append(f"\n... and {len(rows) - ROWS} more (the JSON report has them all)")
    return out + [""]


def _grew_at(d) -> str:
    """The line that grew most against the baseline, as the failure names it."""
    for change in d.site_changes or ():
        if change.get("new", 0) > change.get("old", 0):
            line = ([change] + list(change.get("callers") or ()))[change.get("changed", 0)]
            where = f"{line.get('file')}:{line.get('function')}" if line.get("file") else ""
            grew = format_size(change["new"] - change.get("old", 0))
            return f"+{grew} {_code(line.get('text', ''))} {where}".rstrip()
    return ""


def _change(d) -> str:
    if not d.baseline_peak:
        return "new"
    return f"{(d.peak - d.baseline_peak) / d.baseline_peak:+.1%}"


def markdown(results: dict, caches: list = ()) -> str:
    tests = [results[n] for n in sorted(results)]
    devices = [(r.nodeid, d) for r in tests for d in r.devices.values() if d.measured]
    failed = [r for r in tests if r.failed_by_memlab]
    compared = [(n, d) for n, d in devices if d.baseline in ("regressed", "improved")]
    # the leaks memlab judged so (warned or failed), not what a policy allowed
    leaks = [(r.nodeid, d) for r in tests for d in r.devices.values()
             if d.measured and d.leaked and f"{d.device} leaks" in (*r.warned, *r.failed_by_memlab)]
    lines = ["## pytest-memlab", ""]
    counts = [f"{len({n for n, _ in devices})} tests measured", f"{len(failed)} failed by memlab"]
    if any(d.baseline for _, d in devices):
        by = [d.baseline for _, d in devices]
        counts.append(f"baseline: {by.count('regressed')} regressed, {by.count('improved')} improved, "
                      f"{by.count('new')} new")
    counts.append(f"{len(leaks)} leaking")
    lines += [" · ".join(counts), ""]
    if failed:
        lines += ["### Failed by memlab", ""]
        lines += _table(("test", "for", "own peak"), [
            (_code(r.nodeid), ", ".join(r.failed_by_memlab),
             ", ".join(f"{d.device} {format_size(d.peak)}" for d in r.devices.values() if d.measured))
            for r in failed])
    if compared:
        compared.sort(key=lambda nd: -abs(nd[1].peak - (nd[1].baseline_peak or 0)))
        lines += ["### Against the baseline, largest change first", ""]
        lines += _table(("test", "device", "baseline", "now", "change", "what grew where"), [
            (_code(n), d.device, format_size(d.baseline_peak), format_size(d.peak), _change(d), _grew_at(d))
            for n, d in compared])
    if leaks:
        leaks.sort(key=lambda nd: -nd[1].leaked)
        lines += ["### Left allocated after teardown", ""]
        lines += _table(("test", "device", "left"), [(_code(n), d.device, format_size(d.leaked)) for n, d in leaks])
    if caches:
        lines += ["### Caches (kept once, not leaks)", ""]
        lines += _table(("holder", "device", "bytes", "filled by"), [
            (_code(c["holder"]), c["device"], format_size(c["bytes"]), _code((c.get("tests") or [""])[0]))
            for c in caches])
    return "\n".join(lines).rstrip() + "\n"


def append(path, results: dict, caches: list = ()) -> None:
    """Appends the section (a step's summary file collects several)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown(results, caches) + "\n")
