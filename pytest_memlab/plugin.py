"""pytest-memlab's pytest plugin: the hooks, and only the hooks.

Each hook delegates:

- a test's run, from the start of its setup to the end of its teardown
  (:class:`~pytest_memlab.measuring.run.TestRun`);
- what fails it: budgets, leaks, the baseline
  (:class:`~pytest_memlab.judging.verdicts.Verdicts`);
- the session: results, baseline file, reports, xdist's worker and
  controller sides (:class:`~pytest_memlab.session.session.MemlabSession`).
  One hook is the session's own: it is registered as a plugin for
  ``pytest_runtest_logreport`` alone, so that each of a test's three
  reports reaches its ``record`` with no call between.

memlab's own trouble never fails a user's test: the test runs unmeasured and
the summary says why (``MEMLAB_CORE=bridge`` asks for the opposite: a
missing bridge is then an error of the test's setup, naming memlab).
"""

from __future__ import annotations

import pytest

from .engine.backend import core, restore, session_started, unpark
from .engine.tracing import WINDOWED, tracing
from .judging.verdicts import MemlabLeakWarning, Verdicts
from .markers import BAD_MARKER, MARKERS, SKIPPED_BY_MARK, SPECS, bad_markers, stash_specs
from .measuring.measurement import Measurement
from .measuring.out_of_memory import Observer as OutOfMemory
from .measuring.out_of_memory import out_of_memory_words
from .measuring.plain_run import PLAIN_SPECS, PlainRun, plain_runs_possible
from .measuring.run import TestRun
from .options import Options, add_options
from .reports.results import details, encode
from .session.gpu_pinning import pin_this_worker
from .session.packing import KEPT_CACHE_BYTES, PackScheduling, release_cached_gpu_memory, set_aside_for_rerun
from .session.session import MemlabSession

__all__ = ["MemlabLeakWarning", "MemlabPlugin", "SPECS", "memlab"]


def pytest_addoption(parser):
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    pin_this_worker()   # before any conftest can start CUDA


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


class MemlabPlugin:
    """The manager: its methods are the hooks."""

    def __init__(self, config):
        self.config = config
        session_started()   # undone by pytest_unconfigure's restore()
        self.options = options = Options.from_config(config)
        tracing.scope.configure(config.rootpath, options.include)
        self.session = MemlabSession(config, options)
        # The collector that the session's end pauses (MemlabSession.finish)
        # resumes in pytest's cleanup: after every unconfigure hook, even
        # one that raised, and, registered here (memlab is configured before
        # pytest's own plugins), after the cleanups of those.  pytest's
        # unraisable-exception plugin makes its full collections at
        # unconfigure (pytest 9) or in its cleanup (8.4): a collection of the
        # collector's own just before them costs a heap of a million
        # objects 0.3 s more.
        config.add_cleanup(self.session.resume_collector)
        self.verdicts = Verdicts(options, self.session)
        self._running: tuple | None = None    # (item, TestRun or PlainRun) of the test being measured
        self.current: Measurement | None = None   # its measurement until teardown ends (a TestRun's)
        self._plain: bool | None = None   # whether unmarked tests may run plain (asked at the first)
        # Hooks that only some runs need are registered only there: each
        # hook implementation costs every test pluggy's call, even one that
        # returns at once.
        if WINDOWED or options.leak_repeat:
            config.pluginmanager.register(CallWindow(self), "memlab-call-window")
        if options.pack:
            config.pluginmanager.register(RerunStatus(), "memlab-rerun-status")
            config.pluginmanager.register(PackedReports(self.session), "memlab-reports")
        else:
            # The session hears each report itself (its record is the hook:
            # three reports a test, no call between)
            config.pluginmanager.register(self.session, "memlab-reports")

    # -- collection -----------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        """A bad marker is a collection error of its module that names the
        test and the value: the same with and without pytest-xdist.  (Only
        checked here; the specs are read in pytest_collection_modifyitems,
        after hooks that add markers.)  A new-style wrapper: what collection
        raises (Ctrl-C) passes through it as through no plugin at all."""
        report = yield
        if not report.passed:
            return report
        errors = bad_markers(report.result)
        if errors:
            report.outcome = "failed"
            report.longrepr = "pytest-memlab: bad memory marker\n  " + "\n  ".join(errors)
            report.result = []
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        """Markers that hooks added after collection are read here.  A bad
        one is a usage error; on a pytest-xdist worker (whose usage error
        the controller cannot show) its test fails its setup with the same
        text."""
        errors = stash_specs(items, self.options.measure_all, config.pluginmanager.has_plugin("skipping"))
        if errors and not hasattr(config, "workerinput"):
            raise pytest.UsageError("pytest-memlab: bad memory marker\n  " + "\n  ".join(errors))

    def pytest_itemcollected(self, item):
        self.session.collected.add(item.nodeid)   # before deselection: a deselected test still exists

    # -- a test's run ---------------------------------------------------------
    def running(self, item) -> TestRun | None:
        """The TestRun of item's protocol, while memlab measures it (one
        test at a time per process; an attribute, not the item's stash:
        several hooks ask for it in every test).  A plain run becomes one
        here: whoever asks needs more than its figures."""
        current = self._running
        if current is None or current[0] is not item:
            return None
        run = current[1]
        if run.__class__ is PlainRun:
            run = TestRun.adopt(run, core(), self.options, self.session)
            self._running = (item, run)
            self.current = run.measurement
            OutOfMemory.run = run
        return run

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item):
        specs = item.stash.get(SPECS, None)
        location = (str(item.path), item.location[1] + 1) if specs else None
        if specs is PLAIN_SPECS:
            plain = self._plain
            if plain is None:   # (the session's first measured test)
                try:
                    plain = plain_runs_possible(core(), self.options, self.session)
                except Exception:   # the general run meets it too, and says what it is
                    plain = False
                self._plain = plain
            if plain:
                run = PlainRun(item.nodeid, location, item)
                if run.begin(core(), self.session):
                    self._running = (item, run)
                    self.current = None
                    OutOfMemory.run = None
                    return (yield)
        if specs:
            run = TestRun(specs, nodeid=item.nodeid, location=location, item=item)
            self._running = (item, run)
            required = run.begin(core, self.options, self.session)
            self.current = run.measurement
            OutOfMemory.run = run
        elif item.stash.get(SKIPPED_BY_MARK, False):
            # pytest skips it before anything of it runs: memlab's tracer,
            # parked since the last measured test, stays parked (unparked,
            # the next measured test would pay the re-instrumentation of
            # every code object it runs)
            required = None
        else:  # a test memlab does not measure runs with nothing of memlab's on
            required = item.stash.get(BAD_MARKER, None)
            unpark()
        result = yield
        if required:  # after the inner wrappers, which must finish their setup
            pytest.fail(required, pytrace=False)
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function" and not WINDOWED:
            # 3.12+: a function fixture needs no detached scope and no
            # window (nothing is counted for it: the teardown's window is
            # 3.11's); kornia's tests set up about nine a test
            return (yield)
        pytests_own = fixturedef.scope == "function" and getattr(fixturedef.func, "__module__",
                                                                  "").startswith("_pytest.")
        running = self._running
        if running is not None and running[1].__class__ is PlainRun and not pytests_own:
            if fixturedef.scope != "function":
                self.running(running[0])   # a broader fixture is measured apart: the general run does it
            else:   # before 3.12: the plain run's own window, as the general run's below
                plain = running[1]
                plain.fixtures += request.node is running[0]
                with plain.window():
                    return (yield)
        if self.current is None or pytests_own:
            # pytest's own function fixtures, a parametrized argument's
            # value above all (kornia's tests set up four or five a test),
            # run no user code: no bracket, no trace window
            if fixturedef.scope != "function":   # an instance set up unmeasured: its size is not known
                self.session.broad_fixtures.forget(fixturedef)
            return (yield)
        item, run = self._running
        started = run.fixture_begin(fixturedef.scope, request.node is item)
        if not started and not WINDOWED:
            # 3.12+: a broader fixture without a detached scope (no torch
            # bridge): its size is not known, and no window to open (a
            # function fixture returned above)
            self.session.broad_fixtures.forget(fixturedef)
            return (yield)
        try:
            with self.current.window():
                result = yield
        except BaseException:
            run.fixture_end(started)
            raise
        held = run.fixture_end(started)
        if fixturedef.scope != "function":
            self.session.broad_fixtures.set_up(fixturedef, request, held)
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item, nextitem):
        current = self._running
        plain = current[1] if current is not None and current[0] is item else None
        if plain.__class__ is PlainRun:
            run = None
        else:
            run, plain = self.running(item), None
            if run is None or run.measurement is None:
                return (yield)
        try:
            if plain is not None:
                if plain.fixtures:   # (before 3.12) only fixture finalizers run user code here
                    with plain.window():
                        result = yield
                else:
                    result = yield
                if plain.end():   # else it left something, or a child wrote: the general run ends it
                    if plain.trace_note:
                        self.session.trace_notes.add(plain.trace_note)
                    plain = None
                return result
            if run.fixtures:  # only fixture finalizers run user code here
                with run.measurement.window():
                    return (yield)
            return (yield)
        finally:
            self.current = None
            OutOfMemory.run = None
            if plain is not None:   # a plain run that did not end plain (or whose teardown failed)
                run = self.running(item)
            if run is not None and run.measurement is not None:
                try:
                    allowed = self.verdicts.leak_allowances(run)
                except Exception as exc:  # memlab's trouble, never the test's
                    allowed, run.error = {}, f"the leak check failed: {type(exc).__name__}: {exc}"
                run.end(item, allowed, self.options.top)
                try:
                    for device, blocks in run.suspects.items():
                        self.session.suspects.add(item.nodeid, device, blocks, allowed[device], run.location)
                    for device, blocks in run.measurement.left.items():
                        self.session.suspects.add_left(item.nodeid, device, blocks)
                except Exception as exc:  # memlab's trouble, never the test's
                    run.suspects = {}
                    run.error = run.error or f"the leak check failed: {type(exc).__name__}: {exc}"
                if run.measurement.trace_note:
                    self.session.trace_notes.add(run.measurement.trace_note)
                if self.options.snapshot is not None:
                    run.write_snapshots(self.options.snapshot)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if self.options.pack and self.session.worker is not None:
            if report.failed and call.when in ("setup", "call"):   # the controller may re-run it alone
                words = out_of_memory_words(call.excinfo.value if call.excinfo else None)
                if words:
                    report.memlab_out_of_memory = words
                    # The controller may set this failure aside and re-run
                    # the test alone: it counts for -x and --maxfail there,
                    # once it stands, not here.  pytest's session adds one
                    # to its count of failures when the report is logged
                    # (next) and stops at --maxfail: taken off first.
                    item.session.testsfailed -= 1
            if call.when == "teardown":
                release_cached_gpu_memory(item.config.workerinput.get("memlab_kept_cache") or KEPT_CACHE_BYTES)
        current = self._running
        if current is None or current[0] is not item:
            return report
        run = current[1]
        result = None
        if run.__class__ is PlainRun:
            if run.figures is not None:   # it ended plain
                if report.outcome == "failed":
                    run.user_failed = True
                result = run.result()
            elif report.outcome != "failed" and call.excinfo is None:
                return report   # (a passing setup or call: the general run does nothing either)
            else:
                run = self.running(item)
        if result is None:
            failed = report.outcome == "failed"
            if failed:
                run.user_failed = True   # memlab has not judged yet: this failure is the test's
            when = call.when
            if call.excinfo is not None or (run.out_of_memory and when == "teardown"):
                run.explain_out_of_memory(report, call, self.session, core, self.options.top)
            if when == "setup":
                return report
            if when == "call":
                if failed or call.excinfo is not None:
                    run.call_failed = True
                    if call.excinfo is not None:
                        run.failure = call.excinfo.tb
                if run.armed is not None and (run.judged or failed):   # (peek_children's own first question)
                    run.peek_children(failed)
                if failed:
                    run.children_out_of_memory(report)
            if when == "teardown" and self.session.ranks is not None:   # measured or not: every rank's turn
                try:
                    self.session.exchange(run)
                except Exception as exc:  # memlab's trouble, never the test's
                    run.error = run.error or f"the ranks' figures were not exchanged: {type(exc).__name__}: {exc}"
            # (judge's own first question, asked here: an unmarked test with
            # no baseline that left nothing behind, most tests, has nothing to judge)
            if run.judged or run.leaks or run.growth:
                try:
                    self.verdicts.judge(run, report, final=when == "teardown")
                except Exception as exc:  # memlab's trouble, never the test's
                    run.error = run.error or f"judging failed: {type(exc).__name__}: {exc}"
            if when == "teardown":
                options = self.options
                result = run.result(options.top, options.details if options.detail else "",
                                    self.session.baseline is not None, options.update_baseline)
                broad = self.session.broad_fixtures
                if (self.session.baseline is not None or options.pack) and broad.known:
                    for device, d in result.devices.items():   # for packed runs: the copies each worker holds
                        if d.measured:
                            d.fixtures = broad.of_test(item, device)
        if result is not None:   # the teardown report carries the test's result
            report.user_properties.extend(encode(result))
            if self.session.worker is not None:   # the controller's reports read the rest
                report.memlab_details = details(result)
            self.session.made(result)
            # Keeping every test's measurement would grow what the garbage
            # collector walks.
            self._running = None
        return report

    # -- the session ----------------------------------------------------------
    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config, log):
        """pytest-xdist, on the controller: --memlab-pack's scheduler."""
        plan = self.session.pack_plan
        if plan is None:
            return None
        try:
            self.session.packing = PackScheduling(config, plan, log, kept=self.session.kept_bytes)
        except Exception as exc:   # memlab's trouble: the run goes on under xdist's own scheduler
            self.session.notes.append(f"--memlab-pack: not packed ({type(exc).__name__}: {exc}); "
                                      "pytest-xdist scheduled the tests")
            return None
        return self.session.packing

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """pytest-xdist, on the controller, as each worker starts: how much
        of its caching allocator's blocks a packed worker keeps between
        tests (where the plan has room for them: what the scheduler counts
        for it), else KEPT_CACHE_BYTES."""
        plan = self.session.pack_plan
        if plan is not None and plan.kept_cache:
            node.workerinput["memlab_kept_cache"] = plan.kept_cache

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """pytest-xdist, on the controller: what a worker sent at its end."""
        self.session.controller.node_down(node)

    def pytest_sessionfinish(self, session, exitstatus):
        self.session.finish(session, self.options.top)

    def pytest_unconfigure(self, config):
        unpark()
        restore()

    def pytest_terminal_summary(self, terminalreporter):
        self.session.terminal_summary(terminalreporter)


class CallWindow:
    """The test call's trace window (3.11, whose tracer follows frames only
    inside windows) and --memlab-leak-repeat's repetitions of the call."""

    def __init__(self, manager: MemlabPlugin):
        self.manager = manager

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        manager = self.manager
        current = manager._running
        if current is not None and current[0] is pyfuncitem and current[1].__class__ is PlainRun:
            with current[1].window():
                return (yield)
        run = manager.running(pyfuncitem)
        if run is None or run.measurement is None or run.repeating:
            return (yield)
        with run.measurement.window():
            result = yield
        if manager.options.leak_repeat:
            run.repeat(pyfuncitem, manager.verdicts.leak_allowances(run), manager.options.leak_repeat)
        return result


class PackedReports:
    """--memlab-pack: a packed test's first out-of-memory is set aside
    before others see its report, then the session records it."""

    def __init__(self, session: MemlabSession):
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        if self.session.packing is not None:
            set_aside_for_rerun(self.session.packing, report)
        self.session.record(report)


class RerunStatus:
    """--memlab-pack: a test set aside to be re-run alone shows as a rerun."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        if getattr(report, "memlab_rerun", None) and report.outcome == "rerun":
            return "rerun", "R", ("RERUN", {"yellow": True})
        return None


@pytest.fixture
def memlab(request) -> Measurement:
    """The running test's memory measurement: ``peak``, ``live``,
    ``total``, ``mark(label)``, ``limit(size)``, ``figures(device)``."""
    manager = request.config.pluginmanager.get_plugin("memlab-manager")
    run = manager.running(request.node) if manager is not None else None
    if run is None or run.measurement is None:
        why = f": {run.error}" if run is not None and run.error else ""
        pytest.fail(f"pytest-memlab is not measuring this test{why}", pytrace=False)
    return run.measurement
