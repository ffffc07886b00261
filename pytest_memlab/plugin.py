"""pytest-memlab's pytest plugin: options, markers, per-test bracketing and
verdicts.

A measured test runs through :meth:`MemlabPlugin.pytest_runtest_protocol`,
which opens the measurement before setup and closes it after teardown, so
that function-scoped fixtures count, then judges the figures and only then
logs the reports: a budget failure fails the test's call phase, as a failed
assertion would, instead of surfacing as an error at teardown.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import pytest
from _pytest.runner import runtestprotocol

from .attribution import tracing
from .markers import MARKERS, MarkerError, MemorySpec, specs_for
from .measure import DeviceFigures, Measurement, budget_failure, make_meter
from .sizes import format_size

SPECS = pytest.StashKey[list]()
MEASUREMENT = pytest.StashKey[Measurement]()
REPORT_KINDS = ("term",)


def _report_spec(value: str) -> tuple[str, ...]:
    """Checks --memlab-report at parse time."""
    parts = tuple(p.strip() for p in value.split(",") if p.strip()) or ("term",)
    for part in parts:
        kind = part.split(":", 1)[0]
        if kind in ("json", "html"):
            raise argparse.ArgumentTypeError(
                f"{part!r}: the {kind} report is not available in this version of pytest-memlab (use 'term')"
            )
        if part not in REPORT_KINDS:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a report (expected a comma list of: term); "
                "write --memlab-report=SPEC so that a path after it is not taken for SPEC"
            )
    return parts


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return n


def pytest_addoption(parser):
    group = parser.getgroup("memlab", "memory budgets and measurement (pytest-memlab)")
    group.addoption(
        "--memlab", action="store_true", default=None,
        help="measure every test, marked or not (ini: memlab)",
    )
    group.addoption(
        "--memlab-report", nargs="?", const=("term",), default=None, type=_report_spec, metavar="SPEC",
        help="report the measured tests; implies --memlab. SPEC: 'term' (default) (ini: memlab_report)",
    )
    group.addoption(
        "--memlab-require-cuda", action="store_true", default=None,
        help="a cuda_memory test that cannot be measured (no CUDA) fails (ini: memlab_require_cuda)",
    )
    group.addoption(
        "--memlab-top", type=_positive_int, default=None, metavar="N",
        help="lines and tensors shown per test in failures and reports (default 5) (ini: memlab_top)",
    )
    group.addoption(
        "--memlab-include", action="append", default=None, metavar="GLOB",
        help="files whose lines get attributed (repeatable; default: files under rootdir outside "
             "site-packages and the stdlib) (ini: memlab_include)",
    )
    parser.addini("memlab", type="bool", default=False, help="measure every test, marked or not")
    parser.addini("memlab_top", default="5", help="as --memlab-top")
    parser.addini("memlab_include", type="linelist", default=[], help="as --memlab-include")
    parser.addini("memlab_report", default="", help="report spec, as --memlab-report")
    parser.addini("memlab_require_cuda", type="bool", default=False, help="as --memlab-require-cuda")


def pytest_configure(config):
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    config.pluginmanager.register(MemlabPlugin(config), "memlab-manager")


def _option(config, name: str, ini: str):
    value = config.getoption(name)
    return config.getini(ini) if value is None else value


@dataclass
class DeviceResult:
    """One device's figures and budgets of one test, as the reports show it."""

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


@dataclass
class TestResult:
    nodeid: str
    outcome: str = ""
    devices: dict[str, DeviceResult] = field(default_factory=dict)


def _properties(device: str, figures: DeviceFigures, spec: MemorySpec | None) -> list[tuple[str, object]]:
    props = figures.as_properties()
    if not figures.measured:
        props.append((f"memlab.{device}.reason", figures.reason))
    if spec is not None:
        for key in ("max", "max_total", "max_reserved"):
            if getattr(spec, key) is not None:
                props.append((f"memlab.{device}.{key}", getattr(spec, key)))
    return props


def _result_from_properties(nodeid: str, props) -> TestResult | None:
    """Rebuilds a test's figures from its report (also under xdist, where the
    controller only sees the reports)."""
    result = None
    for name, value in props:
        if not isinstance(name, str) or not name.startswith("memlab."):
            continue
        device, _, key = name[len("memlab."):].rpartition(".")
        result = result or TestResult(nodeid)
        dev = result.devices.setdefault(device, DeviceResult(device))
        if key == "top":
            dev.top = json.loads(value)
        elif key == "measured":
            dev.measured = False
        elif key == "reason":
            dev.reason = str(value)
        elif key == "leaked":
            dev.leaked = int(value)
        elif hasattr(dev, key):
            setattr(dev, key, int(value))
    return result


class MemlabPlugin:
    """The manager: its methods are the hooks."""

    def __init__(self, config):
        self.config = config
        report = _option(config, "memlab_report", "memlab_report")
        if isinstance(report, str):
            try:
                report = _report_spec(report) if report.strip() else None
            except argparse.ArgumentTypeError as exc:
                raise pytest.UsageError(f"ini memlab_report: {exc}") from None
        self.report = report
        self.measure_all = bool(_option(config, "memlab", "memlab")) or bool(report)
        self.require_cuda = bool(_option(config, "memlab_require_cuda", "memlab_require_cuda"))
        top = _option(config, "memlab_top", "memlab_top")
        try:
            self.top = _positive_int(str(top))
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"ini memlab_top: {exc}") from None
        include = config.getoption("memlab_include") or config.getini("memlab_include")
        tracing.scope.configure(config.rootpath, tuple(include))
        self.trace_notes: set[str] = set()
        self.current: Measurement | None = None
        self.results: dict[str, TestResult] = {}
        self.backend = ""

    # -- collection -----------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        errors = []
        for item in items:
            try:
                specs = specs_for(item)
            except MarkerError as exc:
                errors.append(f"{item.nodeid}: {exc}")
                continue
            if not specs and (self.measure_all or "memlab" in getattr(item, "fixturenames", ())):
                specs = [MemorySpec(kind="auto", device=None, leaks=None, marked=False)]
            if specs:
                item.stash[SPECS] = specs
        if errors:
            raise pytest.UsageError("pytest-memlab: bad memory marker\n  " + "\n  ".join(errors))

    # -- running --------------------------------------------------------------
    @staticmethod
    def _requested(core, spec: MemorySpec) -> str:
        """The device a spec asks for; an unmarked test measured because of
        --memlab or the fixture measures CUDA where there is CUDA, else the CPU."""
        if spec.kind != "auto":
            return spec.device
        cuda_ok = core.torch is not None and core.torch.cuda.is_available()
        return "cuda" if cuda_ok else "cpu"

    def _start(self, specs):
        from ._core import core

        c = core()
        self.backend = f"{c.name}: {c.reason}"
        devices = list(dict.fromkeys(self._requested(c, spec) for spec in specs))
        measurement = Measurement(c, devices)
        measurement.begin()
        return measurement

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        specs = item.stash.get(SPECS, None)
        if not specs:
            return None
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        problems = []
        measurement = None
        try:
            measurement = self._start(specs)
        except Exception as exc:  # never crash the session: fail this test
            problems.append(f"pytest-memlab could not measure this test: {type(exc).__name__}: {exc}")
        if measurement is not None:
            item.stash[MEASUREMENT] = measurement
        self.current = measurement
        figures = {}
        try:
            reports = runtestprotocol(item, nextitem=nextitem, log=False)
        finally:
            self.current = None
            if measurement is not None:
                try:
                    figures = measurement.end()
                except Exception as exc:
                    figures = measurement.final or {}
                    problems.append(f"pytest-memlab lost part of this test's measurement: {type(exc).__name__}: {exc}")
        self._judge(item, specs, measurement, figures, reports, problems)
        for report in reports:
            ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _judge(self, item, specs, measurement, figures, reports, problems):
        failures = list(problems)
        notes = []
        props = []
        for spec in specs:
            if measurement is None:
                break
            device = measurement.resolved[self._requested(measurement.core, spec)]
            fig = figures.get(device)
            if fig is None:
                continue
            props += _properties(device, fig, spec if spec.marked else None)
            if fig.lines:  # the per-line table, for reports (also under xdist)
                top = sorted((ln for ln in fig.lines if ln.allocated > 0), key=lambda ln: -ln.allocated)
                props.append((f"memlab.{device}.top", json.dumps(
                    [{**ln.frame.as_dict(), "bytes": ln.allocated, "peak_total": ln.peak_total}
                     for ln in top[:self.top]])))
            if not fig.measured:
                if spec.kind == "cuda" and spec.marked and self.require_cuda:
                    failures.append(f"{device} not measured: {fig.reason} (--memlab-require-cuda)")
                elif spec.marked:
                    notes.append(f"{device} not measured: {fig.reason}")
                continue
            checks = (("peak", fig.peak, "max", spec.max),
                      ("total peak", fig.peak_total, "max_total", spec.max_total),
                      ("reserved peak", fig.reserved_peak, "max_reserved", spec.max_reserved))
            for what, value, name, budget in checks:
                if budget is not None and value is not None and value > budget:
                    failures.append(budget_failure(device, what, value, name, budget, fig, self.top))
        if measurement is not None and measurement.trace_note:
            self.trace_notes.add(measurement.trace_note)
            if failures:
                failures.append(f"(line attribution: {measurement.trace_note})")
        call = next((r for r in reports if r.when == "call"), None)
        for report in reports:
            if report.when in ("call", "teardown"):
                report.user_properties.extend(props)
        if call is None:
            return
        text = "\n\n".join(failures)
        if notes:
            call.sections.append(("memlab", "\n".join(notes)))
        if not failures:
            return
        if call.passed and not hasattr(call, "wasxfail"):
            call.outcome = "failed"
            call.longrepr = text
        else:
            call.sections.append(("memlab", text))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        """Broader-scoped fixtures set up during a measured test are measured
        apart (detached scopes): what they keep alive is not the test's."""
        measurement = self.current
        if measurement is None or fixturedef.scope == "function" or measurement.core.name != "bridge":
            yield
            return
        meters = [make_meter(measurement.core, device, detached=True) for device in measurement.meters]
        started = []
        try:
            for meter in meters:
                meter.begin()
                started.append(meter)
            yield
        finally:
            for meter in reversed(started):
                meter.end()

    # -- reporting ------------------------------------------------------------
    def pytest_runtest_logreport(self, report):
        """Figures come with the call report, or with teardown's when there
        was no call (setup failed): the test then counts as an error."""
        if report.when == "setup":
            return
        result = self.results.get(report.nodeid)
        if result is None:
            result = _result_from_properties(report.nodeid, report.user_properties)
            if result is None:
                return
            result.outcome = "error"
            self.results[report.nodeid] = result
        if report.when == "call":
            result.outcome = report.outcome

    def pytest_terminal_summary(self, terminalreporter):
        if not self.results:
            return
        tr = terminalreporter
        tr.section("memlab")
        rows = [(r, d) for r in self.results.values() for d in r.devices.values()]
        measured = [(r, d) for r, d in rows if d.measured]
        over = sum(1 for r in self.results.values() if r.outcome == "failed")
        unmeasured = [(r, d) for r, d in rows if not d.measured]
        summary = f"{len(self.results)} tests measured"
        if self.backend:
            summary += f" (backend {self.backend})"
        tr.write_line(summary)
        for note in sorted(self.trace_notes):
            tr.write_line(f"line attribution off: {note}")
        by_reason: dict[str, list[str]] = {}
        for r, d in unmeasured:
            by_reason.setdefault(f"{d.device}: {d.reason}", []).append(r.nodeid)
        for reason, nodeids in by_reason.items():
            if len(nodeids) <= 3:
                for nodeid in nodeids:
                    tr.write_line(f"not measured: {nodeid} {reason}")
            else:
                tr.write_line(f"not measured: {len(nodeids)} tests ({nodeids[0]}, ...) {reason}")
        if not self.report or "term" not in self.report:
            if over:
                tr.write_line(f"{over} measured tests failed; see above")
            return
        measured.sort(key=lambda rd: -(rd[1].peak or 0))
        header = ("test", "device", "own peak", "total peak", "reserved peak", "budget", "use", "leaked")
        table = [header]
        for r, d in measured:
            budget = d.max
            use = f"{100 * d.peak / budget:.0f}%" if budget and d.peak is not None else ("-" if budget is None else "inf")
            table.append((
                r.nodeid, d.device, format_size(d.peak), format_size(d.peak_total),
                format_size(d.reserved_peak) if d.reserved_peak is not None else "-",
                format_size(budget) if budget is not None else "-", use, format_size(d.leaked),
            ))
        widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
        for n, row in enumerate(table):
            cells = [str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
            tr.write_line("  ".join(cells).rstrip(), bold=(n == 0))


@pytest.fixture
def memlab(request) -> Measurement:
    """The running test's memory measurement: ``peak``, ``live``,
    ``total``, ``mark(label)``, ``limit(size)``, ``figures(device)``."""
    measurement = request.node.stash.get(MEASUREMENT, None)
    if measurement is None:
        pytest.fail("pytest-memlab is not measuring this test (see the failure above for why)", pytrace=False)
    return measurement
