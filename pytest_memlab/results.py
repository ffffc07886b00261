"""The results model: what one test showed on each device, as the reports
read it, and its one codec to and from a report's ``user_properties``.

The properties are how figures travel: into ``--junitxml`` for CI
dashboards, and from pytest-xdist workers to the controller, which sees only
the reports.  Names: ``memlab.DEVICE.KEY`` (``memlab.cuda:0.peak``) for
figures and budgets, ``memlab.DEVICE.top`` (JSON) for the heaviest lines,
``memlab.failed`` (JSON list) for what memlab itself failed the test for,
``memlab.warned`` (JSON list) for what it warned of (leaks under ``warn``),
``memlab.error`` for trouble in memlab's own machinery.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

PREFIX = "memlab."
_INT_KEYS = ("peak", "peak_total", "reserved_peak", "leaked", "max", "max_total", "max_reserved")


@dataclass
class DeviceResult:
    """One device's figures and budgets of one test."""

    device: str
    measured: bool = True
    reason: str = ""
    peak: int | None = None
    peak_total: int | None = None
    reserved_peak: int | None = None
    leaked: int | None = None
    max: int | None = None
    max_total: int | None = None
    max_reserved: int | None = None
    top: list = field(default_factory=list)  # heaviest lines: {file, line, function, bytes, peak_total}

    @classmethod
    def from_figures(cls, figures, spec=None, top: int = 5) -> "DeviceResult":
        result = cls(figures.device, figures.measured, figures.reason)
        if figures.measured:
            result.peak = figures.peak
            result.peak_total = figures.peak_total
            result.reserved_peak = figures.reserved_peak
            result.leaked = figures.live
            heaviest = sorted((ln for ln in figures.lines if ln.allocated > 0), key=lambda ln: -ln.allocated)
            result.top = [{**ln.frame.as_dict(), "bytes": ln.allocated, "peak_total": ln.peak_total}
                          for ln in heaviest[:top]]
        if spec is not None and spec.marked:
            result.max, result.max_total, result.max_reserved = spec.max, spec.max_total, spec.max_reserved
        return result


@dataclass
class TestResult:
    """One test: its outcome and what each measured device showed."""

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: str = ""
    devices: dict[str, DeviceResult] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)   # what memlab failed it for ("cpu max")
    warned: list[str] = field(default_factory=list)   # what memlab warned of ("cpu leaks")
    error: str = ""                                    # memlab's own trouble


def encode(result: TestResult) -> list[tuple[str, object]]:
    props: list[tuple[str, object]] = []
    for device, d in result.devices.items():
        p = f"{PREFIX}{device}."
        if not d.measured:
            props += [(p + "measured", "false"), (p + "reason", d.reason)]
        for key in _INT_KEYS:
            value = getattr(d, key)
            if value is not None:
                props.append((p + key, value))
        if d.top:
            props.append((p + "top", json.dumps(d.top)))
    if result.failed:
        props.append((PREFIX + "failed", json.dumps(result.failed)))
    if result.warned:
        props.append((PREFIX + "warned", json.dumps(result.warned)))
    if result.error:
        props.append((PREFIX + "error", result.error))
    return props


def decode(nodeid: str, props) -> TestResult | None:
    """A test's result from its report's properties; None if memlab did not
    measure it."""
    result = None
    for name, value in props:
        if not isinstance(name, str) or not name.startswith(PREFIX):
            continue
        result = result or TestResult(nodeid)
        rest = name[len(PREFIX):]
        if rest in ("failed", "warned"):
            setattr(result, rest, list(json.loads(value)))
            continue
        if rest == "error":
            result.error = str(value)
            continue
        device, _, key = rest.rpartition(".")
        dev = result.devices.setdefault(device, DeviceResult(device))
        if key == "top":
            dev.top = json.loads(value)
        elif key == "measured":
            dev.measured = str(value) != "false"
        elif key == "reason":
            dev.reason = str(value)
        elif key in _INT_KEYS:
            setattr(dev, key, int(value))
    return result
