"""pytest-memlab's pytest plugin: the hooks, and only the hooks.

A measured test is measured from the start of its setup to the end of its
teardown (function-scoped fixtures count) through hook wrappers, so that
plugins that run the test protocol themselves (pytest-rerunfailures, and
whoever else) keep doing so: each run of the protocol is one measurement.
Budgets are judged when the call's report is made, on the figures of setup
and call, so that an exceeded budget fails the call as a failed assertion
would; what only teardown pushes over a budget fails teardown.  The final
figures ride on the teardown report's ``user_properties`` (junit, xdist).

memlab's own trouble never fails a user's test: the test runs unmeasured and
the summary says why (``MEMLAB_CORE=bridge`` asks for the opposite: a
missing bridge is then an error of the test's setup, naming memlab).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import warnings
from dataclasses import dataclass, field

import pytest

from ._core import BRIDGE, MemlabCoreError, core
from . import html_report, json_report
from .baseline import Baseline, BaselineError, compare, environment_differences, environment_info, stale_entries, update
from .devices import cuda_available, default_device
from .markers import MARKERS, MarkerError, MemorySpec, specs_for
from .measure import Measurement, make_meter, unpark
from .options import Options, add_options
from .results import DeviceResult, TestResult, decode, encode
from .text import baseline_failure, baseline_summary, budget_failure, growth_report, leak_report, summary
from .tracing import tracing
from .verdict import exceeded, has_budget

SPECS = pytest.StashKey[list]()


class MemlabLeakWarning(UserWarning):
    """A measured test left tensors allocated after its teardown (the
    ``warn`` leak policy); the text names them and their holders."""



def pytest_addoption(parser):
    add_options(parser)


# --memlab-gpus-per-worker: the controller lists the GPUs in this variable
# before xdist starts its workers, which inherit it; each worker picks its
# own and sets CUDA_VISIBLE_DEVICES before any conftest can start CUDA.
GPUS_VARIABLE = "PYTEST_MEMLAB_WORKER_GPUS"


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    plan = os.environ.get(GPUS_VARIABLE)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not plan or not worker.startswith("gw"):
        return
    try:
        plan = json.loads(plan)
        gpus, per, index = plan["gpus"], int(plan["per"]), int(worker[2:])
    except (ValueError, KeyError, TypeError):
        return
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[(index * per + k) % len(gpus)] for k in range(per))


def pytest_configure(config):
    # `pytest --memlab-report tests/`: the path argparse gave the option
    # is a path to test (options.ReportAction)
    paths = getattr(config.option, "memlab_report_paths", None)
    if paths:
        if config.args_source == pytest.Config.ArgsSource.ARGS:
            config.args.extend(p for p in paths if p not in config.args)
        else:   # no path was given but this one: not the invocation folder, not testpaths
            config.args[:] = list(paths)
            config.args_source = pytest.Config.ArgsSource.ARGS
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    config.pluginmanager.register(MemlabPlugin(config), "memlab-manager")


def _gpu_plan(config, per: int) -> str:
    """Under pytest-xdist, on the controller: the GPUs the workers share
    out (the controller runs no test, so asking torch here changes no
    test's process).  Returns a note for the summary."""
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist") \
            or not config.getoption("numprocesses", None):
        return "--memlab-gpus-per-worker works under pytest-xdist (-n N) only; this run has no workers"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [g.strip() for g in visible.split(",") if g.strip()]
    else:
        try:
            import torch

            gpus = [str(i) for i in range(torch.cuda.device_count())]
        except Exception:
            gpus = []
    if not gpus:
        return "--memlab-gpus-per-worker: no GPUs to share out; the workers run as they are"
    os.environ[GPUS_VARIABLE] = json.dumps({"gpus": gpus, "per": per})
    return ""


@dataclass(slots=True)
class Running:
    """One run of one test's protocol, while memlab measures it."""

    specs: list
    nodeid: str = ""
    measurement: Measurement | None = None
    devices: list = field(default_factory=list)   # (spec, concrete device)
    fixtures: int = 0                     # fixtures set up while measuring
    figures: dict | None = None           # final, after teardown
    failed: dict = field(default_factory=dict)   # Exceeded.key -> Exceeded
    leaks: dict = field(default_factory=dict)    # device -> Leak (after teardown)
    leak_policy: dict = field(default_factory=dict)  # device -> "fail" or "warn"
    warned: list = field(default_factory=list)
    call_failed: bool = False
    user_failed: bool = False            # setup, call or teardown failed by the test's own doing
    names: dict = field(default_factory=dict)     # concrete device -> name as asked ("cuda", "cpu")
    changes: dict = field(default_factory=dict)   # device -> baseline.Change
    repeating: bool = False
    judged: bool = False                  # anything to judge before teardown: budgets, notes, a baseline
    growth: dict = field(default_factory=dict)   # device -> bytes kept by each repetition
    error: str = ""                       # memlab's own trouble


class MemlabPlugin:
    """The manager: its methods are the hooks."""

    def __init__(self, config):
        self.config = config
        self.options = Options.from_config(config)
        self.detail = self.options.detail     # timelines and marks for a JSON or HTML report
        self._running: tuple | None = None    # (item, Running) of the test being measured
        tracing.scope.configure(config.rootpath, self.options.include)
        self.trace_notes: set[str] = set()
        self.current: Measurement | None = None
        self.results: dict[str, TestResult] = {}
        self._outcomes: dict[str, str] = {}
        self._made: dict[str, TestResult] = {}
        self.backend = ""
        self._worker = hasattr(config, "workerinput")
        self.notes: list[str] = []
        if self.options.gpus_per_worker:
            note = _gpu_plan(config, self.options.gpus_per_worker)
            if note:
                self.notes.append(note)
        self.baseline: Baseline | None = self._load_baseline()
        self.env: str | None = self.options.baseline_env
        self.collected: set[str] = set()
        self.workers: dict[str, dict] = {}    # xdist worker id -> what it sent at its end
        self.baseline_lines: list[tuple[str, bool]] = []
        self.write_failed = False

    def _load_baseline(self) -> Baseline | None:
        path = self.options.baseline
        if path is None:
            return None
        try:
            return Baseline.load(path)
        except FileNotFoundError:
            if self.options.update_baseline:
                return Baseline(path)
            raise pytest.UsageError(
                f"pytest-memlab: the baseline {path} does not exist. Write it first from a run whose "
                f"figures are right: pytest --memlab-baseline={path} --memlab-update-baseline") from None
        except BaselineError as exc:
            raise pytest.UsageError(f"pytest-memlab: {exc}") from None

    def _env_name(self, core) -> str:
        if self.env is None:
            self.env = "cuda" if cuda_available(core) else "cpu"
        return self.env

    # -- collection -----------------------------------------------------------
    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(self, collector):
        """A bad marker is a collection error of its module that names the
        test and the value: the same with and without pytest-xdist.  (Only
        checked here; the specs are read in pytest_collection_modifyitems,
        after hooks that add markers.)"""
        outcome = yield
        report = outcome.get_result()
        if not report.passed:
            return
        errors = []
        for node in report.result:
            if isinstance(node, pytest.Item):
                try:
                    specs_for(node)
                except MarkerError as exc:
                    errors.append(f"{node.nodeid}: {exc}")
        if errors:
            report.outcome = "failed"
            report.longrepr = "pytest-memlab: bad memory marker\n  " + "\n  ".join(errors)
            report.result = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        """Markers that hooks added after collection are read here."""
        errors = []
        for item in items:
            try:
                specs = specs_for(item)
            except MarkerError as exc:
                errors.append(f"{item.nodeid}: {exc}")
                continue
            if not specs and (self.options.measure_all or "memlab" in getattr(item, "fixturenames", ())):
                specs = [MemorySpec(kind="auto", device=None, leaks=None, marked=False)]
            item.stash[SPECS] = specs
        if errors:
            raise pytest.UsageError("pytest-memlab: bad memory marker\n  " + "\n  ".join(errors))

    # -- measuring ------------------------------------------------------------
    def running(self, item) -> Running | None:
        """The Running of item's protocol, while memlab measures it (one
        test at a time per process; an attribute, not the item's stash:
        several hooks ask for it in every test)."""
        current = self._running
        return current[1] if current is not None and current[0] is item else None

    @staticmethod
    def _requested(core, spec: MemorySpec) -> str:
        return default_device(core) if spec.kind == "auto" else spec.device

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item):
        specs = item.stash.get(SPECS, None)
        if specs:
            required = self._begin(item, specs)
        else:  # a test memlab does not measure runs with nothing of memlab's on
            required = None
            unpark()
        result = yield
        if required:  # after the inner wrappers, which must finish their setup
            pytest.fail(required, pytrace=False)
        return result

    def _begin(self, item, specs) -> str | None:
        """Opens the measurement; returns a failure to raise when a backend
        that MEMLAB_CORE required is missing."""
        running = Running(specs, nodeid=item.nodeid)
        self._running = (item, running)
        try:
            c = core()
            if not self.backend:
                self.backend = f"{c.name}: {c.reason}"
            requested = [self._requested(c, spec) for spec in specs]
            measurement = Measurement(c, list(dict.fromkeys(requested)), park=True, timeline=True,
                                      log=self.options.snapshot is not None)
            measurement.detail = self.detail
            resolved = measurement.resolved
            running.devices = [(spec, resolved[r]) for spec, r in zip(specs, requested)]
            running.names = {resolved[r]: r for r in requested}
            running.judged = self.baseline is not None or any(spec.marked for spec in specs)
            if self.baseline is not None:
                self._env_name(c)
            measurement.begin()
        except MemlabCoreError as exc:  # MEMLAB_CORE=bridge asked for this
            running.error = str(exc)
            return f"pytest-memlab: {exc}"
        except Exception as exc:
            running.error = f"{type(exc).__name__}: {exc}"
            return None
        running.measurement = self.current = measurement
        return None

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(self, fixturedef, request):
        """Fixture code is user code (a trace window); broader-scoped
        fixtures set up during a measured test are measured apart (detached
        scopes): what they keep alive is not the test's."""
        measurement = self.current
        if measurement is None:
            return (yield)
        running = self.running(request.node)
        if running is not None:
            running.fixtures += 1
        meters = []
        if fixturedef.scope != "function" and measurement.core.name == BRIDGE:
            meters = [make_meter(measurement.core, device, detached=True) for device in measurement.meters]
        started = []
        try:
            for meter in meters:
                meter.begin()
                started.append(meter)
            with measurement.window():
                return (yield)
        finally:
            for meter in reversed(started):
                meter.end()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        running = self.running(pyfuncitem)
        if running is None or running.measurement is None or running.repeating:
            return (yield)
        with running.measurement.window():
            result = yield
        if self.options.leak_repeat:
            self._repeat(pyfuncitem, running)
        return result

    def _repeat(self, item, running: Running) -> None:
        """--memlab-leak-repeat: the call again, N times, in the same
        measurement; what each repetition keeps (after a collection) is
        what grows per run."""
        measurement = running.measurement
        checked = [d for d in self._leak_allowances(running) if hasattr(measurement.meters.get(d), "own_live")]
        if not checked:
            return
        gc.collect()
        before = {d: measurement.meters[d].own_live() for d in checked}
        running.growth = {d: [] for d in checked}
        running.repeating = True
        try:
            for _ in range(self.options.leak_repeat):
                with measurement.window():
                    item.ihook.pytest_pyfunc_call(pyfuncitem=item)
                gc.collect()
                for d in checked:
                    now = measurement.meters[d].own_live()
                    running.growth[d].append(now - before[d])
                    before[d] = now
        finally:
            running.repeating = False

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item, nextitem):
        running = self.running(item)
        if running is None or running.measurement is None:
            return (yield)
        try:
            if running.fixtures:  # only fixture finalizers run user code here
                with running.measurement.window():
                    return (yield)
            return (yield)
        finally:
            self._end(item, running)

    def _leak_allowances(self, running: Running) -> dict[str, int]:
        """device -> bytes allowed after teardown, for the devices whose
        leaks are checked; fills running.leak_policy."""
        allowed = {}
        for spec, device in running.devices:
            if device in running.measurement.unmeasured:
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
            running.leak_policy[device] = policy
        return allowed

    def _end(self, item, running: Running) -> None:
        measurement = running.measurement
        self.current = None
        try:
            allowed = self._leak_allowances(running)
            if allowed:
                running.leaks = measurement.check_leaks(allowed, self.options.top, item)
        except Exception as exc:  # memlab's trouble, never the test's
            running.error = f"the leak check failed: {type(exc).__name__}: {exc}"
        try:
            running.figures = measurement.end()
        except Exception as exc:
            running.figures = measurement.final or {}
            running.error = f"lost part of this test's measurement: {type(exc).__name__}: {exc}"
        if measurement.trace_note:
            self.trace_notes.add(measurement.trace_note)
        if self.options.snapshot is not None:
            self._snapshot(item, running)

    def _snapshot(self, item, running: Running) -> None:
        from . import snapshot

        for device, figures in (running.figures or {}).items():
            if figures.alloc_log is None:
                continue
            entries, dropped = figures.alloc_log
            figures.alloc_log = None   # written once; the item lives on
            try:
                snapshot.write(self.options.snapshot, item.nodeid, device, entries, dropped)
            except Exception as exc:   # memlab's trouble, never the test's
                running.error = running.error or f"the snapshot was not written: {type(exc).__name__}: {exc}"

    # -- verdicts ---------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        running = self.running(item)
        if running is None:
            return report
        failed = report.outcome == "failed"
        if failed:
            running.user_failed = True   # memlab has not judged yet: this failure is the test's
        when = call.when
        if when == "setup":
            return report
        if when == "call" and (failed or call.excinfo is not None):
            running.call_failed = True
        try:
            self._judge(running, report, final=when == "teardown")
        except Exception as exc:  # memlab's trouble, never the test's
            running.error = running.error or f"judging failed: {type(exc).__name__}: {exc}"
        if when == "teardown":
            result = self._result(running.nodeid, running)
            report.user_properties.extend(encode(result))
            self._made[running.nodeid] = result  # this process's own, spared decoding
            # Keeping every test's measurement would grow what the garbage
            # collector walks.
            self._running = None
        return report

    def _judge(self, running: Running, report, final: bool) -> None:
        measurement = running.measurement
        if measurement is None or not (running.judged or running.leaks or running.growth):
            return   # an unmarked test, no baseline, nothing left behind: the common case
        failures, notes = [], []
        for spec, device in running.devices:
            if device in measurement.unmeasured:
                if final or not spec.marked:
                    continue
                reason = measurement.unmeasured[device]
                if spec.kind == "cuda" and self.options.require_cuda:
                    failures.append(f"{device} not measured: {reason} (--memlab-require-cuda)")
                else:
                    notes.append(f"{device} not measured: {reason}")
                continue
            if not has_budget(spec):
                continue
            figures = running.figures[device] if final else measurement.figures(device)
            new = [e for e in exceeded(device, figures, spec) if e.key not in running.failed]
            if new and not final:
                figures = measurement.figures(device, sites=True)  # where the peak came from
            for e in new:
                running.failed[e.key] = e
                context = measurement.context(device, figures.seq_at_peak) if e.what == "peak" else ""
                failures.append(budget_failure(e, figures, self.options.top, context))
        failures += self._compare(running, final)
        if final:
            for device, kept in running.growth.items():
                if not kept or min(kept) <= 0:
                    continue   # grows every run, or it is not a growing leak
                text = growth_report(device, kept)
                key = f"{device} leak growth"
                if running.leak_policy.get(device) == "fail" and not running.call_failed:
                    running.failed[key] = kept
                    failures.append(text)
                else:
                    running.warned.append(key)
                    warnings.warn(MemlabLeakWarning(text), stacklevel=1)
            for device, leak in running.leaks.items():
                text = leak_report(leak, self.options.top)
                if running.leak_policy.get(device) == "fail" and not running.call_failed:
                    running.failed[leak.key] = leak
                    failures.append(text)
                elif running.leak_policy.get(device) == "fail":
                    # the test keeps its own failure; the leak is told beside it
                    running.failed[leak.key] = leak
                    warnings.warn(MemlabLeakWarning(f"{text}\n(the test had failed already)"), stacklevel=1)
                else:
                    running.warned.append(leak.key)
                    warnings.warn(MemlabLeakWarning(text), stacklevel=1)
        if failures and measurement is not None and measurement.trace_note:
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

    def _compare(self, running: Running, final: bool) -> list[str]:
        """The own peak against the baseline: a regression fails the test
        (at the call, or at teardown when teardown grew it); an
        improvement beyond the tolerance fails it at teardown only with
        --memlab-fail-on-improvement.  Nothing fails while updating."""
        if self.baseline is None:
            return []
        measurement, failures = running.measurement, []
        for spec, device in running.devices:
            if device in measurement.unmeasured:
                continue
            entry = self.baseline.entry(self.env, running.nodeid, running.names.get(device, device))
            if entry is None or entry.get("peak") is None:
                continue
            figures = running.figures[device] if final else measurement.figures(device)
            if not figures.measured or figures.peak is None:
                continue
            change = running.changes[device] = compare(
                device, entry["peak"], figures.peak, spec.tolerance or self.options.tolerance, self.options.baseline)
            if self.options.update_baseline or change.key in running.failed:
                continue
            if change.kind == "regressed" or (final and change.kind == "improved" and self.options.fail_on_improvement):
                if not final:
                    figures = measurement.figures(device, sites=True)  # where the peak came from
                running.failed[change.key] = change
                failures.append(baseline_failure(change, figures, self.options.top,
                                                 measurement.context(device, figures.seq_at_peak)))
        return failures

    def _result(self, nodeid: str, running: Running) -> TestResult:
        result = TestResult(nodeid, failed=sorted(running.failed), warned=sorted(running.warned),
                            error=running.error, user_failed=running.user_failed)
        for spec, device in running.devices if running.measurement is not None else ():
            figures = (running.figures or {}).get(device)
            if figures is not None:
                d = result.devices[device] = DeviceResult.from_figures(figures, spec, self.options.top)
                d.name = running.names.get(device, device)
                change = running.changes.get(device)
                if change is not None:
                    d.baseline_peak, d.baseline = change.old, change.kind
                elif self.baseline is not None and figures.measured:
                    d.baseline = "new"
                if self.detail and figures.measured:
                    d.detail = self._detail(device, figures, running)
        return result

    def _detail(self, device: str, figures, running: Running) -> dict:
        """What the JSON and HTML reports show of one device beyond the
        figures: the timeline (x: allocator events since the test began;
        each point the min and max of own and total bytes over its span),
        the marks and phases on it, where the own peak fell and the line
        that reached it, and the leak report."""
        seq0, last, points = figures.timeline or (0, 0, [])
        marks = [{"label": m.label, "kind": m.kind, "at": m.seq[device] - seq0}
                 for m in running.measurement.timeline_marks(device)]
        peak_at = peak_line = None
        if figures.seq_at_peak is not None and figures.peak:
            peak_at = figures.seq_at_peak - seq0
            chain = figures.attribution.peak_chain if figures.attribution is not None else []
            peak_line = str(chain[0]) if chain else None
        leak = running.leaks.get(device)
        return {
            "events": last - seq0,
            "timeline": [[seq - seq0, lo, hi, tlo, thi] for seq, lo, hi, tlo, thi in points],
            "marks": marks,
            "peak_at": peak_at,
            "peak_line": peak_line,
            "leak": leak_report(leak, self.options.top) if leak is not None else None,
        }

    # -- reporting ------------------------------------------------------------
    def pytest_runtest_logreport(self, report):
        """Results come with the teardown report (also under xdist, where
        the controller sees only reports)."""
        when = report.when
        if when == "call":
            self._outcomes[report.nodeid] = report.outcome
            return
        if when != "teardown":
            return
        nodeid = report.nodeid
        outcome = self._outcomes.pop(nodeid, "error")
        result = self._made.pop(nodeid, None)
        if result is None:
            if not report.user_properties:
                return   # not measured
            result = decode(nodeid, report.user_properties)
            if result is None:
                return
        result.outcome = "error" if report.outcome == "failed" and outcome == "passed" else outcome
        self.results[nodeid] = result

    def pytest_itemcollected(self, item):
        self.collected.add(item.nodeid)   # before deselection: a deselected test still exists

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """pytest-xdist, on the controller: what a worker sent at its end."""
        output = getattr(node, "workeroutput", None) or {}
        sent = output.get("memlab")
        if isinstance(sent, dict):
            self.workers[str(node.gateway.id)] = sent
            self.collected.update(sent.get("collected", ()))
            if self.env is None and sent.get("env"):
                self.env = sent["env"]

    def _environment(self) -> dict:
        torch = sys.modules.get("torch")
        return environment_info(torch)

    def pytest_sessionfinish(self, session, exitstatus):
        if self._worker:
            # the controller writes the one baseline and the one report
            self.config.workeroutput["memlab"] = {
                "collected": sorted(self.collected), "env": self.env, "info": self._environment(),
                "backend": self.backend,
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES") if self.options.gpus_per_worker else None,
            }
            return
        if self.baseline is not None:
            try:
                self._finish_baseline(session)
            except Exception as exc:   # never lose the session; say it loudly
                self.write_failed = True
                self.baseline_lines.append((f"pytest-memlab: the baseline {self.options.baseline} was not "
                                            f"written: {type(exc).__name__}: {exc}", True))
        reports = [("JSON", path, json_report) for path in self.options.json_paths]
        reports += [("HTML", path, html_report) for path in self.options.html_paths]
        for kind, path, module in reports:
            try:
                module.write(path, self.results, self._run_environment(), self._run_backend())
                self.baseline_lines.append((f"{kind} report: {path}", False))
            except Exception as exc:
                self.write_failed = True
                self.baseline_lines.append((f"pytest-memlab: the {kind} report {path} was not written: "
                                            f"{type(exc).__name__}: {exc}", True))
        if self.write_failed and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _run_environment(self) -> dict:
        """This run's environment: a worker's under pytest-xdist (the
        controller measures nothing), else this process's."""
        sent = [w["info"] for w in self.workers.values() if w.get("info")]
        gpu = [i for i in sent if i.get("device") not in (None, "cpu")]
        return (gpu or sent or [self._environment()])[0]

    def _run_backend(self) -> str:
        return self.backend or next((w["backend"] for w in self.workers.values() if w.get("backend")), "")

    def _finish_baseline(self, session) -> None:
        info = self._run_environment()
        env = self.env or self.options.baseline_env
        if env is None:   # nothing was measured
            self.baseline_lines.append((f"baseline {self.options.baseline}: no test was measured, "
                                        "nothing compared or written", False))
            return
        old = self.baseline.environments.get(env)
        differences = environment_differences(old.info, info or {}) if old is not None else []
        stale = stale_entries(self.baseline, env, self.collected, self.config.rootpath)
        if self.options.update_baseline:
            written, skipped = {}, []
            for nodeid, result in self.results.items():
                devices = {d.name or d.device: d.baseline_entry() for d in result.devices.values() if d.measured}
                if not devices:
                    continue
                if result.usable:
                    written[nodeid] = devices
                else:
                    skipped.append(nodeid)
            try:
                _, changes = update(self.options.baseline, env, info or {}, written,
                                    set(stale) if self.options.prune_baseline else None)
            except BaselineError as exc:
                self.write_failed = True
                self.baseline_lines.append((f"pytest-memlab: {exc}", True))
                return
            self.baseline_lines += baseline_summary(
                self.options.baseline, env, self.results, differences, stale, written=written, skipped=skipped,
                changes=changes)
        else:
            self.baseline_lines += baseline_summary(self.options.baseline, env, self.results, differences, stale)

    def pytest_unconfigure(self, config):
        unpark()

    def pytest_terminal_summary(self, terminalreporter):
        if not self.results and not self.baseline_lines and not self.notes:
            return
        terminalreporter.section("memlab")
        table = self.options.terminal_table
        if self.results:
            for line, bold in summary(self.results, self.backend, self.trace_notes, table,
                                      self.config.getoption("verbose", 0) or 0, self.options.top):
                terminalreporter.write_line(line, bold=bold)
        for line in self.notes:
            terminalreporter.write_line(line)
        gpus = {w: sent.get("gpus") for w, sent in sorted(self.workers.items()) if sent.get("gpus") is not None}
        if gpus:
            terminalreporter.write_line("GPUs per worker (CUDA_VISIBLE_DEVICES): " +
                                        ", ".join(f"{w} -> {g}" for w, g in gpus.items()))
        for line, bold in self.baseline_lines:
            terminalreporter.write_line(line, bold=bold, red=bold)


@pytest.fixture
def memlab(request) -> Measurement:
    """The running test's memory measurement: ``peak``, ``live``,
    ``total``, ``mark(label)``, ``limit(size)``, ``figures(device)``."""
    manager = request.config.pluginmanager.get_plugin("memlab-manager")
    running = manager.running(request.node) if manager is not None else None
    if running is None or running.measurement is None:
        why = f": {running.error}" if running is not None and running.error else ""
        pytest.fail(f"pytest-memlab is not measuring this test{why}", pytrace=False)
    return running.measurement
