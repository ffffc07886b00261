"""What fails a test, in one place: its budgets, the leak policy and a
growing leak, and the comparison with the baseline.

Judged when pytest makes the call's report (on the figures of setup and
call, so that an exceeded budget fails the call as a failed assertion
would) and again at teardown's (on the final figures: what only teardown
pushed over a budget, the leak check, the baseline).  Each finding
(:mod:`.findings`) is recorded once under its key; a test memlab fails
keeps its own failure first when it had one.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings

import re

from .findings import Cache, Change, Exceeded, Growth
from ..sizes import format_size
from .site_changes import site_changes, sites_at_peak
from ..figures import KIND_BUDGETS, KIND_WORDS, PHASE_NAMES, RANK_KEY, device_of, kinds_note
from ..figures import resolve_kinds as resolve
from .messages import (baseline_failure, budget_failure, child_budget_failure, growth_report, leak_report,
                       phase_budget_failure, phase_regression, spread_failure)

# A holder path's root: what holds the first step (see leak_search.holders_of).
_ROOT = re.compile(r"^(module \S+, global \w+|class \S+, attribute \w+|closure of \S+ \(variable \w+\)"
                   r"|test \S+, parameter \w+)")

# --memlab-leaks and a marker's leaks= decide what a leak does.
LEAK_POLICIES = ("fail", "warn", "off")
DEFAULT_TOLERANCE = "2%,64KiB"

# (what the figure is called, DeviceFigures field, budget name: the
# marker's keyword, MemorySpec's and DeviceResult's field)
BUDGETS = (
    ("peak", "peak", "max"),
    ("total peak", "peak_total", "max_total"),
    ("reserved peak", "reserved_peak", "max_reserved"),
)


class MemlabLeakWarning(UserWarning):
    """A measured test left tensors allocated after its teardown (the
    ``warn`` leak policy); the text names them and their holders."""


def exceeded(device: str, figures, spec) -> list[Exceeded]:
    """The budgets of spec that figures exceed (a budget holds at <=).
    max judges the own peak without what the test kept past its teardown
    (first use, leaks: see meters.Kept), or with it where the marker says
    include_first_use."""
    out = []
    if not figures.measured:
        return out
    for what, field, name in BUDGETS:
        budget = getattr(spec, name, None)
        value = getattr(figures, field)
        if field == "peak" and getattr(spec, "include_first_use", False) and figures.peak_with_kept is not None:
            value, what = figures.peak_with_kept, "peak with first use"
        if budget is not None and value is not None and value > budget:
            out.append(Exceeded(device, what, value, name, budget))
    # A phase's budget judges that phase's own peak, which leaves out what
    # the test kept, as max does (a child's figures carry none).
    phases = getattr(figures, "phase_peaks", None) or {}
    for name in PHASE_NAMES:
        budget = getattr(spec, name, None)
        if budget is not None and name in phases and phases[name][0] > budget:
            out.append(Exceeded(device, f"{name} peak", phases[name][0], name, budget))
    # A kind's budget judges its bytes at the own peak (the kinds add up to
    # it), where the test had phases to tell them
    kinds = resolve(figures) if getattr(spec, "kind_max", ()) else None
    if kinds:
        for key, budget in spec.kind_max:
            value = kinds.get(KIND_BUDGETS[key], 0)
            if value > budget:
                out.append(Exceeded(device, f"{KIND_WORDS[KIND_BUDGETS[key]]} at the peak", value, key, budget))
    return out


def has_budget(spec) -> bool:
    return (any(getattr(spec, name, None) is not None for _, _, name in BUDGETS) or has_phase_budget(spec)
            or bool(getattr(spec, "kind_max", ())) or getattr(spec, "spread", None) is not None)


def has_phase_budget(spec) -> bool:
    return any(getattr(spec, name, None) is not None for name in PHASE_NAMES)


def sort_suspects(confirmed: list, held_by: dict | None = None) -> tuple[list, list[Cache]]:
    """Leaks and caches among confirmed suspects ([(Suspect, Leak)]), by
    evidence across the session: a tensor held by a sequence's element (a
    list that tests append to grows with every test that does), by a
    frame, or by nothing memlab could name, is a leak, and its test is
    named; one held under a key (a dict filled on first use: the same keys
    serve later tests), an attribute or a closure's variable is kept once:
    a cache, reported once with the tests that filled it.  Returns
    ([(suspect, Leak)] of the leaks, [Cache]); held_by, where given, gets
    (node id, device) -> [(bytes, "BYTES held by HOLDER")] of each cache's
    tests."""
    leaks, caches = [], {}
    for suspect, leak in confirmed:
        if leak.bytes <= leak.allowed:
            continue
        held: dict = {}    # root -> bytes of its tensors
        for site in leak.sites:
            for t in site.tensors:
                root = _cache_root(t.holders[0] if t.holders else "")
                held[root] = held.get(root, 0) + t.bytes
        if not held or None in held:
            leaks.append((suspect, leak))
            continue
        first = next(iter(held))
        held[first] += leak.bytes - sum(held.values())   # what the tensors' graphs hold
        for root, n in held.items():
            if held_by is not None:
                held_by.setdefault((suspect.nodeid, leak.device), []).append((n, f"{format_size(n)} held by {root}"))
            cache = caches.setdefault((leak.device, root), Cache(leak.device, root))
            cache.bytes += n
            cache.tests.append(suspect.nodeid)
    return leaks, list(caches.values())


def _cache_root(path: str) -> str | None:
    """The holder's root when the path is a cache's, else None."""
    match = _ROOT.match(path)
    if match is None:
        return None
    rest = path[match.end():]
    if re.match(r"\[-?\d+\]", rest) and not path.startswith("test ") and not _keyed(match.group(1)):
        # a sequence's element: grows with each test that appends (a
        # parameter's list was built once, in the parametrize list)
        return None
    return match.group(1)


def _keyed(root: str) -> bool:
    """Whether a module global or a class attribute named by root is a
    dict now (an int key reads like a list's index: "_TABLES[6]")."""
    found = re.match(r"^module (\S+), global (\w+)$", root) or re.match(r"^class (\S+)\.(\w+), attribute (\w+)$", root)
    if found is None:
        return False
    if root.startswith("module "):
        holder = getattr(sys.modules.get(found.group(1)), found.group(2), None)
    else:
        owner = getattr(sys.modules.get(found.group(1)), found.group(2), None)
        holder = getattr(owner, found.group(3), None)
    return isinstance(holder, dict)


def compare(device: str, old: int, new: int, tolerance, path, process: str = "", phase: str = "") -> Change:
    """The own peak new against the baseline's old, under tolerance (of a
    rank of the test: process names it; of a phase's own peak: phase)."""
    return Change(device, old, new, tolerance.allowed(old), tolerance.text, str(path), process, phase)


def phase_changes(device: str, entry: dict, figures, tolerance, path, process: str = "") -> list[Change]:
    """Each phase's own peak (forward, backward, step) against the
    baseline entry's, where both have it: a hand-written table of MB per
    phase (per rank) kept as a baseline."""
    old = entry.get("phases") or {}
    new = getattr(figures, "phase_peaks", None) or {}
    return [compare(device, old[name], new[name][0], tolerance, path, process, name)
            for name in PHASE_NAMES if isinstance(old.get(name), int) and name in new]


class Verdicts:
    """Judges test runs (:class:`pytest_memlab.measuring.run.TestRun`)
    under the session's options and baseline."""

    def __init__(self, options, session):
        self.options = options
        self.session = session    # its baseline and environment name

    # -- leaks ------------------------------------------------------------------
    def leak_allowances(self, run) -> dict[str, int]:
        """device -> bytes allowed after teardown, for the devices whose
        leaks are checked; fills run.leak_policy."""
        allowed = {}
        unmeasured = run.measurement.unmeasured
        for spec, device in run.devices:
            if device in unmeasured:
                continue
            if spec.marked:
                if spec.leaks is None:
                    continue
                policy, limit = "fail", spec.leaks
            else:
                policy, limit = self.options.leaks, 0
                if policy == "off":
                    continue
            allowed[device] = limit
            run.leak_policy[device] = policy
        return allowed

    @staticmethod
    def _warn(text: str, run) -> None:
        """A MemlabLeakWarning; where the warnings filter makes it an error
        (filterwarnings = error), the test keeps its outcome and memlab's
        summary says plainly what was found (run.said)."""
        try:   # pointing at the test, not at memlab
            warnings.warn_explicit(MemlabLeakWarning(text), MemlabLeakWarning, run.location[0] or run.nodeid,
                                   run.location[1])
        except Warning:
            run.said = [*run.said, f"{run.nodeid}: {text.splitlines()[0]} (its MemlabLeakWarning was raised "
                        "as an error by the warnings filter)"]

    def _leak_findings(self, run, failures: list[str]) -> None:
        for device, kept in run.growth.items():
            if not kept or min(kept) <= 0:
                continue   # only what every repetition kept more of is a growing leak
            growth = Growth(device, tuple(kept))
            text = growth_report(device, kept)
            if run.leak_policy.get(device) == "fail" and not run.call_failed:
                run.failed[growth.key] = growth
                failures.append(text)
            else:
                run.warned = [*run.warned, growth.key]
                self._warn(text, run)
        for device, leak in run.leaks.items():
            text = leak_report(leak, self.options.top)
            if run.leak_policy.get(device) != "fail":
                run.warned = [*run.warned, leak.key]
                self._warn(text, run)
            elif not run.call_failed:
                run.failed[leak.key] = leak
                failures.append(text)
            else:   # the test keeps its own failure; the leak is told beside it
                run.failed[leak.key] = leak
                self._warn(f"{text}\n(the test had failed already)", run)

    # -- the verdict ------------------------------------------------------------
    def judge(self, run, report, final: bool) -> None:
        """Judges run at report (the call's, or with final teardown's):
        a failure fails a passing report, or is told beside the test's own
        failure; notes (an unmeasured device) go into its sections."""
        measurement = run.measurement
        if measurement is None or not (run.judged or run.leaks or run.growth):
            return   # an unmarked test, no baseline, nothing left behind: the common case
        failures, notes = [], []
        for spec, device in run.devices:
            if device in measurement.unmeasured:
                if final or not spec.marked:
                    continue
                reason = measurement.unmeasured[device]
                if not measurement.bridged:
                    # no torch bridge (no compiler, an unsupported torch): a
                    # marker that was never judged fails the session at its
                    # end unless --memlab-accept-unjudged (session.py)
                    run.unjudged = [*run.unjudged, f"{device}: {reason}"]
                if spec.kind == "cuda" and self.options.require_cuda:
                    failures.append(f"{device} not measured: {reason} (--memlab-require-cuda)")
                else:
                    notes.append(f"{device} not measured: {reason}")
                continue
            if not has_budget(spec):
                continue
            if has_phase_budget(spec) and measurement.trace_note and not final:
                notes.append(f"{device} phase budgets not judged: the phases are heard by the tracer, which was "
                             f"off ({measurement.trace_note})")
            figures = run.figures[device] if final else measurement.figures(device)
            by_walk = has_phase_budget(spec) or bool(spec.kind_max)
            if not final and by_walk:
                figures = run.figures_now(device)   # the phases' peaks and the kinds come from the kept walk
            if final and spec.kind_max and figures.measured and resolve(figures) is None:
                keys = ", ".join(f"{key}=" for key, _ in spec.kind_max)
                notes.append(f"{device} {keys} not judged: no kinds at the peak "
                             f"({kinds_note(figures)})")
            new = [e for e in exceeded(device, figures, spec) if e.key not in run.failed]
            if new and not final and not by_walk:
                # where the peak came from, and the peak without what the
                # test holds now that it may keep (what fails now fails at
                # the end too: it can only keep less)
                figures = run.figures_now(device)
                new = [e for e in exceeded(device, figures, spec) if e.key not in run.failed]
            for e in new:
                run.failed[e.key] = e
                if e.budget_name in PHASE_NAMES:
                    failures.append(phase_budget_failure(e, figures))
                    continue
                at_peak = e.what == "peak" or e.budget_name in KIND_BUDGETS
                context = measurement.context(device, figures.seq_at_peak) if at_peak else ""
                failures.append(budget_failure(e, figures, self.options.top, context))
        failures += self._compare(run, final)
        self._children_findings(run, failures)
        if final:
            self._leak_findings(run, failures)
        if failures and measurement.trace_note:
            failures.append(f"(line attribution: {measurement.trace_note})")
        if notes:
            report.sections.append(("memlab", "\n".join(notes)))
        if not failures:
            return
        text = "\n\n".join(failures)
        if report.passed and not hasattr(report, "wasxfail"):
            report.outcome = "failed"
            report.longrepr = text
        else:
            report.sections.append(("memlab", text))

    @staticmethod
    def _children_findings(run, failures: list[str]) -> None:
        """A budget applies to each child process of the test (each rank)
        as to the test's own process: on the same device, or for a CUDA
        budget, on the CUDA device where the child's own peak was highest
        (a rank's own GPU)."""
        if not run.children and not run.ranks:
            return
        processes = None
        for spec, device in run.devices:
            if not has_budget(spec):
                continue
            if spec.spread is not None:
                Verdicts._spread_finding(run, spec, device, failures)
            for child in run.children:
                figures = device_of(child.devices, device)
                if figures is None:
                    continue
                for e in exceeded(figures.device, figures, spec):
                    e = dataclasses.replace(e, process=child.label)
                    if e.key in run.failed:
                        continue
                    run.failed[e.key] = e
                    processes = processes or run.processes()
                    failures.append(child_budget_failure(e, child, processes))

    @staticmethod
    def _spread_finding(run, spec, device: str, failures: list[str]) -> None:
        """The spread between the ranks' own peaks, each rank on its own
        device (a budget on an uneven shard): over spread=, the test
        fails naming the highest and the lowest rank."""
        ranks = run.ranks or [c for c in run.children if c.rank is not None]
        placed = []
        for child in ranks:
            if child.state != "done":
                continue
            figures = device_of(child.devices, device)
            if figures is not None and figures.peak is not None:
                placed.append((child, figures.device))
        if len(placed) < 2:
            return
        placed.sort(key=lambda cd: cd[0].devices[cd[1]].peak)
        low, high = placed[0], placed[-1]
        spread = high[0].devices[high[1]].peak - low[0].devices[low[1]].peak
        kind = device.split(":")[0]
        e = Exceeded(kind, "spread between ranks", spread, "spread", spec.spread)
        if spread > spec.spread and e.key not in run.failed:
            run.failed[e.key] = e
            failures.append(spread_failure(kind, spread, spec.spread, high, low))

    def _compare(self, run, final: bool) -> list[str]:
        """The own peak against the baseline: a regression fails the test
        (at the call, or at teardown when teardown grew it); an
        improvement beyond the tolerance fails it at teardown only with
        --memlab-fail-on-improvement.  Nothing fails while updating."""
        baseline = self.session.baseline
        if baseline is None:
            return []
        options, measurement, failures = self.options, run.measurement, []
        for spec, device in run.devices:
            if device in measurement.unmeasured:
                continue
            if self.session.other_gpu(device):   # a baseline of another GPU kind: never a false regression
                run.not_compared |= {device}
                continue
            entry = baseline.entry(self.session.env, run.nodeid, run.names.get(device, device))
            if entry is None or entry.get("peak") is None:
                continue
            figures = run.figures[device] if final else measurement.figures(device)
            if not figures.measured or figures.peak is None:
                continue
            tolerance = spec.tolerance or options.tolerance
            change = compare(device, entry["peak"], figures.peak, tolerance, options.baseline)
            if not final and change.kind == "regressed":
                figures = run.figures_now(device)   # without what it may keep, as for budgets
                change = compare(device, entry["peak"], figures.peak, tolerance, options.baseline)
            run.changes[device] = change
            if options.update_baseline:
                continue
            if final and change.kind != "regressed" and change.key not in run.failed:
                # a phase that grew while the peak held (where the peak grew,
                # its one failure says each phase beside it)
                failures += self._phase_failures(run, phase_changes(device, entry, figures, tolerance,
                                                                    options.baseline), figures)
            if change.key in run.failed:
                continue
            if change.kind == "regressed" or (final and change.kind == "improved" and options.fail_on_improvement):
                run.failed[change.key] = change
                # an entry written before baselines kept sites says nothing of them
                changes = site_changes(entry["sites"], sites_at_peak(figures.attribution)) if "sites" in entry else []
                run.site_changes[device] = changes
                if not changes and entry.get("sites") and change.kind == "regressed":
                    changes = None   # the growth is below the lines kept: said so
                failures.append(baseline_failure(change, figures, options.top,
                                                 measurement.context(device, figures.seq_at_peak), changes,
                                                 entry.get("kinds"), entry.get("phases")))
        failures += self._compare_ranks(run, final)
        return failures

    def _phase_failures(self, run, changes: list[Change], figures) -> list[str]:
        """The phases that grew beyond the tolerance (shrank, with
        --memlab-fail-on-improvement): each fails the test once."""
        failures = []
        for change in changes:
            grew = change.kind == "regressed"
            if change.key in run.failed or not (grew or (change.kind == "improved" and self.options.fail_on_improvement)):
                continue
            run.failed[change.key] = change
            failures.append(baseline_failure(change, figures, self.options.top) if not grew
                            else phase_regression(change, figures))
        return failures

    def _compare_ranks(self, run, final: bool) -> list[str]:
        """Each rank (a child with a rank; under torchrun, every rank but
        the test's own) against its own baseline entry: a rank that grew
        fails the test, named."""
        baseline, options, failures = self.session.baseline, self.options, []
        for child in run.children:
            if child.rank is None or child.state != "done":
                continue
            for spec, device in run.devices:
                key = RANK_KEY.format(device=run.names.get(device, device), rank=child.rank)
                entry = baseline.entry(self.session.env, run.nodeid, key)
                figures = device_of(child.devices, device)
                if entry is None or entry.get("peak") is None or figures is None or figures.peak is None:
                    continue
                if self.session.other_gpu(figures.device, child.gpu_names.get(figures.device)):
                    run.not_compared |= {device}
                    continue
                tolerance = spec.tolerance or options.tolerance
                change = compare(figures.device, entry["peak"], figures.peak, tolerance, options.baseline, child.label)
                if options.update_baseline:
                    continue
                if change.key not in run.failed and (
                        change.kind == "regressed"
                        or (final and change.kind == "improved" and options.fail_on_improvement)):
                    run.failed[change.key] = change
                    text = baseline_failure(change, figures, options.top, old_phases=entry.get("phases"))
                    failures.append(f"{child.label} (pid {child.pid}): {text}")
                elif change.kind != "regressed":
                    # a rank's phases are whole once it ended (within the
                    # call); where its peak grew, its failure says them
                    failures += [f"{child.label} (pid {child.pid}): {text}" for text in self._phase_failures(
                        run, phase_changes(figures.device, entry, figures, tolerance, options.baseline,
                                           child.label), figures)]
        return failures
