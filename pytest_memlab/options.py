"""pytest-memlab's command-line options and their ini twins, checked at
parse time (a bad value is a usage error that names it)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

REPORT_KINDS = ("term",)


def report_spec(value: str) -> tuple[str, ...]:
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


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return n


LEAK_POLICIES = ("fail", "warn", "off")


def leak_policy(value: str) -> str:
    value = value.strip().lower()
    if value not in LEAK_POLICIES:
        raise argparse.ArgumentTypeError(f"{value!r} is not a leak policy (expected one of: fail, warn, off)")
    return value


def count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    return n


def add_options(parser) -> None:
    group = parser.getgroup("memlab", "memory budgets and measurement (pytest-memlab)")
    group.addoption(
        "--memlab", action="store_true", default=None,
        help="measure every test, marked or not (ini: memlab)",
    )
    group.addoption(
        "--memlab-report", nargs="?", const=("term",), default=None, type=report_spec, metavar="SPEC",
        help="report the measured tests; implies --memlab. SPEC: 'term' (default) (ini: memlab_report)",
    )
    group.addoption(
        "--memlab-require-cuda", action="store_true", default=None,
        help="a cuda_memory test that cannot be measured (no CUDA) fails (ini: memlab_require_cuda)",
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
    parser.addini("memlab", type="bool", default=False, help="measure every test, marked or not")
    parser.addini("memlab_leak_repeat", default="0", help="as --memlab-leak-repeat")
    parser.addini("memlab_leaks", default="warn", help="as --memlab-leaks")
    parser.addini("memlab_top", default="5", help="as --memlab-top")
    parser.addini("memlab_include", type="linelist", default=[], help="as --memlab-include")
    parser.addini("memlab_report", default="", help="report spec, as --memlab-report")
    parser.addini("memlab_require_cuda", type="bool", default=False, help="as --memlab-require-cuda")


def _option(config, name: str, ini: str):
    value = config.getoption(name)
    return config.getini(ini) if value is None else value


@dataclass(frozen=True)
class Options:
    report: tuple[str, ...] | None
    measure_all: bool
    require_cuda: bool
    top: int
    include: tuple[str, ...]
    leaks: str = "warn"
    leak_repeat: int = 0

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
        return cls(
            leaks=leaks,
            leak_repeat=leak_repeat,
            report=report,
            measure_all=bool(_option(config, "memlab", "memlab")) or bool(report),
            require_cuda=bool(_option(config, "memlab_require_cuda", "memlab_require_cuda")),
            top=top,
            include=tuple(config.getoption("memlab_include") or config.getini("memlab_include")),
        )
