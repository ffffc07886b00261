"""The session: every measured test's result, the environment, the
baseline (loaded at the start, compared against by the verdicts, written at
the end), the reports, and the terminal summary.

Results come with each test's teardown report, also under pytest-xdist,
where the controller sees only reports: a worker measures and sends
(:mod:`.xdist_worker`); the controller (:mod:`.xdist_controller`) writes
the one baseline and the one report.
"""

from __future__ import annotations

import sys

import pytest

from ..devices import cuda_available
from ..judging.baseline_file import (Baseline, BaselineError, environment_differences, environment_info,
                                     stale_entries, update)
from ..reports import html_report, json_report
from ..reports.results import TestResult, decode
from ..reports.terminal import baseline_summary, summary
from .gpu_pinning import plan_gpus
from .xdist_controller import ControllerSide
from .xdist_worker import WorkerSide


class MemlabSession:
    def __init__(self, config, options):
        self.config = config
        self.options = options
        self.results: dict[str, TestResult] = {}
        self._outcomes: dict[str, str] = {}
        self._made: dict[str, TestResult] = {}   # this process's own results, spared decoding
        self.backend = ""
        self.trace_notes: set[str] = set()
        self.notes: list[str] = []
        self.collected: set[str] = set()
        self.lines: list[tuple[str, bool]] = []   # the baseline's and the reports' lines: (text, bold)
        self.write_failed = False
        self.baseline: Baseline | None = self._load_baseline()
        self.env: str | None = options.baseline_env
        if hasattr(config, "workerinput"):
            self.worker, self.controller = WorkerSide(config, self), None
        else:
            self.worker, self.controller = None, ControllerSide(self)
        if options.gpus_per_worker:
            note = plan_gpus(config, options.gpus_per_worker)
            if note:
                self.notes.append(note)

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

    # -- during the run -----------------------------------------------------------
    def saw_backend(self, core) -> None:
        """A test's measurement chose its backend: the summary names the
        first; a baseline's environment is named after it."""
        if not self.backend:
            self.backend = f"{core.name}: {core.reason}"
        if self.baseline is not None and self.env is None:
            self.env = "cuda" if cuda_available(core) else "cpu"

    def made(self, result: TestResult) -> None:
        """A result this process made (it comes back with the teardown report)."""
        self._made[result.nodeid] = result

    def record(self, report) -> None:
        """A test's report: the call's outcome, then the result with teardown's."""
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

    @staticmethod
    def own_environment() -> dict:
        return environment_info(sys.modules.get("torch"))

    # -- at the end ---------------------------------------------------------------
    def finish(self, session) -> None:
        if self.worker is not None:
            self.worker.finish()
            return
        if self.baseline is not None:
            try:
                self._finish_baseline()
            except Exception as exc:   # never lose the session; say it loudly
                self.write_failed = True
                self.lines.append((f"pytest-memlab: the baseline {self.options.baseline} was not "
                                   f"written: {type(exc).__name__}: {exc}", True))
        reports = [("JSON", path, json_report) for path in self.options.json_paths]
        reports += [("HTML", path, html_report) for path in self.options.html_paths]
        for kind, path, module in reports:
            try:
                module.write(path, self.results, self.controller.environment(), self.controller.backend())
                self.lines.append((f"{kind} report: {path}", False))
            except Exception as exc:
                self.write_failed = True
                self.lines.append((f"pytest-memlab: the {kind} report {path} was not written: "
                                   f"{type(exc).__name__}: {exc}", True))
        if self.write_failed and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _finish_baseline(self) -> None:
        options = self.options
        info = self.controller.environment()
        env = self.env or options.baseline_env
        if env is None:   # nothing was measured
            self.lines.append((f"baseline {options.baseline}: no test was measured, "
                               "nothing compared or written", False))
            return
        old = self.baseline.environments.get(env)
        differences = environment_differences(old.info, info or {}) if old is not None else []
        stale = stale_entries(self.baseline, env, self.collected, self.config.rootpath)
        if not options.update_baseline:
            self.lines += baseline_summary(options.baseline, env, self.results, differences, stale)
            return
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
            _, changes = update(options.baseline, env, info or {}, written,
                                set(stale) if options.prune_baseline else None)
        except BaselineError as exc:
            self.write_failed = True
            self.lines.append((f"pytest-memlab: {exc}", True))
            return
        self.lines += baseline_summary(options.baseline, env, self.results, differences, stale,
                                       written=written, skipped=skipped, changes=changes)

    def terminal_summary(self, terminalreporter) -> None:
        if not self.results and not self.lines and not self.notes:
            return
        terminalreporter.section("memlab")
        if self.results:
            for line, bold in summary(self.results, self.backend, self.trace_notes, self.options.terminal_table,
                                      self.config.getoption("verbose", 0) or 0, self.options.top):
                terminalreporter.write_line(line, bold=bold)
        for line in self.notes:
            terminalreporter.write_line(line)
        for line in self.controller.gpu_lines() if self.controller is not None else ():
            terminalreporter.write_line(line)
        for line, bold in self.lines:
            terminalreporter.write_line(line, bold=bold, red=bold)
