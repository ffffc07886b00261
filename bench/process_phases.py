"""Where a pytest process's time goes, phase by phase, unmeasured against
``--memlab`` (or any configurations), side by side: issue 51 asks where the
whole-suite extra of a measured run goes, and a suite's wall time alone
mixes the tests with the session's end and the interpreter's exit.

    python bench/process_phases.py SUITE_DIR [--rounds 5] [--python PY]
        [--config NAME=ARGS ...] [--out FILE] [-- PYTEST_ARGS...]

Each configuration is its own pytest process (``--junitxml`` on, as
bench_suite and bench_leak_suite run them); rounds alternate the
configurations, each round starting at another one.  A small plugin (written
to a temporary folder, ``-p memlab_phase_marks``) stamps CLOCK_MONOTONIC at
each phase's edge; the parent stamps the process's start and its exit:

- ``start``: from the spawn to pytest's loading the plugin (the interpreter,
  pytest's own import);
- ``collect``: to the end of collection (conftests, the suite's imports,
  memlab's configure);
- ``tests``: the first test's start to the last test's end;
- ``finish``: the last test's end to unconfigure (sessionfinish: memlab's
  end, junit's file; the terminal summary);
- ``unconfigure``: pytest's unconfigure (its own full collections);
- ``atexit``: to the last atexit handler;
- ``exit``: from there to the process's end (the interpreter's
  finalization: its collections walk every object still alive);
- each phase's CPU seconds too (``time.process_time`` in the run: user and
  system, every thread) and the whole process's (its rusage): a shared VM's
  stolen time and its other tenants move walls, far less CPU time, so a
  ratio by CPU time tells memlab's cost from the host's weather (issue 51
  asks for both);
- and how many full (oldest-generation) collections CPython made during the
  tests: on a large heap one costs a few hundred milliseconds, and a suite
  whose heap sits just under the collector's threshold pays one more for
  any plugin's few long-lived objects (an edge, not a per-test cost).

Prints each run and the medians, and each phase's median difference from the
first configuration in ms and per test.  ``--config`` replaces the defaults
(``unmeasured=-p no:memlab`` and ``memlab=--memlab``); ARGS are split as a
shell would, and a word ``@VAR=VALUE`` sets VAR in that configuration's
environment instead (``@PYTHONPATH=/tmp/old-tree``: another checkout's
pytest_memlab, its extensions built in place, side by side with this one).  Run it with ``OMP_NUM_THREADS=1`` and nothing else on the cores.

Python writes bytecode in these runs (``PYTHONDONTWRITEBYTECODE`` is taken
out of their environment), and each configuration runs once untimed before
the rounds (``--warmup``): a package installed by pip has its bytecode
written at install, and a checkout's (or a fresh worktree's) has none, so
that without the warm-up every measured run would compile memlab's
modules (about 12 ms of its 38 ms import on 3.12) where the unmeasured
one imports nothing of them.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_suite import print_summary, split_pytest_args  # noqa: E402

PLUGIN = '''
import atexit, gc, os, time
import pytest

_marks = []
_last_end = [0.0, 0.0]
_full = {}   # full collections so far, at the first test's start and the last one's end


def _mark(name):
    _marks.append((name, time.clock_gettime(time.CLOCK_MONOTONIC), time.process_time()))


def _write():
    _mark("atexit")
    with open(os.environ["MEMLAB_PHASE_MARKS"], "w") as f:
        for name, t, cpu in _marks:
            f.write(f"{t:.6f} {cpu:.6f} {name}\\n")
        if "first" in _full:
            f.write(f"{_full.get('last', _full['first']) - _full['first']} full_collections_in_tests\\n")


atexit.register(_write)   # registered first: runs last
_mark("loaded")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    _mark("collected")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location):
    if not any(m[0] == "first_test" for m in _marks):
        _mark("first_test")
        _full["first"] = gc.get_stats()[2]["collections"]


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    _last_end[:] = [time.clock_gettime(time.CLOCK_MONOTONIC), time.process_time()]
    _full["last"] = gc.get_stats()[2]["collections"]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtestloop(session):
    yield
    _marks.append(("last_test", _last_end[0], _last_end[1]))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_unconfigure(config):
    _mark("unconfigure_start")
    yield
    _mark("unconfigured")
'''

PHASES = ("start", "collect", "tests", "finish", "unconfigure", "atexit", "exit", "wall")
# CPU seconds (user + system, every thread: time.process_time in the run,
# the child's rusage for the whole): what a shared VM's stolen time and
# other tenants move far less than walls
CPU_PHASES = ("cpu_collect", "cpu_tests", "cpu_finish", "cpu")
COLUMNS = PHASES + CPU_PHASES + ("full_gc",)


def phases_of(marks: dict[str, float], cpu: dict[str, float], spawned: float, ended: float,
              cpu_all: float) -> dict[str, float]:
    first = "first_test" if "first_test" in marks else "collected"
    last = "last_test" if marks.get("last_test") else first
    return {"start": marks["loaded"] - spawned, "collect": marks["collected"] - marks["loaded"],
            "tests": marks[last] - marks[first], "finish": marks["unconfigure_start"] - marks[last],
            "unconfigure": marks["unconfigured"] - marks["unconfigure_start"],
            "atexit": marks["atexit"] - marks["unconfigured"], "exit": ended - marks["atexit"],
            "wall": ended - spawned,
            "cpu_collect": cpu["collected"] - cpu["loaded"], "cpu_tests": cpu[last] - cpu[first],
            "cpu_finish": cpu["unconfigure_start"] - cpu[last], "cpu": cpu_all,
            "full_gc": marks.get("full_collections_in_tests", 0.0)}


def main() -> int:
    argv, pytest_args = split_pytest_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--config", action="append", metavar="NAME=ARGS")
    ap.add_argument("--tests", type=int, default=0, help="tests in the suite (for the per-test column; "
                    "default: counted from the junit file)")
    ap.add_argument("--no-junit", action="store_true", help="no --junitxml (a configuration may name one itself)")
    ap.add_argument("--out", help="append the summary (markdown) to this file")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each configuration first (default 1)")
    ap.add_argument("--keep", metavar="DIR", help="keep each timed run's junit file in DIR (NAME-ROUND.xml): "
                    "where a phase's extra goes, test by test")
    args = ap.parse_args(argv)
    configs: dict[str, list[str]] = {}
    config_env: dict[str, dict[str, str]] = {}
    for spec in args.config or ["unmeasured=-p no:memlab", "memlab=--memlab"]:
        name, _, rest = spec.partition("=")
        words = shlex.split(rest)
        config_env[name] = dict(w[1:].split("=", 1) for w in words if w.startswith("@") and "=" in w)
        configs[name] = [w for w in words if not (w.startswith("@") and "=" in w)]
    names = list(configs)
    work = tempfile.mkdtemp(prefix="memlab-phases-")
    with open(os.path.join(work, "memlab_phase_marks.py"), "w") as f:
        f.write(PLUGIN)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (work, env.get("PYTHONPATH")) if p)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    tests = args.tests
    for r in range(-args.warmup * len(names), args.rounds):
        order = names[r % len(names):] + names[:r % len(names)] if r >= 0 else [names[r % len(names)]]
        for name in order:
            marks_path = os.path.join(work, f"{name}.marks")
            junit = os.path.join(work, f"{name}.xml")
            cmd = [args.python, "-m", "pytest", "-q", "-p", "memlab_phase_marks", "-p", "no:cacheprovider",
                   *([] if args.no_junit else [f"--junitxml={junit}"]), *configs[name], *pytest_args]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            spawned = time.clock_gettime(time.CLOCK_MONOTONIC)
            run_env = dict(env, MEMLAB_PHASE_MARKS=marks_path)
            for var, value in config_env[name].items():   # a PYTHONPATH keeps the marks plugin's folder
                run_env[var] = os.pathsep.join((value, work)) if var == "PYTHONPATH" else value
            proc = subprocess.run(cmd, cwd=args.suite, env=run_env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            ended = time.clock_gettime(time.CLOCK_MONOTONIC)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_all = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            marks, cpu = {}, {}
            try:
                with open(marks_path) as f:
                    for line in f:
                        words = line.split()
                        if len(words) == 2:   # the count of full collections
                            marks[words[1]] = float(words[0])
                            continue
                        t, c, mark = words
                        marks[mark], cpu[mark] = float(t), float(c)
                os.unlink(marks_path)
            except OSError:
                marks = {}
            if not {"loaded", "collected", "unconfigure_start", "unconfigured", "atexit"} <= set(marks):
                print(f"{name}: the run stopped early (rc {proc.returncode}):\n{proc.stdout[-2000:]}", file=sys.stderr)
                return 1
            if not tests and not args.no_junit:
                import xml.etree.ElementTree as ET
                tests = sum(1 for _ in ET.parse(junit).getroot().iter("testcase"))
            phases = phases_of(marks, cpu, spawned, ended, cpu_all)
            if r < 0:   # the warm-up: not counted
                print(f"warm-up {name:>12}: wall {phases['wall']:.3f}", flush=True)
                continue
            runs[name].append(phases)
            if args.keep and not args.no_junit:
                os.makedirs(args.keep, exist_ok=True)
                shutil.copyfile(junit, os.path.join(args.keep, f"{name}-{r + 1}.xml"))
            print(f"round {r + 1} {name:>12}: " + " ".join(f"{p} {phases[p]:.3f}" for p in PHASES + CPU_PHASES)
                  + f" full_gc {phases['full_gc']:.0f}", flush=True)
    medians = {n: {p: statistics.median(x[p] for x in runs[n]) for p in COLUMNS} for n in names}
    ref = names[0]
    lines = [f"`{args.suite}` {' '.join(pytest_args)}: {tests} tests, {args.rounds} rounds alternating, medians (s); "
             f"after {args.warmup} warm-up run(s) each; {os.path.basename(args.python)} {subprocess.run([args.python, '-c', 'import sys; print(sys.version.split()[0])'], capture_output=True, text=True).stdout.strip()}",
             "", "| configuration | " + " | ".join(PHASES) + " | full collections in the tests |",
             "|---" * (len(PHASES) + 2) + "|"]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{medians[n][p]:.3f}" for p in PHASES)
                     + f" | {medians[n]['full_gc']:g} |")

    def differences(n: str, columns: tuple) -> str:
        """n's median less the reference's, in ms and in us a test, column by column."""
        return " | ".join(f"{(medians[n][p] - medians[ref][p]) * 1e3:+.0f} "
                          f"({(medians[n][p] - medians[ref][p]) * 1e6 / max(tests, 1):+.0f})" for p in columns)

    for n in names[1:]:
        lines.append(f"| {n} - {ref}, ms (us a test) | " + differences(n, PHASES)
                     + f" | {medians[n]['full_gc'] - medians[ref]['full_gc']:+g} |")
    lines += ["", "CPU seconds (user + system; the run's own time.process_time by phase, the child's rusage "
              "for the whole process):", "",
              "| configuration | " + " | ".join(CPU_PHASES) + " |", "|---" * (len(CPU_PHASES) + 1) + "|"]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{medians[n][p]:.3f}" for p in CPU_PHASES) + " |")
    for n in names[1:]:
        lines.append(f"| {n} - {ref}, ms (us a test) | " + differences(n, CPU_PHASES) + " |")
        lines.append(f"| {n} / {ref} | " + " | ".join(
            f"{medians[n][p] / medians[ref][p]:.3f}x" if medians[ref][p] else "" for p in CPU_PHASES) + " |")
    for n in names[1:]:
        lines.append("")
        lines.append(f"{n} / {ref}: wall {medians[n]['wall'] / medians[ref]['wall']:.3f}x, "
                     f"CPU {medians[n]['cpu'] / medians[ref]['cpu']:.3f}x (medians of {args.rounds})")
    text = "\n".join(lines)
    print_summary(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
