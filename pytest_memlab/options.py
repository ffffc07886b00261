"""pytest-memlab's command-line options and their ini twins, checked at
parse time (a bad value is a usage error that names it)."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .judging.verdicts import DEFAULT_TOLERANCE, LEAK_POLICIES
from .sizes import SizeError, Tolerance, parse_size, parse_tolerance

# The reports written to a file: kind -> what the user reads it as.
FILE_REPORTS = {"json": "JSON", "html": "HTML", "bmf": "Bencher (BMF)", "gab": "github-action-benchmark"}
REPORT_KINDS = ("term", *(f"{kind}:PATH" for kind in FILE_REPORTS))


def _suggestion(part: str) -> str:
    """What a part that is no report was probably meant as: a misspelt
    kind (``jsn:r.json``: json:r.json), a file without its kind
    (``reports/r.json``: json:reports/r.json), or nothing."""
    import difflib

    kind, colon, path = part.partition(":")
    if colon and path.strip():
        close = difflib.get_close_matches(kind.strip().lower(), [*FILE_REPORTS, "term"], n=1, cutoff=0.6)
        if close and close[0] in FILE_REPORTS:
            return f"{close[0]}:{path.strip()}"
        return ""
    if colon:
        return ""
    if part.lower() in FILE_REPORTS:
        return f"{part.lower()}:PATH"
    if difflib.get_close_matches(part.lower(), ["term"], n=1, cutoff=0.7):
        return "term"
    suffix = os.path.splitext(part)[1].lower().lstrip(".")
    kind = {"htm": "html"}.get(suffix, suffix)
    return f"{kind}:{part}" if kind in FILE_REPORTS else ""


def report_spec(value: str) -> tuple[str, ...]:
    """Checks --memlab-report=SPEC at parse time: a comma list of ``term``
    and KIND:PATH for each report written to a file (json, html, bmf, gab).
    The error names the part that is wrong, the kinds there are and, where
    one is plain, the part meant (``jsn:r.json``: json:r.json)."""
    parts = tuple(p.strip() for p in value.split(",") if p.strip()) or ("term",)
    for part in parts:
        kind, _, path = part.partition(":")
        if kind in FILE_REPORTS:
            if not path.strip():
                raise argparse.ArgumentTypeError(f"{part!r} names no file (write {kind}:PATH)")
            continue
        if part != "term":
            meant = _suggestion(part)
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a report (expected a comma list of: {', '.join(REPORT_KINDS)})"
                + (f"; did you mean {meant}?" if meant else "")
            )
    return parts


# A value that begins with a word and one colon (``jsn:reports/a.json``) is
# a report's KIND:PATH, mistyped; a path to test has at most a node id's
# double colon, or on Windows a drive letter.
_KIND_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_-]*:(?!:)")


def _kind_prefixed(value: str) -> bool:
    match = _KIND_PREFIX.match(value)
    return bool(match) and not (os.name == "nt" and match.end() == 2)


def _test_path(value: str) -> bool:
    """Whether the value that --memlab-report took, which is no report,
    is a path to test (``--memlab-report tests/``, argparse's optional
    SPEC having taken it).  What names a file or folder that exists is;
    what reads as a report spec is not, slashes or not: a comma list
    (``term,xml:out/r.xml``), a KIND:PATH (``jsn:reports/a.json``), a
    report file without its kind (``reports/a.json``); else what looks
    like a path (``tests/unit``, ``test_x.py``) is, and pytest says so
    if it is not there."""
    head = value.split("::", 1)[0]
    if head and os.path.exists(head):
        return True
    if "," in value or _kind_prefixed(value) or _suggestion(value):
        return False
    return head.endswith(".py") or os.sep in head or "/" in head or head in (".", "..")


class ReportAction(argparse.Action):
    """``--memlab-report`` with an optional SPEC.  argparse cannot tell
    ``--memlab-report=SPEC`` from ``--memlab-report tests/`` (it would take
    the path for the spec), so a value that is no report but is a path to
    test (_test_path) is handed back as one (see pytest_configure), and
    the report is the terminal table: neither spelling trips.  Any other
    value that is no report is a usage error naming its bad part, with or
    without slashes in its paths."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            spec = ("term",)
        else:
            try:
                spec = report_spec(values)
            except argparse.ArgumentTypeError as exc:
                if not _test_path(values):
                    raise argparse.ArgumentError(self, str(exc)) from None
                spec = ("term",)
                paths = list(getattr(namespace, "memlab_report_paths", None) or [])
                if values not in paths:
                    paths.append(values)
                setattr(namespace, "memlab_report_paths", paths)
        setattr(namespace, self.dest, spec)


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return n


def capacity(value: str) -> int:
    try:
        n = parse_size(value)
    except SizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if n < 1:
        # (a size below one byte, 0.5, is 0 bytes: said, not left to be guessed)
        raise argparse.ArgumentTypeError(f"{value!r} is {n} bytes: a capacity must be more than 0 bytes")
    return n


def leak_policy(value: str) -> str:
    value = value.strip().lower()
    if value not in LEAK_POLICIES:
        raise argparse.ArgumentTypeError(f"{value!r} is not a leak policy (expected one of: {', '.join(LEAK_POLICIES)})")
    return value


DETAILS = ("flagged", "all")


def seconds(value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        n = -1.0
    if not n > 0 or n != n or n == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds above 0")
    return n


def on_off(value: str) -> bool:
    text = value.strip().lower()
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{value!r} is not one of on, off")
    return text == "on"


def details_choice(value: str) -> str:
    value = value.strip().lower()
    if value not in DETAILS:
        raise argparse.ArgumentTypeError(f"{value!r} is not one of: {', '.join(DETAILS)}")
    return value


def count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    return n


def tolerance(value: str) -> Tolerance:
    try:
        return parse_tolerance(value)
    except SizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def env_name(value: str) -> str:
    value = value.strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an environment name (letters, digits, '.', '_' and '-', such as 'cuda-h100')")
    return value


def add_options(parser) -> None:
    group = parser.getgroup("memlab", "memory budgets and measurement (pytest-memlab)")
    group.addoption(
        "--memlab", action="store_true", default=None,
        help="measure every test, marked or not (ini: memlab)",
    )
    group.addoption(
        "--memlab-report", nargs="?", action=ReportAction, default=None, metavar="SPEC",
        help="report the measured tests; implies --memlab.  --memlab-report alone is the terminal table; "
             "--memlab-report=SPEC a comma list of: term, json:PATH, html:PATH, bmf:PATH (Bencher's Metric "
             "Format), gab:PATH (github-action-benchmark's customSmallerIsBetter) (ini: memlab_report)",
    )
    group.addoption(
        "--memlab-json", default=None, metavar="PATH",
        help="write the JSON report (schema: pytest_memlab/reports/report.schema.json) to PATH; implies "
             "--memlab (ini: memlab_json)",
    )
    group.addoption(
        "--memlab-details", type=details_choice, default=None, metavar="flagged|all",
        help="which tests' timelines, marks and leak text the JSON and HTML reports carry: 'flagged' (default: "
             "the tests memlab failed or warned of) or 'all' (ini: memlab_details)",
    )
    group.addoption(
        "--memlab-html", default=None, metavar="PATH",
        help="write the HTML report (one self-contained file: per test its memory timeline, lines and leaks) "
             "to PATH; implies --memlab (ini: memlab_html)",
    )
    group.addoption(
        "--memlab-snapshot", default=None, metavar="DIR",
        help="per measured test and device, write its allocation events to DIR in the format of PyTorch's "
             "memory snapshot (memory_viz): NAME.json and NAME.pickle; implies --memlab (ini: memlab_snapshot)",
    )
    group.addoption(
        "--memlab-children", type=on_off, default=None, metavar="on|off",
        help="measure the Python processes a measured test starts (spawned ranks, DataLoader workers, "
             "subprocesses running Python, forks): each one's figures go into the test's result and its "
             "budgets apply to each; default on (ini: memlab_children)",
    )
    group.addoption(
        "--memlab-rank-dir", default=None, metavar="DIR",
        help="a session run once per rank (torchrun ... -m pytest): the folder the ranks share to gather each "
             "test's figures on rank 0 (default: one under the temp folder, named after the run; several nodes "
             "need a folder every node sees) (ini: memlab_rank_dir)",
    )
    group.addoption(
        "--memlab-rank-timeout", type=seconds, default=None, metavar="SECONDS",
        help="how long rank 0 waits, at a test's teardown, for another rank's figures of that test before it "
             "says which rank did not report (default 60) (ini: memlab_rank_timeout)",
    )
    group.addoption(
        "--memlab-require-cuda", action="store_true", default=None,
        help="a cuda_memory test that cannot be measured (no CUDA) fails (ini: memlab_require_cuda)",
    )
    group.addoption(
        "--memlab-accept-unjudged", action="store_true", default=None,
        help="a marked test whose budget memlab could not judge (no torch bridge: no C++ compiler, an "
             "unsupported torch) leaves the session's outcome alone; by default the session fails and "
             "says why (ini: memlab_accept_unjudged)",
    )
    group.addoption(
        "--memlab-top", type=positive_int, default=None, metavar="N",
        help="lines and tensors shown per test in failures and reports (default 5) (ini: memlab_top)",
    )
    group.addoption(
        "--memlab-include", action="append", default=None, metavar="GLOB",
        help="files whose lines get attributed (repeatable; default: files under rootdir outside "
             "site-packages and the stdlib) (ini: memlab_include)",
    )
    group.addoption(
        "--memlab-leaks", type=leak_policy, default=None, metavar="fail|warn|off",
        help="what a measured test without a memory marker that leaves tensors allocated after its "
             "teardown gets: a failure, a warning (default) or nothing; marked tests fail beyond their "
             "leaks= (default 0) (ini: memlab_leaks)",
    )
    group.addoption(
        "--memlab-leak-repeat", type=count, default=None, metavar="N",
        help="run each measured test's call N more times inside its measurement and report the bytes "
             "kept per repetition: a cache or list that grows every run is a leak (ini: memlab_leak_repeat)",
    )
    group.addoption(
        "--memlab-baseline", default=None, metavar="PATH",
        help="compare each measured test's own peak with the baseline file PATH; a regression beyond the "
             "tolerance fails that test; implies --memlab (ini: memlab_baseline)",
    )
    group.addoption(
        "--memlab-update-baseline", action="store_true", default=None,
        help="write the baseline file from this run instead of comparing: tests not run keep their "
             "entries (ini: memlab_update_baseline)",
    )
    group.addoption(
        "--memlab-prune-baseline", action="store_true", default=None,
        help="with --memlab-update-baseline, drop the entries of tests that no longer exist "
             "(ini: memlab_prune_baseline)",
    )
    group.addoption(
        "--memlab-tolerance", type=tolerance, default=None, metavar="SPEC",
        help=f"allowed growth over the baseline: '5%%', '16MiB' or '5%%,1MiB' (the larger of the two); "
             f"default {DEFAULT_TOLERANCE.replace('%', '%%')}; a marker's tolerance= wins (ini: memlab_tolerance)",
    )
    group.addoption(
        "--memlab-fail-on-improvement", action="store_true", default=None,
        help="a test whose own peak shrank beyond the tolerance fails, so that the baseline stays tight "
             "(ini: memlab_fail_on_improvement)",
    )
    group.addoption(
        "--memlab-baseline-env", type=env_name, default=None, metavar="NAME",
        help="the baseline environment this run compares with and writes (one file can hold several "
             "lanes); default 'cuda' where CUDA is available, else 'cpu' (ini: memlab_baseline_env)",
    )
    group.addoption(
        "--memlab-gpus-per-worker", nargs="?", const=1, type=positive_int, default=None, metavar="N",
        help="under pytest-xdist, give each worker its own N GPUs (default 1) through CUDA_VISIBLE_DEVICES, "
             "set before CUDA starts; write --memlab-gpus-per-worker=N (ini: memlab_gpus_per_worker)",
    )
    group.addoption(
        "--memlab-pack", action="store_true", default=None,
        help="under pytest-xdist (-n N), start a test only while the running tests' footprints (their "
             "peaks in the baseline) fit the device's capacity; a test without a figure runs alone, one that "
             "runs out of memory beside others is re-run alone at the end (ini: memlab_pack)",
    )
    group.addoption(
        "--memlab-pack-capacity", type=capacity, default=None, metavar="SIZE",
        help="what --memlab-pack fills on each device: default each GPU's free memory at the start less "
             "5%% and each worker's CUDA context; the CPU has none of its own, so CPU tests are packed "
             "only with a SIZE given (ini: memlab_pack_capacity)",
    )
    group.addoption(
        "--memlab-summary", default=None, metavar="PATH",
        help="append a Markdown summary of the run (memlab's failures, the baseline's largest changes, "
             "leaks, caches) to PATH; default $GITHUB_STEP_SUMMARY where set; 'off' writes none "
             "(ini: memlab_summary)",
    )
    parser.addini("memlab_baseline", default="", help="as --memlab-baseline (relative to the rootdir)")
    parser.addini("memlab_update_baseline", default="false", help="as --memlab-update-baseline")
    parser.addini("memlab_prune_baseline", default="false", help="as --memlab-prune-baseline")
    parser.addini("memlab_tolerance", default=DEFAULT_TOLERANCE, help="as --memlab-tolerance")
    parser.addini("memlab_fail_on_improvement", default="false", help="as --memlab-fail-on-improvement")
    parser.addini("memlab_baseline_env", default="", help="as --memlab-baseline-env")
    parser.addini("memlab_gpus_per_worker", default="", help="as --memlab-gpus-per-worker (a number)")
    parser.addini("memlab_pack", default="false", help="as --memlab-pack")
    parser.addini("memlab_pack_capacity", default="", help="as --memlab-pack-capacity (a size)")
    parser.addini("memlab", default="false", help="measure every test, marked or not")
    parser.addini("memlab_leak_repeat", default="0", help="as --memlab-leak-repeat")
    parser.addini("memlab_leaks", default="warn", help="as --memlab-leaks")
    parser.addini("memlab_top", default="5", help="as --memlab-top")
    parser.addini("memlab_include", type="linelist", default=[], help="as --memlab-include")
    parser.addini("memlab_report", default="", help="report spec, as --memlab-report")
    parser.addini("memlab_json", default="", help="as --memlab-json (relative to the rootdir)")
    parser.addini("memlab_html", default="", help="as --memlab-html (relative to the rootdir)")
    parser.addini("memlab_details", default="flagged", help="as --memlab-details")
    parser.addini("memlab_snapshot", default="", help="as --memlab-snapshot (relative to the rootdir)")
    parser.addini("memlab_require_cuda", default="false", help="as --memlab-require-cuda")
    parser.addini("memlab_accept_unjudged", default="false", help="as --memlab-accept-unjudged")
    parser.addini("memlab_children", default="on", help="as --memlab-children (on or off)")
    parser.addini("memlab_summary", default="", help="as --memlab-summary (relative to the rootdir; off: none)")
    parser.addini("memlab_rank_dir", default="", help="as --memlab-rank-dir (relative to the rootdir)")
    parser.addini("memlab_rank_timeout", default="60", help="as --memlab-rank-timeout (seconds)")


def _option(config, name: str, ini: str):
    value = config.getoption(name)
    return config.getini(ini) if value is None else value


def _option_or_ini(config, name: str, parse):
    """An option with no default, else its ini twin (same name) parsed;
    None where neither is set.  An ini value that does not parse is a
    usage error naming the key."""
    value = config.getoption(name)
    text = str(config.getini(name)).strip()
    if value is not None or not text:
        return value
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        import pytest

        raise pytest.UsageError(f"ini {name}: {exc}") from None


_TRUE = ("1", "true", "yes", "y", "on", "t")
_FALSE = ("0", "false", "no", "n", "off", "f", "")


def _flag(config, name: str) -> bool:
    """A flag and its ini twin (same name).  The ini is read here rather
    than as pytest's type="bool", whose error for a bad value names no
    key: this one does."""
    value = config.getoption(name)
    if value is not None:
        return bool(value)
    text = str(config.getini(name)).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    import pytest

    raise pytest.UsageError(f"ini {name}: invalid truth value {text!r} (expected true or false)")


def _refuse_one_file_twice(report, baseline) -> None:
    """The JSON report, the HTML report and the baseline are different
    files: a report written over the baseline would destroy it."""
    import pytest

    named = [(f"the {FILE_REPORTS[kind]} report", path)
             for kind, _, path in (part.partition(":") for part in report or ()) if kind in FILE_REPORTS]
    if baseline is not None:
        named.append(("the baseline", str(baseline)))
    seen: dict = {}
    for what, path in named:
        key = os.path.realpath(path)
        if key in seen and seen[key][0] != what:
            raise pytest.UsageError(f"pytest-memlab: {seen[key][0]} and {what} name the same file ({path}): "
                                    "give each its own")
        seen.setdefault(key, (what, path))


def _summary_path(config) -> str | None:
    """--memlab-summary, else the ini's, else $GITHUB_STEP_SUMMARY; 'off'
    is none."""
    import pytest

    path = config.getoption("memlab_summary")
    if path is not None and not path.strip():
        raise pytest.UsageError("--memlab-summary names no file (write --memlab-summary=PATH, or off)")
    if path is None and config.getini("memlab_summary").strip():
        ini = config.getini("memlab_summary").strip()
        path = ini if ini.lower() == "off" else str(config.rootpath / ini)
    if path is None:
        path = os.environ.get("GITHUB_STEP_SUMMARY", "").strip() or None
    return None if path is None or path.strip().lower() == "off" else path


@dataclass(frozen=True)
class Options:
    report: tuple[str, ...] | None
    measure_all: bool
    require_cuda: bool
    top: int
    include: tuple[str, ...]
    accept_unjudged: bool = False   # a budget memlab could not judge leaves the session's outcome alone
    leaks: str = "warn"
    leak_repeat: int = 0
    baseline: Path | None = None
    update_baseline: bool = False
    prune_baseline: bool = False
    tolerance: Tolerance = field(default_factory=lambda: parse_tolerance(DEFAULT_TOLERANCE))
    fail_on_improvement: bool = False
    baseline_env: str | None = None
    gpus_per_worker: int | None = None
    pack: bool = False               # --memlab-pack (session/packing.py)
    pack_capacity: int | None = None
    snapshot: Path | None = None
    details: str = "flagged"
    children: bool = True
    rank_dir: str | None = None
    rank_timeout: float = 60.0
    summary: str | None = None      # the Markdown summary's file (reports/pr_summary.py)

    # Asked in every measured test: computed once (cached_property writes
    # the instance's __dict__, which a frozen dataclass allows).
    def paths(self, kind: str) -> list[str]:
        """The files a report of kind (FILE_REPORTS) is written to."""
        return [part.split(":", 1)[1] for part in self.report or () if part.startswith(kind + ":")]

    @cached_property
    def detail(self) -> bool:
        """Whether a report shows timelines and marks (fetched per test only then)."""
        return any(part.startswith(("json:", "html:")) for part in self.report or ())

    @cached_property
    def kinds_kept(self) -> bool:
        """Whether every test's memory by kind is kept: the JSON and HTML
        reports show it, a baseline being written stores it."""
        return self.detail or bool(self.update_baseline)

    @cached_property
    def terminal_table(self) -> bool:
        return "term" in (self.report or ())

    @cached_property
    def top_lines(self) -> bool:
        """Whether anything shows a test's heaviest lines: the JSON and HTML
        reports, the terminal table (junit keeps a test's figures, not its
        lines: reports/results.py)."""
        return self.detail or self.terminal_table

    @classmethod
    def from_config(cls, config) -> "Options":
        """Raises pytest.UsageError naming an ini value that does not parse."""
        import pytest

        report = _option(config, "memlab_report", "memlab_report")
        if isinstance(report, str):
            try:
                report = report_spec(report) if report.strip() else None
            except argparse.ArgumentTypeError as exc:
                raise pytest.UsageError(f"ini memlab_report: {exc}") from None
        try:
            top = positive_int(str(_option(config, "memlab_top", "memlab_top")))
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"ini memlab_top: {exc}") from None
        try:
            leaks = leak_policy(str(_option(config, "memlab_leaks", "memlab_leaks")))
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"ini memlab_leaks: {exc}") from None
        try:
            leak_repeat = count(str(_option(config, "memlab_leak_repeat", "memlab_leak_repeat")))
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"ini memlab_leak_repeat: {exc}") from None
        baseline = config.getoption("memlab_baseline")
        if baseline is not None:
            baseline = Path(baseline)   # as the shell gave it: relative to the working folder
        elif config.getini("memlab_baseline").strip():
            baseline = config.rootpath / config.getini("memlab_baseline").strip()
            shown = Path(os.path.relpath(baseline))   # as short as the shell would name it
            if not str(shown).startswith(".."):
                baseline = shown
        update = _flag(config, "memlab_update_baseline")
        prune = _flag(config, "memlab_prune_baseline")
        if (update or prune) and baseline is None:
            flag = "--memlab-update-baseline" if update else "--memlab-prune-baseline"
            raise pytest.UsageError(f"{flag} needs the file to write: add --memlab-baseline=PATH")
        if prune and not update:
            raise pytest.UsageError("--memlab-prune-baseline drops entries while it writes the baseline: "
                                    "add --memlab-update-baseline")
        tol = _option(config, "memlab_tolerance", "memlab_tolerance")
        if isinstance(tol, str):
            try:
                tol = tolerance(tol)
            except argparse.ArgumentTypeError as exc:
                raise pytest.UsageError(f"ini memlab_tolerance: {exc}") from None
        env = _option_or_ini(config, "memlab_baseline_env", env_name)
        gpus = _option_or_ini(config, "memlab_gpus_per_worker", positive_int)
        pack_capacity = _option_or_ini(config, "memlab_pack_capacity", capacity)
        pack = _flag(config, "memlab_pack")
        if not pack and config.getoption("memlab_pack_capacity") is not None:
            # (the ini's value waits for a run with --memlab-pack: it is set once, the flag per run)
            raise pytest.UsageError("--memlab-pack-capacity is what --memlab-pack fills: add --memlab-pack")
        for kind in ("json", "html"):
            path = config.getoption(f"memlab_{kind}")
            if path is None and config.getini(f"memlab_{kind}").strip():
                path = str(config.rootpath / config.getini(f"memlab_{kind}").strip())
            if path is not None:
                if not path.strip():
                    raise pytest.UsageError(f"--memlab-{kind} names no file (write --memlab-{kind}=PATH)")
                report = tuple(report or ()) + (f"{kind}:{path}",)
        try:
            details = details_choice(str(_option(config, "memlab_details", "memlab_details")))
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"ini memlab_details: {exc}") from None
        snapshot = config.getoption("memlab_snapshot")
        if snapshot is None and config.getini("memlab_snapshot").strip():
            snapshot = str(config.rootpath / config.getini("memlab_snapshot").strip())
        if snapshot is not None and not snapshot.strip():
            raise pytest.UsageError("--memlab-snapshot names no folder (write --memlab-snapshot=DIR)")
        children = config.getoption("memlab_children")
        try:
            if children is None:
                children = on_off(str(config.getini("memlab_children")))
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"ini memlab_children: {exc}") from None
        rank_dir = config.getoption("memlab_rank_dir")
        if rank_dir is None and config.getini("memlab_rank_dir").strip():
            rank_dir = str(config.rootpath / config.getini("memlab_rank_dir").strip())
        rank_timeout = config.getoption("memlab_rank_timeout")
        if rank_timeout is None:
            try:
                rank_timeout = seconds(str(config.getini("memlab_rank_timeout")).strip())
            except argparse.ArgumentTypeError as exc:
                raise pytest.UsageError(f"ini memlab_rank_timeout: {exc}") from None
        _refuse_one_file_twice(report, baseline)
        return cls(
            summary=_summary_path(config),
            rank_dir=rank_dir,
            rank_timeout=rank_timeout,
            children=children,
            snapshot=Path(snapshot) if snapshot is not None else None,
            details=details,
            baseline=baseline,
            update_baseline=update,
            prune_baseline=prune,
            tolerance=tol,
            fail_on_improvement=_flag(config, "memlab_fail_on_improvement"),
            baseline_env=env,
            gpus_per_worker=gpus,
            pack=pack,
            pack_capacity=pack_capacity,
            leaks=leaks,
            leak_repeat=leak_repeat,
            report=report,
            measure_all=_flag(config, "memlab") or bool(report) or baseline is not None or pack
            or snapshot is not None,
            require_cuda=_flag(config, "memlab_require_cuda"),
            accept_unjudged=_flag(config, "memlab_accept_unjudged"),
            top=top,
            include=tuple(config.getoption("memlab_include") or config.getini("memlab_include")),
        )
