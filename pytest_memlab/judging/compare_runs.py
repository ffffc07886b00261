"""``python -m pytest_memlab compare OLD NEW``: two runs' figures side by
side, for CI (a pull request's run against main's), in the spirit of
pytest-benchmark's ``compare``.

Each side is a baseline file (one lane of it: ``--env``) or a JSON report;
a report's devices are keyed by the name the test asked for (``cuda``, not
``cuda:0``), and its ranks as ``DEVICE@rank N``, as the baseline keys them,
so that either kind compares with either.  Only the own peak is compared,
exactly as the plugin compares a run with its baseline (growth beyond the
tolerance of OLD's figure regresses, shrinkage beyond it improves);
``first_use`` (what a test allocated once for the whole process) is shown
where it differs, never judged.  Where both sides kept the heaviest lines at
the peak (``sites``), a change says what grew there and what shrank.

Reading checks everything and raises :class:`InputError`, one line naming
the file and what is wrong; the command turns it into exit status 2.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..figures import RANK_KEY, device_of
from ..reports import json_report
from ..sizes import SizeError, Tolerance, format_size, parse_tolerance, plural
from . import baseline_file
from .findings import Change
from .site_changes import SiteChange, describe_changes, site_changes
from .verdicts import DEFAULT_TOLERANCE, compare

REPORT_VERSIONS = range(1, json_report.VERSION + 1)   # each has a device's peak and name
LISTED = 20   # new and gone tests named in the text before "... and N more"


class InputError(Exception):
    """An input that cannot be compared; the message names the file."""


# -- reading ---------------------------------------------------------------------
@dataclass
class Entry:
    """One test's figures on one device (or rank), as compared."""

    peak: int
    first_use: int = 0
    sites: list = field(default_factory=list)


@dataclass
class Run:
    """One side: a baseline's lane or a report, as nodeid -> device -> Entry."""

    path: str
    kind: str                        # "baseline" or "report"
    lane: str | None                 # the baseline's lane; None for a report
    info: dict                       # the environment it was measured in
    tests: dict = field(default_factory=dict)
    has_sites: bool = False          # written by a pytest-memlab that keeps sites
    has_first_use: bool = False      # ... and first_use
    left_out: list = field(default_factory=list)   # a report's tests a baseline would not keep

    @property
    def label(self) -> str:
        return f"{self.path} [{self.lane}]" if self.kind == "baseline" else f"{self.path} (report)"


def load(path, env: str | None = None) -> Run:
    """A baseline (its lane ``env``, or the default lane) or a JSON report."""
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a folder, not a baseline or a JSON report") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{name}: cannot be read: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{name}: nested too deeply to be a baseline or a report") from None
    if not isinstance(data, dict):
        raise InputError(f"{name}: expected a JSON object at the top, found {type(data).__name__}")
    kind = data.get("format")
    if kind == baseline_file.FORMAT:
        return _baseline(path, text, env)
    if kind == json_report.FORMAT:
        return _report(name, data)
    raise InputError(f"{name}: 'format' is {kind!r}, expected {baseline_file.FORMAT!r} (a baseline) "
                     f"or {json_report.FORMAT!r} (a JSON report)")


def _baseline(path: Path, text: str, env: str | None) -> Run:
    name = str(path)
    try:
        baseline = baseline_file.Baseline.parse(path, text)
    except baseline_file.BaselineError as exc:
        # its advice is for the plugin, which would write over the file
        raise InputError(str(exc).split("; the file was left as it is")[0]) from None
    lanes = sorted(baseline.environments)
    if not lanes:
        raise InputError(f"{name}: a baseline with no lanes (no entries)")
    if env is not None:
        if env not in baseline.environments:
            raise InputError(f"{name}: no lane {env!r} (its lanes: {', '.join(lanes)})")
        lane = env
    elif len(lanes) == 1:
        lane = lanes[0]
    elif "cuda" in baseline.environments or "cpu" in baseline.environments:
        lane = "cuda" if "cuda" in baseline.environments else "cpu"
    else:
        raise InputError(f"{name}: several lanes and none is 'cuda' or 'cpu': pick one with --env "
                         f"(its lanes: {', '.join(lanes)})")
    environment = baseline.environments[lane]
    run = Run(name, "baseline", lane, dict(environment.info))
    for nodeid, devices in environment.tests.items():
        for device, figures in devices.items():
            run.tests.setdefault(nodeid, {})[device] = _entry(run, figures)
    return run


def _report(name: str, data: dict) -> Run:
    version = data.get("version")
    if version not in REPORT_VERSIONS:
        raise InputError(f"{name}: report format version {version!r} is not known to this pytest-memlab, "
                         f"which reads versions {REPORT_VERSIONS[0]} to {REPORT_VERSIONS[-1]}")
    info = data.get("environment")
    run = Run(name, "report", None, dict(info) if isinstance(info, dict) else {})
    tests = data.get("tests")
    if not isinstance(tests, list):
        raise InputError(f"{name}: 'tests' is not a list")
    for i, test in enumerate(tests):
        if not isinstance(test, dict) or not isinstance(test.get("nodeid"), str):
            raise InputError(f"{name}: test {i} is not an object with a 'nodeid'")
        nodeid = test["nodeid"]
        devices = test.get("devices")
        if not isinstance(devices, dict):
            raise InputError(f"{name}: test {nodeid!r}: 'devices' is not an object")
        if not _usable(test):
            if any(isinstance(d, dict) and d.get("measured") and d.get("peak") is not None
                   for d in devices.values()):
                run.left_out.append(nodeid)
            continue
        measured = []   # (concrete device, its name)
        for device, d in devices.items():
            if not isinstance(d, dict):
                raise InputError(f"{name}: test {nodeid!r}, device {device!r}: not an object")
            if d.get("measured") is False or d.get("peak") is None:
                continue
            _check_bytes(name, nodeid, device, "peak", d["peak"])
            key = d.get("name") or device
            if not isinstance(key, str):
                raise InputError(f"{name}: test {nodeid!r}, device {device!r}: 'name' is {key!r}")
            run.tests.setdefault(nodeid, {}).setdefault(key, _entry(run, d, nodeid, device))
            measured.append((device, key))
        # each rank's own figures, keyed as the baseline keys them
        for p in test.get("processes") or ():
            if not isinstance(p, dict) or p.get("rank") is None or p.get("state") != "done" or p.get("own"):
                continue
            for device, key in measured:
                f = device_of(p.get("devices") or {}, device)
                if isinstance(f, dict) and isinstance(f.get("peak"), int) and not isinstance(f["peak"], bool):
                    run.tests[nodeid].setdefault(RANK_KEY.format(device=key, rank=p["rank"]), Entry(f["peak"]))
    return run


def _usable(test: dict) -> bool:
    """As the plugin decides what goes into a baseline: a test that passed,
    or that only memlab failed (a budget, a leak, the baseline); not one
    that was skipped or failed by its own doing (its figures stop short)."""
    if test.get("memlab_error"):
        return False
    outcome = test.get("outcome")
    return outcome == "passed" or (outcome in ("failed", "error") and bool(test.get("failed_by_memlab")))


def _check_bytes(name: str, nodeid: str, device: str, key: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"{name}: test {nodeid!r}, device {device!r}: {key} is {value!r}, "
                         "expected bytes (a whole number >= 0)")


def _entry(run: Run, figures: dict, nodeid: str = "", device: str = "") -> Entry:
    """An entry's compared and shown figures; sites and first_use are
    missing from files written before they were kept ([] and 0)."""
    entry = Entry(figures["peak"])
    if "first_use" in figures:
        run.has_first_use = True
        value = figures["first_use"]
        if value is not None:
            _check_bytes(run.path, nodeid, device, "first_use", value)
            entry.first_use = value
    if "sites" in figures:
        run.has_sites = True
        sites = figures["sites"]
        if isinstance(sites, list):
            entry.sites = [s for s in sites if isinstance(s, dict) and isinstance(s.get("bytes"), int)]
    return entry


def pick_tolerance(spec: str = DEFAULT_TOLERANCE) -> Tolerance:
    """--tolerance; raises InputError naming it."""
    try:
        return parse_tolerance(spec)
    except SizeError as exc:
        raise InputError(f"--tolerance: {exc}") from None


# -- comparing -------------------------------------------------------------------
@dataclass
class Pair:
    """One test on one device, on either side or both."""

    nodeid: str
    device: str
    old: Entry | None
    new: Entry | None
    change: Change | None = None          # both sides: the peak's comparison
    sites: list[SiteChange] | None = None  # None: a side kept no sites

    @property
    def kind(self) -> str:
        if self.old is None:
            return "new"
        if self.new is None:
            return "gone"
        return {"same": "unchanged"}.get(self.change.kind, self.change.kind)

    @property
    def first_use_changed(self) -> bool:
        return self.old is not None and self.new is not None and self.old.first_use != self.new.first_use


KINDS = ("regressed", "improved", "unchanged", "new", "gone")


@dataclass
class Comparison:
    old: Run
    new: Run
    tolerance: Tolerance
    pairs: list[Pair]
    differences: list[str]                # of the environments, as far as they move figures
    first_use_compared: bool              # both sides keep first_use

    def of(self, kind: str) -> list[Pair]:
        return [p for p in self.pairs if p.kind == kind]

    @property
    def regressed(self) -> list[Pair]:   # the most grown first
        return sorted(self.of("regressed"), key=lambda p: (-p.change.new + p.change.old, p.nodeid, p.device))

    @property
    def improved(self) -> list[Pair]:    # the most shrunk first
        return sorted(self.of("improved"), key=lambda p: (p.change.new - p.change.old, p.nodeid, p.device))

    @property
    def first_use(self) -> list[Pair]:
        return [p for p in self.pairs if p.first_use_changed] if self.first_use_compared else []

    def counts(self) -> dict[str, int]:
        return {kind: len(self.of(kind)) for kind in KINDS}

    def failed(self, fail_on_improvement: bool = False) -> bool:
        return bool(self.of("regressed")) or (fail_on_improvement and bool(self.of("improved")))


def compare_runs(old: Run, new: Run, tolerance: Tolerance) -> Comparison:
    """Every test and device of either side, paired; the peak compared as
    the plugin compares it with its baseline."""
    pairs = []
    for nodeid in sorted(set(old.tests) | set(new.tests)):
        if (nodeid not in new.tests and nodeid in new.left_out) or (nodeid not in old.tests and nodeid in old.left_out):
            continue   # not compared: the other side's figures of it stop short
        before, after = old.tests.get(nodeid, {}), new.tests.get(nodeid, {})
        for device in sorted(set(before) | set(after)):
            o, n = before.get(device), after.get(device)
            pair = Pair(nodeid, device, o, n)
            if o is not None and n is not None:
                pair.change = compare(device, o.peak, n.peak, tolerance, old.path)
                if old.has_sites and new.has_sites:
                    pair.sites = site_changes(o.sites, n.sites)
            pairs.append(pair)
    differences = baseline_file.environment_differences(old.info, new.info)
    return Comparison(old, new, tolerance, pairs, differences, old.has_first_use and new.has_first_use)


# -- words -----------------------------------------------------------------------
def change_words(old: int, new: int) -> str:
    """``peak 20.0 MiB -> 28.0 MiB (+40.0%)``"""
    return f"peak {format_size(old)} -> {format_size(new)} ({_relative(old, new)})"


def _relative(old: int, new: int) -> str:
    return f"{100 * (new - old) / old:+.1f}%" if old else f"{_signed(new - old)} over 0 B"


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_size(abs(n))


def summary_line(c: Comparison) -> str:
    counts = c.counts()
    return ", ".join(f"{counts[kind]} {kind}" for kind in KINDS)


def _site_lines(c: Comparison, pair: Pair, indent: str = "  ") -> list[str]:
    if pair.sites is None:
        missing = [r.path for r in (c.old, c.new) if not r.has_sites]
        return [f"{indent}(no lines to compare: {' and '.join(missing)} "
                f"{'keeps' if len(missing) == 1 else 'keep'} no sites at the peak, written by an older pytest-memlab)"]
    if not pair.sites:
        return [f"{indent}(none of the heaviest lines kept at the peak moved: the change is in lighter ones)"]
    return describe_changes(pair.sites, indent=indent)


def _first_use_line(p: Pair) -> str:
    return (f"{p.nodeid} [{p.device}]: first use {format_size(p.old.first_use)} -> {format_size(p.new.first_use)} "
            "(allocated once for the process: shown, not compared)")


def render_text(c: Comparison, fail_on_improvement: bool = False) -> str:
    lines = [f"pytest-memlab compare: {c.old.label} -> {c.new.label}, tolerance {c.tolerance.text}"]
    if c.differences:
        lines.append(f"  measured in different environments: {'; '.join(c.differences)} (compared all the same)")
    for kind, pairs in (("regressed", c.regressed), ("improved", c.improved)):
        for p in pairs:
            ch = p.change
            lines.append("")
            lines.append(f"{kind} {p.nodeid} [{p.device}]: {change_words(ch.old, ch.new)}")
            more = "more" if kind == "regressed" else "less"
            lines.append(f"  exactly {ch.new} B against {ch.old} B; the tolerance allows {ch.allowed} B {more}")
            lines += _site_lines(c, p)
    first_use = c.first_use
    if first_use:
        lines.append("")
        lines += [_first_use_line(p) for p in first_use]
    listings = [(f"{kind} ({words}):", [f"{p.nodeid} [{p.device}]" for p in c.of(kind)])
                for kind, words in (("new", "only in NEW"), ("gone", "only in OLD"))]
    listings += [(f"left out of {r.path} (skipped, or failed by its own doing: its figures stop short):",
                  r.left_out) for r in (c.old, c.new)]
    for title, names in listings:
        if names:
            lines.append("")
            lines.append(title)
            lines += [f"  {n}" for n in names[:LISTED]]
            if len(names) > LISTED:
                lines.append(f"  ... and {len(names) - LISTED} more")
    lines.append("")
    tail = ""
    if fail_on_improvement and c.of("improved"):
        tail = " (improvements fail: --fail-on-improvement)"
    lines.append(f"pytest-memlab compare: {summary_line(c)}{tail}")
    return "\n".join(lines) + "\n"


def _code(text: str, table: bool = False) -> str:
    """text as a Markdown code span: a fence longer than any run of
    backticks in it; in a table's cell, | escaped (GitHub's tables split
    cells on | even inside code spans, and drop the backslash there)."""
    runs = [len(r) for r in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    span = f"{fence}{pad}{text}{pad}{fence}"
    return span.replace("|", "\\|") if table else span


def _cell(text: str) -> str:
    return html.escape(text, quote=False).replace("|", "\\|")


def _block(lines: list[str]) -> list[str]:
    """A fenced code block that its content cannot close."""
    runs = [len(r) for line in lines for r in re.findall(r"`{3,}", line)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return [fence, *lines, fence]


def render_markdown(c: Comparison, fail_on_improvement: bool = False) -> str:
    """For a pull request's comment: the verdict, a table of what changed
    beyond the tolerance, the lines that moved each regression."""
    regressed = {p.nodeid for p in c.of("regressed")}
    improved = {p.nodeid for p in c.of("improved")}
    if regressed:
        verdict = f"memory regressed in {plural(len(regressed), 'test')}"
    elif fail_on_improvement and improved:
        verdict = f"the baseline is loose: {plural(len(improved), 'test')} improved (--fail-on-improvement)"
    else:
        verdict = "no memory regression"
    out = [f"### pytest-memlab: {verdict}", ""]
    out.append(f"OLD {_code(c.old.path)}{_lane(c.old)}, NEW {_code(c.new.path)}{_lane(c.new)}, "
               f"tolerance {_code(c.tolerance.text)}: {summary_line(c)}.")
    if c.differences:
        out += ["", f"Measured in different environments: {_cell('; '.join(c.differences))} (compared all the same)."]
    rows = [("regressed", p) for p in c.regressed] + [("improved", p) for p in c.improved]
    if rows:
        out += ["", "| test | device | old | new | change |", "| --- | --- | ---: | ---: | ---: |"]
        for kind, p in rows:
            ch = p.change
            out.append(f"| {_code(p.nodeid, table=True)} | {_cell(p.device)} | {format_size(ch.old)} "
                       f"| {format_size(ch.new)} | {_signed(ch.new - ch.old)} ({_relative(ch.old, ch.new)}) |")
    for p in c.regressed:
        ch = p.change
        out += ["", f"<details><summary><code>{html.escape(p.nodeid)}</code> [{html.escape(p.device)}]: "
                    f"{html.escape(change_words(ch.old, ch.new))}</summary>", ""]
        out += _block([f"exactly {ch.new} B against {ch.old} B; the tolerance allows {ch.allowed} B more",
                       *_site_lines(c, p, indent="")])
        out += ["", "</details>"]
    first_use = c.first_use
    if first_use:
        out += ["", "First use (allocated once for the process: shown, not compared):", ""]
        out += [f"- {_code(p.nodeid)} [{_cell(p.device)}]: {format_size(p.old.first_use)} -> "
                f"{format_size(p.new.first_use)}" for p in first_use]
    for kind, words in (("new", "only in NEW"), ("gone", "only in OLD")):
        pairs = c.of(kind)
        if pairs:
            out += ["", f"<details><summary>{len(pairs)} {kind} ({words})</summary>", ""]
            out += [f"- {_code(p.nodeid)} [{_cell(p.device)}]" for p in pairs]
            out += ["", "</details>"]
    for r in (c.old, c.new):
        if r.left_out:
            out += ["", f"<details><summary>{len(r.left_out)} left out of {html.escape(r.path)} (skipped, or "
                        "failed by its own doing)</summary>", ""]
            out += [f"- {_code(n)}" for n in r.left_out]
            out += ["", "</details>"]
    return "\n".join(out) + "\n"


def _lane(run: Run) -> str:
    return f" [{_cell(run.lane)}]" if run.kind == "baseline" else " (report)"
