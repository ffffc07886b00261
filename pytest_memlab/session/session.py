"""The session: every measured test's result, the environment, the
baseline (loaded at the start, compared against by the verdicts, written at
the end), the reports, and the terminal summary.

Results come with each test's teardown report, also under pytest-xdist,
where the controller sees only reports: a worker measures and sends
(:mod:`.xdist_worker`); the controller (:mod:`.xdist_controller`) writes
the one baseline and the one report.
"""

from __future__ import annotations

import gc
import sys
import warnings

import pytest

from ..children.gathering import ChildWatch
from ..devices import cuda_available
from ..engine.backend import core
from ..engine.heap import untrack
from ..figures import rank_entries
from ..judging.baseline_file import (Baseline, BaselineError, environment_differences, environment_info,
                                     stale_entries, update)
from ..judging.findings import Cache
from ..judging.messages import cache_report, leak_report
from ..judging.verdicts import MemlabLeakWarning, sort_suspects
from ..measuring.leak_search import HOLDER_SECONDS, first_use_held, parameter_roots
from ..measuring.broad_fixtures import BroadFixtures
from ..measuring.leak_suspects import LeakSuspects
from ..options import FILE_REPORTS
from ..reports import dashboards, html_report, json_report, pr_summary
from ..reports.results import TestResult, compact, decode
from ..reports.terminal import baseline_summary, summary
from ..sizes import plural
from .gpu_pinning import plan_gpus
from .packing import PackPlan, PackScheduling, make_plan, remember_footprints, remember_serial_durations
from .ranks import RankSide, default_folder, rank_environment
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
        self.built_note = ""                      # this process built the torch bridge: where, how long
        self._gpu_models: dict[str, str] = {}    # cuda:N -> its model, asked once
        self.trace_notes: set[str] = set()
        self.notes: list[str] = []
        self.collected: set[str] = set()
        self.lines: list[tuple[str, bool]] = []   # the baseline's and the reports' lines: (text, bold)
        self.write_failed = False
        self.suspects = LeakSuspects()     # tests whose leak verdict comes at the end
        self.late: dict[str, dict] = {}    # nodeid -> device -> what the end's leak check found
        self.caches: list[dict] = []       # {device, holder, bytes, tests}
        self.broad_fixtures = BroadFixtures()   # what this process's broader fixtures hold
        self.children = ChildWatch(config.rootpath, options.include, options.top) if options.children else None
        self.baseline: Baseline | None = self._load_baseline()
        self.env: str | None = options.baseline_env
        if hasattr(config, "workerinput"):
            self.worker, self.controller = WorkerSide(config, self), None
        else:
            self.worker, self.controller = None, ControllerSide(self)
        # nodeid -> seconds, its phases added up: kept for packing from a
        # serial run that keeps footprints (a baseline's), else not gathered
        serial = self.worker is None and not getattr(config.option, "numprocesses", None)
        self._durations: dict[str, float] | None = {} if serial and self.baseline is not None else None
        self.ranks = self._ranks(config, options)
        if options.gpus_per_worker:
            note = plan_gpus(config, options.gpus_per_worker)
            if note:
                self.notes.append(note)
        self._collector_was_enabled: bool | None = None   # set from the session's end to unconfigure
        self.pack_plan: PackPlan | None = None     # --memlab-pack, on the controller
        self.packing: PackScheduling | None = None  # its scheduler, once xdist asked for one
        if options.pack and self.controller is not None:
            workers = config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None)
            dist = getattr(config.option, "dist", "load")
            if not workers:
                self.notes.append("--memlab-pack works under pytest-xdist (-n N) only; this run has no "
                                  "workers: its tests ran one after another")
            elif dist == "each":
                self.notes.append("--memlab-pack: --dist each runs every test on every worker; not packed")
            else:
                self.pack_plan = make_plan(config, options, self.baseline)
                if dist not in ("load", "no"):
                    self.notes.append(f"--memlab-pack: the tests were packed one by one; --dist {dist}'s "
                                      "grouping was not kept")

    def kept_bytes(self, nodeid: str, kind: str) -> int:
        """What a finished test kept past its teardown on devices of kind
        (its result, decoded from its teardown report): what its worker
        keeps holding between tests."""
        result = self.results.get(nodeid)
        if result is None:
            return 0
        return sum(d.kept or 0 for name, d in result.devices.items() if name.split(":", 1)[0] == kind)

    def _ranks(self, config, options) -> RankSide | None:
        """Under torchrun (RANK and WORLD_SIZE set, several ranks): this
        rank's side of the per-test exchange.  pytest-xdist workers inside
        ranks are refused when every test is measured; with markers only,
        each worker measures on its own (said once)."""
        ranks = rank_environment()
        if ranks is None:
            return None
        rank, world = ranks
        if getattr(config.option, "numprocesses", None) or self.worker is not None:
            if options.measure_all and self.worker is None:
                raise pytest.UsageError(
                    f"pytest-memlab: a session run once per rank (RANK={rank}, WORLD_SIZE={world}) cannot also "
                    "run pytest-xdist workers (-n): each rank's figures are gathered on rank 0 per test, and "
                    "workers would split the tests differently in each rank. Drop -n, or run without torchrun")
            if self.worker is None:
                self.notes.append(f"pytest-memlab: rank {rank} of {world} runs pytest-xdist workers: "
                                  "each measures on its own, and the ranks' figures are not gathered")
            return None
        return RankSide(rank, world, options.rank_dir or default_folder(), options.rank_timeout, options.top)

    def exchange(self, run) -> None:
        """A measured test's teardown under torchrun: a rank other than 0
        shares its figures; rank 0 gathers the others' (judged with its
        own children's) and keeps its own for the reports."""
        ranks = self.ranks
        if not ranks.gatherer:
            ranks.share(run)
            return
        gathered = ranks.gather(run)
        run.ranks = [ranks.own(run)] + gathered
        run.children = gathered + list(run.children)

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
            built, core.built = getattr(core, "built", None), None
            if built:   # choosing the backend compiled the bridge: said once
                self.built_note = (f"pytest-memlab: built the torch bridge for torch "
                                   f"{core.torch.__version__} in {built['seconds']:.1f} s: {built['path']} "
                                   "(later runs load it)")
                self.notes.append(self.built_note)
        if self.baseline is not None and self.env is None:
            self.env = "cuda" if cuda_available(core) else "cpu"

    def other_gpu(self, device: str, model: str | None = None) -> bool:
        """Whether device's figures must not be compared with the baseline:
        it was written on another GPU kind (its environment's device), where
        this process's device (or a rank's: model) is known.  False for the
        CPU, the same kind, or nothing known (the summary names both kinds,
        from the environments)."""
        if not device.startswith("cuda") or self.baseline is None:
            return False
        old = self.baseline.environments.get(self.env or self.options.baseline_env or "")
        written = old.info.get("device") if old is not None else None
        if not written or written == "cpu":
            return False
        if model is None:
            model = self._gpu_models.get(device)
            if model is None:
                torch = sys.modules.get("torch")
                if torch is None or not torch.cuda.is_initialized():
                    return False   # never initialised here to ask: compared, as before
                try:
                    model = self._gpu_models[device] = torch.cuda.get_device_name(int(device.split(":")[1]))
                except Exception:
                    return False
        return model != written

    def made(self, result: TestResult) -> None:
        """A result this process made (it comes back with the teardown report)."""
        self._made[result.nodeid] = result

    @pytest.hookimpl(tryfirst=True)
    def record(self, report) -> None:
        """A test's report: the call's outcome, then the result with
        teardown's.  The hook pytest_runtest_logreport: the session is
        registered as a plugin for it alone (plugin.py; under
        --memlab-pack, PackedReports calls it)."""
        when = report.when
        if self._durations is not None:
            self._durations[report.nodeid] = self._durations.get(report.nodeid, 0.0) + (report.duration or 0.0)
        if when == "call":
            self._outcomes[report.nodeid] = report.outcome
            return
        if when == "setup" and not report.passed:   # no call follows: skipped, or an error of its setup
            self._outcomes[report.nodeid] = "skipped" if report.skipped else "error"
            return
        if when != "teardown":
            return
        nodeid = report.nodeid
        outcome = self._outcomes.pop(nodeid, "error")
        result = self._made.pop(nodeid, None)
        if result is None:
            if not report.user_properties:
                return   # not measured
            # (the details' text, read: not kept with the report to the end)
            result = decode(nodeid, report.user_properties, report.__dict__.pop("memlab_details", ""))
            if result is None:
                return
        result.outcome = "error" if report.outcome == "failed" and outcome == "passed" else outcome
        self.results[nodeid] = result
        # Kept to the session's end: each object the collector tracks would
        # be promoted and walked at every full collection of a large heap,
        # and four or five a test brought the large-heap suite's next full
        # collection (0.3 s) into its tests.
        untrack(compact(result))

    pytest_runtest_logreport = record

    @staticmethod
    def own_environment() -> dict:
        return environment_info(sys.modules.get("torch"))

    # -- at the end ---------------------------------------------------------------
    def children_hook_missing(self, why: str) -> None:
        """Child processes cannot be measured (the start-up hook could not
        be installed): said once, and no test is armed again."""
        self.children = None
        self.notes.append(f"pytest-memlab: {why}")

    def finish(self, session, top: int) -> None:
        """The session's end on this process: the leak check's batch, the
        reports, the baseline.  From here to pytest's cleanup the
        collector makes no automatic collection (resume_collector, a
        cleanup the plugin registers as it is configured): the holder
        search's, the reports' and junit's temporaries, freed as they go,
        would otherwise trigger a full collection on a large heap (0.42 s
        on 1.1 M objects), just before the full collections pytest itself
        makes at unconfigure or in its cleanup (8.4 and later) or the
        interpreter makes at exit.  memlab's own explicit collections still
        run.  Only in a process where memlab measured a test (or heard of
        one measured): a session memlab took no part in keeps its collector
        as it was."""
        if self._collector_was_enabled is None and (self._made or self.results or self.suspects):
            self._collector_was_enabled = gc.isenabled()
            gc.disable()
        self._finish(session, top)

    def resume_collector(self) -> None:
        """In pytest's cleanup: the collector as finish found it."""
        if self._collector_was_enabled:
            gc.enable()
        self._collector_was_enabled = None

    def _finish(self, session, top: int) -> None:
        if self.children is not None:
            self.children.close()
        if self.ranks is not None and not self.ranks.gatherer:
            self.lines.append((f"rank {self.ranks.rank} of {self.ranks.world}: rank 0 gathers every rank's figures, "
                               "and writes the reports and the baseline", False))
            return
        if self.ranks is not None:
            self.ranks.close()
        if self.config.option.collectonly:
            return   # no test ran: nothing to confirm, compare, or write over earlier reports
        try:
            self._confirm_suspects(top, session)
        except Exception as exc:   # memlab's trouble: said, never the session's end
            self.lines.append((f"pytest-memlab: the leak check at the end failed: {type(exc).__name__}: {exc}",
                               True))
        if self.worker is not None:
            self.worker.finish()
            return
        self._apply_late()
        if self.packing is not None:
            workers = len(self.controller.workers) if self.controller is not None else 0
            self.notes += self.packing.summary(workers or self.packing.numnodes)
        if self.packing is not None or self.baseline is not None:
            # a packed run's figures, and a baseline run's (its skipped tests
            # too, which the baseline does not keep), for the next packed run
            try:
                remember_footprints(self.config, self.results)
                if self._durations is not None and not self.controller.workers:
                    # a serial run: its durations are the tests' own, one after another
                    remember_serial_durations(self.config, self._durations)
            except Exception as exc:   # pytest's cache unwritable: said, never the session's end
                self.notes.append(f"pytest-memlab: the footprints were not kept for --memlab-pack: {exc}")
        if self.baseline is not None:
            try:
                self._finish_baseline()
            except Exception as exc:   # never lose the session; say it loudly
                self.write_failed = True
                self.lines.append((f"pytest-memlab: the baseline {self.options.baseline} was not "
                                   f"written: {type(exc).__name__}: {exc}", True))
        writers = {"json": json_report.write, "html": html_report.write,
                   "bmf": dashboards.write_bmf, "gab": dashboards.write_gab}
        reports = [(FILE_REPORTS[kind], path, write) for kind, write in writers.items()
                   for path in self.options.paths(kind)]
        for kind, path, write in reports:
            try:
                write(path, self.results, self.controller.environment(), self.controller.backend(), self.caches)
                self.lines.append((f"{kind} report: {path}", False))
            except Exception as exc:
                self.write_failed = True
                self.lines.append((f"pytest-memlab: the {kind} report {path} was not written: "
                                   f"{type(exc).__name__}: {exc}", True))
        if self.options.summary and self.results:
            try:
                pr_summary.append(self.options.summary, self.results, self.caches)
            except Exception as exc:   # the run's outcome stays the tests'
                self.lines.append((f"pytest-memlab: the summary {self.options.summary} was not written: "
                                   f"{type(exc).__name__}: {exc}", True))
        if self._unjudged() and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.write_failed and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _unjudged(self) -> bool:
        """Marked tests memlab could not judge (no torch bridge): one
        short line that says what is missing and the one thing to do;
        whether the session fails for it (unless --memlab-accept-unjudged)."""
        tests = [r for r in self.results.values() if r.unjudged]
        if not tests:
            return False
        c = core()
        why = c.reason or "the torch bridge is unavailable"
        if "compiler" in why:
            fix = ("install a C++ compiler (g++) or set CXX to one, or point MEMLAB_BRIDGE at a bridge built "
                   "for this torch elsewhere")
        elif "not importable" in why:
            fix = "install torch in this environment"
        else:
            fix = "point MEMLAB_BRIDGE at a bridge built for this torch elsewhere"
        accepted = self.options.accept_unjudged
        self.lines.append((f"pytest-memlab: {plural(len(tests), 'marked test')} not judged: {why}. To judge "
                           f"{'them' if len(tests) > 1 else 'it'}: {fix}. "
                           + ("Accepted (--memlab-accept-unjudged)." if accepted
                              else "The session fails for it (--memlab-accept-unjudged accepts this)."),
                           not accepted))
        return not accepted

    # -- leaks confirmed at the end -----------------------------------------------
    def _confirm_suspects(self, top: int, session) -> None:
        """One settling, one tensor scan and one holder search for every
        suspect of this process; their verdicts join the results
        (self.late) and caches (self.caches)."""
        if not self.suspects:
            self.suspects.forget()   # the leaks confirmed at their teardown: no longer watched
            return
        n = len(self.suspects.pending)
        confirmed = self.suspects.confirm(core(), HOLDER_SECONDS + min(12.0, 0.1 * n),
                                          parameter_roots(getattr(session, "items", None)))
        held: dict = {}
        leaks, caches = sort_suspects(confirmed, held)
        leaking = {(s.nodeid, s.device) for s, _ in leaks}
        torch = core().torch
        for suspect, leak in confirmed:   # every suspect's figure agrees with its verdict
            entry = self.late.setdefault(suspect.nodeid, {})
            key = (suspect.nodeid, suspect.device)
            kept = held.get(key, [])   # its tensors in caches
            entry[suspect.device] = {"leaked": leak.bytes if key in leaking else 0,
                                     "first_use": (0 if key in leaking else sum(n for n, _ in kept)) + leak.outside,
                                     "first_use_held": [t for _, t in kept] + first_use_held(leak, torch)}
        for suspect, leak in leaks:
            self.late[suspect.nodeid][suspect.device].update(
                key=leak.key, text=leak_report(leak, top), location=list(suspect.location))
        for cache in caches:
            self.caches.append({"device": cache.device, "holder": cache.holder, "bytes": cache.bytes,
                                "tests": cache.tests})

    def _apply_late(self) -> None:
        """The end's leak verdicts into the results, and their warnings,
        attributed to each test's own line."""
        for nodeid, devices in self.late.items():
            result = self.results.get(nodeid)
            for device, found in devices.items():
                d = result.devices.get(device) if result is not None else None
                if d is not None:
                    d.leaked = found["leaked"]
                    d.first_use = found.get("first_use", 0)
                    d.first_use_held = found.get("first_use_held", [])
                if not found.get("key"):
                    continue
                if result is not None and found["key"] not in result.warned:
                    result.warned = sorted([*result.warned, found["key"]])
                    if d is not None and d.detail is not None:
                        d.detail["leak"] = found["text"]
                file, line = (found.get("location") or ["", 0])[:2]
                try:
                    head, _, rest = found["text"].partition("\n")
                    text = f"{head} in {nodeid}, confirmed at the session's end\n{rest}"
                    warnings.warn_explicit(MemlabLeakWarning(text), MemlabLeakWarning,
                                           str(file) or nodeid, int(line) or 0)
                except Warning:   # the warnings filter made it an error: say it plainly instead
                    said = (f"{nodeid}: {found['text'].splitlines()[0]} (its MemlabLeakWarning was "
                            "raised as an error by the warnings filter)")
                    if result is not None:
                        result.said = [*result.said, said]
                    else:
                        self.lines.append((said, True))
        merged: dict = {}   # the same holder, filled on several workers
        for c in self.caches:
            m = merged.setdefault((c["device"], c["holder"]), Cache(c["device"], c["holder"]))
            m.bytes = max(m.bytes, c["bytes"])   # each worker's process holds its own copy
            m.tests += c["tests"]
        self.caches = [{"device": c.device, "holder": c.holder, "bytes": c.bytes, "tests": c.tests}
                       for c in merged.values()]
        self.lines += [(cache_report(c), False) for c in merged.values()]

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
            if devices:
                devices.update(rank_entries(result))   # each rank's own, compared rank by rank
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
            backend = self.controller.backend() if self.controller is not None else self.backend
            torch_version = self.controller.environment().get("torch") if self.controller is not None else None
            for line, bold in summary(self.results, backend, self.trace_notes, self.options.terminal_table,
                                      self.config.getoption("verbose", 0) or 0, self.options.top,
                                      torch_version, self.config.rootpath):
                terminalreporter.write_line(line, bold=bold)
        for line in self.notes:
            terminalreporter.write_line(line)
        for line in self.controller.gpu_lines() if self.controller is not None else ():
            terminalreporter.write_line(line)
        for line, bold in self.lines:
            terminalreporter.write_line(line, bold=bold, red=bold)
