"""The results model: what one test showed on each device, as the reports
read it, and its codec to and from a teardown report.

A report carries a test's figures in two parts.  Its ``user_properties``
carry each device's numbers and words, which ``--junitxml`` writes for CI
dashboards: ``memlab.DEVICE.KEY`` (``memlab.cuda:0.peak``) for figures and
budgets, ``memlab.failed_by_memlab`` (JSON list) for what memlab itself
failed the test for, ``memlab.warned`` (JSON list) for what it warned of
(leaks under ``warn``), ``memlab.memlab_error`` for trouble in memlab's own
machinery, ``memlab.said`` (JSON list) for findings whose
warning the warnings filter made an error, ``memlab.user_failed`` when the
test failed by its own doing (its figures then do not go into a baseline),
``memlab.DEVICE.name`` for the device as the test asked for it (the
baseline's key: ``cuda`` for the current CUDA device), ``memlab.DEVICE.gpu``
for the machine's GPU behind a narrowed ``CUDA_VISIBLE_DEVICES`` (a pinned
worker's ``cuda:0``), ``memlab.DEVICE.baseline`` for the comparison's
outcome (``regressed``, ``improved``, ``same``, ``new``, ``not compared``:
written on another GPU kind).  A device that kept nothing leaves out
``leaked``, ``kept``, ``first_use`` (0) and ``peak_with_kept`` (its
``peak``), and ``name`` where it is the device itself; decode restores them.

A device's lists and maps (its heaviest lines, phases, kinds and the note
on them, sites, fixtures, budgets by phase and kind, and the timeline a JSON
or HTML report shows) and the test's child processes and out-of-memory
explanations go where something reads them, and junit keeps none of them:
each property is an element junit holds to the session's end, and on a
large heap each brings the collector's next full collection nearer.  A
pytest-xdist worker sends them to the controller as one JSON text,
``report.memlab_details`` (``{"devices": {device: {key: value}},
"processes": [...], "out_of_memory": [...]}``, what is empty left out); a
serial run's session holds the result itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..figures import PHASE_NAMES, phase_bytes


PREFIX = "memlab."
_INT_KEYS = ("peak", "peak_total", "reserved_peak", "leaked", "max", "max_total", "max_reserved", "baseline_peak",
             "peak_with_kept", "kept", "first_use")
# a device's lists and maps: details(), never a property
_DETAIL_KEYS = ("top", "sites", "site_changes", "first_use_held", "phases", "phase_max", "kinds_note", "kind_max",
                "phase_kinds", "fixtures")
_STR_KEYS = ("reason", "name", "baseline", "gpu")


@dataclass(slots=True)
class DeviceResult:
    """One device's figures and budgets of one test."""

    device: str
    measured: bool = True
    reason: str = ""
    peak: int | None = None
    peak_total: int | None = None
    reserved_peak: int | None = None
    leaked: int | None = None        # the test's live bytes after its teardown
    peak_with_kept: int | None = None  # the own peak counting what it kept past teardown (peak leaves it out)
    kept: int | None = None          # bytes it kept past its teardown: first use and leaks
    # what it kept that is no leak, as the leak check told it: memory a
    # library or a cache keeps for the process, allocated by whichever test
    # needs it first (shown, never compared); None where no check told it
    first_use: int | None = None
    # (the sequences most tests leave empty are the empty tuple: see compact)
    first_use_held: list | tuple = ()   # that memory, named
    sites: list | tuple = ()   # heaviest lines at the peak (judging.site_changes)
    site_changes: list | tuple = ()   # against the baseline, where it regressed
    phases: dict = field(default_factory=dict)   # each phase's own peak: {"forward": bytes, ...}
    phase_max: dict = field(default_factory=dict)   # the marker's phase budgets, as phases
    kinds: dict | None = None        # bytes live at the peak by kind (a test with phases), else None
    kinds_note: str = ""             # where a report asked for the kinds and there are none: why
    kind_max: dict = field(default_factory=dict)   # the marker's kind budgets: {"activations": bytes}
    phase_kinds: dict = field(default_factory=dict)   # {"backward": kinds at that phase's peak}
    max: int | None = None
    max_total: int | None = None
    max_reserved: int | None = None
    top: list | tuple = ()  # heaviest lines: {file, line, function, bytes, peak_total}
    # the broader fixture instances the test needs, each with what its setup
    # held (measuring.broad_fixtures): what --memlab-pack counts per worker
    fixtures: dict | None = None
    name: str = ""                   # as the test asked for it: the baseline's key
    gpu: str = ""                    # the machine's GPU behind a narrowed CUDA_VISIBLE_DEVICES (devices.machine_gpu)
    baseline_peak: int | None = None
    baseline: str = ""               # "regressed", "improved", "same", "new", "not compared" or "" (no baseline)
    # What the JSON and HTML reports show besides (filled only when one is asked for):
    detail: dict | None = None       # timeline, marks, peak_at, peak_line, leak (see TestRun._detail)

    def baseline_entry(self) -> dict:
        """The figures a baseline file keeps for this device."""
        entry = {"peak": self.peak, "peak_total": self.peak_total,
                 "reserved_peak": self.reserved_peak, "leaked": self.leaked,
                 "first_use": self.first_use or 0, "sites": list(self.sites)}   # (compact's () is the file's [])
        if self.phases:   # shown, not compared
            entry["phases"] = dict(self.phases)
        if self.kinds:    # shown; a regression says which kind grew
            entry["kinds"] = dict(self.kinds)
        if self.fixtures:   # packing's, never compared
            entry["fixtures"] = dict(self.fixtures)
        return entry

    @classmethod
    def from_figures(cls, figures, spec=None, top: int = 5, sites: bool = False) -> "DeviceResult":
        """sites: with the heaviest lines at the peak (a baseline or a
        report keeps them; reading them costs each test a few tens of
        microseconds, so only then)."""
        if not figures.measured:
            result = cls(figures.device, False, figures.reason)
        else:
            result = cls(figures.device, True, figures.reason, peak=figures.peak, peak_total=figures.peak_total,
                         reserved_peak=figures.reserved_peak, leaked=figures.live,
                         peak_with_kept=figures.peak_with_kept, kept=figures.kept,
                         phases=phase_bytes(figures.phase_peaks) if figures.phase_peaks else {},
                         kinds=figures.kinds,
                         phase_kinds=dict(figures.phase_kinds) if figures.phase_kinds else {})
            if sites:   # a report or a baseline keeps them: made now (figures.resolve_kinds)
                from ..figures import kinds_note, resolve_kinds as resolve

                if resolve(figures) is None:
                    result.kinds_note = kinds_note(figures)
                result.kinds, result.phase_kinds = figures.kinds, dict(figures.phase_kinds)
                if figures.attribution is not None and figures.peak:
                    from ..judging.site_changes import sites_at_peak

                    result.sites = sites_at_peak(figures.attribution)
            lines = [ln for ln in figures.lines if ln.allocated > 0] if figures.lines else None
            if lines:
                lines.sort(key=_allocated, reverse=True)
                rows = result.top = []
                for ln in lines[:top]:
                    f = ln.frame
                    rows.append({"file": f.file, "line": f.line, "function": f.function, "bytes": ln.allocated,
                                 "peak_total": ln.peak_total})
        if spec is not None and spec.marked:
            result.max, result.max_total, result.max_reserved = spec.max, spec.max_total, spec.max_reserved
            result.phase_max = {name: getattr(spec, name) for name in PHASE_NAMES
                                if getattr(spec, name, None) is not None}
            result.kind_max = dict(getattr(spec, "kind_max", ()))
        return result


def _allocated(line) -> int:
    return line.allocated


_TEST_LISTS = ("failed_by_memlab", "warned", "said", "processes", "out_of_memory", "unjudged")
_DEVICE_LISTS = ("first_use_held", "sites", "site_changes", "top")


def compact(result: "TestResult") -> list:
    """The result made as the session keeps it to its end, in one pass:
    its empty lists replaced by the empty tuple, and its own containers
    returned (itself, its devices and their dict, the lists left), for the
    session to have the collector stop tracking them.  Each empty list is
    an object the collector walks at every full collection; nine empty
    ones a test, kept for a suite of ten thousand tests, made each full
    collection of a large heap about a fifth slower (kornia: 1.8 s over
    its run).  Each container refers only down to figures, names and the
    next of them, never back up, so none is ever in a reference cycle.
    What changes a kept result later assigns a new sequence
    (session._apply_late)."""
    out: list = [result, result.devices]
    _compact_lists(result, _TEST_LISTS, out)
    for device in result.devices.values():
        out.append(device)
        _compact_lists(device, _DEVICE_LISTS, out)
    return out


def _compact_lists(owner, names: tuple, out: list) -> None:
    """owner's empty lists among names made the empty tuple; the others added to out."""
    for name in names:
        value = getattr(owner, name)
        if value.__class__ is list:
            if value:
                out.append(value)
            else:
                setattr(owner, name, ())


@dataclass(slots=True)
class TestResult:
    """One test: its outcome and what each measured device showed."""

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: str = ""
    devices: dict[str, DeviceResult] = field(default_factory=dict)
    failed_by_memlab: list[str] | tuple = ()   # finding keys ("cpu max")
    warned: list[str] | tuple = ()             # finding keys ("cpu leaks")
    memlab_error: str = ""                                       # memlab's own trouble
    user_failed: bool = False                          # failed by its own doing, not by memlab
    said: list[str] | tuple = ()      # findings whose warning the filter made an error
    unjudged: list[str] | tuple = ()  # "device: why" of a marker memlab could not judge
    processes: list[dict] | tuple = ()  # its child processes (ChildFigures.as_dict())
    out_of_memory: list[dict] | tuple = ()  # each out-of-memory it met (Explanation.as_dict())

    @property
    def usable(self) -> bool:
        """Whether its figures may go into a baseline: the test ran and
        passed, or only memlab failed it (a budget, a leak, the baseline)."""
        return not self.user_failed and not self.memlab_error and self.outcome in ("passed", "failed", "error")


_KEYS: dict[str, tuple] = {}   # device -> its property names, made once


# What a device that kept nothing leaves out of its properties (decode
# restores them): most tests keep nothing, and each property is an element
# junit keeps to the session's end (on a large heap, objects the collector
# walks at every full collection, and that bring the next one nearer).
_KEPT_KEYS = ("leaked", "kept", "first_use", "peak_with_kept")


def _keys(device: str) -> tuple:
    keys = _KEYS.get(device)
    if keys is None:
        p = f"{PREFIX}{device}."
        ints = tuple((key, p + key) for key in _INT_KEYS)
        keys = _KEYS[device] = (p + "measured", p + "reason", p + "name", p + "baseline", p + "gpu", ints,
                                tuple((k, prop) for k, prop in ints if k not in _KEPT_KEYS))
    return keys


def encode(result: TestResult) -> list[tuple[str, object]]:
    """The test's properties: each device's numbers and words, and the
    test's verdicts (details() has the rest)."""
    props: list[tuple[str, object]] = []
    add = props.append
    for device, d in result.devices.items():
        measured, reason, name, baseline, gpu, ints, lean = _keys(device)
        if not d.measured:
            add((measured, "false"))
            add((reason, d.reason))
        if d.name and d.name != device:   # (decode: the device's own name where none is given)
            add((name, d.name))
        if d.baseline:
            add((baseline, d.baseline))
        if d.gpu:
            add((gpu, d.gpu))
        # Kept nothing past its teardown: leaked, kept and first_use 0,
        # peak_with_kept its peak (left out together: a measured device
        # always has its leaked figure, so their absence is never the
        # absence of figures)
        kept_nothing = (d.measured and d.peak is not None and d.leaked == 0 and d.kept == 0
                        and d.first_use == 0 and d.peak_with_kept == d.peak)
        for key, prop in (lean if kept_nothing else ints):
            value = getattr(d, key)
            if value is not None:
                add((prop, value))
    if result.failed_by_memlab:
        add((PREFIX + "failed_by_memlab", json.dumps(result.failed_by_memlab)))
    if result.warned:
        add((PREFIX + "warned", json.dumps(result.warned)))
    if result.memlab_error:
        add((PREFIX + "memlab_error", result.memlab_error))
    if result.user_failed:
        add((PREFIX + "user_failed", "true"))
    if result.said:
        add((PREFIX + "said", json.dumps(result.said)))
    if result.unjudged:
        add((PREFIX + "unjudged", json.dumps(result.unjudged)))
    return props


def details(result: TestResult) -> str:
    """A pytest-xdist worker's report's ``memlab_details``: each device's
    lists and maps that are not empty (kinds wherever they were made), the
    test's processes and out-of-memory explanations, as one JSON text (what
    the controller's reports read; one text, so that nothing in it can be a
    type that execnet does not send)."""
    devices = {}
    for device, d in result.devices.items():
        entry = {key: value for key in _DETAIL_KEYS if (value := getattr(d, key))}
        if d.kinds is not None:
            entry["kinds"] = d.kinds
        if d.detail is not None:
            entry["detail"] = d.detail
        if entry:
            devices[device] = entry
    out = {key: value for key, value in (("devices", devices), ("processes", result.processes),
                                          ("out_of_memory", result.out_of_memory)) if value}
    return json.dumps(out, separators=(",", ":")) if out else ""


def decode(nodeid: str, props, details: str = "") -> TestResult | None:
    """A test's result from its report's properties and, from a
    pytest-xdist worker, its details (details()); None if memlab did not
    measure it."""
    result = None
    for name, value in props:
        if not isinstance(name, str) or not name.startswith(PREFIX):
            continue
        result = result or TestResult(nodeid)
        rest = name[len(PREFIX):]
        if rest in _TEST_LISTS:
            setattr(result, rest, list(json.loads(value)))
            continue
        if rest == "memlab_error":
            result.memlab_error = str(value)
            continue
        if rest == "user_failed":
            result.user_failed = str(value) == "true"
            continue
        device, _, key = rest.rpartition(".")
        if not device:   # another plugin's memlab.NAME (--memlab-pack's memlab.rerun): no device's
            continue
        dev = result.devices.setdefault(device, DeviceResult(device))
        if key == "measured":
            dev.measured = str(value) != "false"
        elif key in _STR_KEYS:
            setattr(dev, key, str(value))
        elif key in _INT_KEYS:
            setattr(dev, key, int(value))
    if result is not None:
        for device, dev in result.devices.items():
            dev.name = dev.name or device
            if (dev.measured and dev.peak is not None and dev.leaked is None and dev.kept is None
                    and dev.first_use is None and dev.peak_with_kept is None):   # kept nothing (encode)
                dev.leaked, dev.kept, dev.first_use, dev.peak_with_kept = 0, 0, 0, dev.peak
        if details:
            sent = json.loads(details)
            for device, entry in sent.get("devices", {}).items():
                dev = result.devices.setdefault(device, DeviceResult(device, name=device))
                for key, value in entry.items():
                    setattr(dev, key, value)
            result.processes = sent.get("processes", ())
            result.out_of_memory = sent.get("out_of_memory", ())
    return result
