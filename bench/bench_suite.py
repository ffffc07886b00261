"""A real third-party test suite, unmeasured and under ``--memlab-report``
(or the options ``--measured`` gives):
the same outcome for every test, figures for every test that ran, and the
wall-time ratio (target: at most 1.05x).

    python bench/bench_suite.py SUITE_DIR [--rounds N] [--out FILE] -- PYTEST_ARGS...

SUITE_DIR is the folder pytest runs in (the project's checkout, or a copy
of its tests); PYTEST_ARGS select the tests (files, -k ...).  Each run is its
own pytest process with a junit file; rounds alternate unmeasured and
measured runs, and the ratio is of the medians.  Exit status 1 when an
outcome differs or a test that ran has no figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

TARGET = 1.05


def outcomes(junit: str) -> dict[str, tuple[str, bool]]:
    """nodeid-ish name -> (outcome, has memlab figures)."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None:
            outcome = "failed"
        elif case.find("error") is not None:
            outcome = "error"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        figures = any(p.get("name", "").endswith(".peak") for p in case.iter("property"))
        out[name] = (outcome, figures)
    return out


# Measured once more each, after the rounds, to say where the added time
# goes: without line attribution (no code in scope, so the tracer decides
# everything is out at once), and with memlab loaded but measuring nothing
# (-p memlab without --memlab-report: its hooks only).
BREAKDOWN = {
    "measured, no line attribution": ["--memlab-report", "--memlab-include=__memlab_nothing__/*"],
    "memlab loaded, measuring nothing": [],
}


UNMEASURED = ["-p", "no:memlab"]


def run(folder: str, args: list[str], junit: str, measured: bool, memlab_args: list[str] | None = None,
        label: str = "", cpu: list | None = None) -> float:
    """The wall time of one pytest process over folder; cpu, where given,
    receives the CPU seconds (user and system) it and its children (xdist's
    workers) spent, which a loaded host disturbs less than the wall time."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           "-o", "junit_family=xunit2", *args]
    if memlab_args is not None:
        cmd += memlab_args
    else:
        cmd += ["--memlab-report"] if measured else UNMEASURED
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if cpu is not None:
        now = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
    print(f"  {label or ('measured' if measured else 'unmeasured')}: {elapsed:.1f}s, exit {proc.returncode}: "
          f"{tail[0] if tail else ''}", flush=True)
    if measured:
        with open(junit + ".log", "w") as f:
            f.write(proc.stdout + proc.stderr)
    return elapsed


def split_pytest_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """A bench's own arguments, and pytest's after ``--``."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def print_summary(text: str, out: str | None) -> None:
    """A bench's summary (markdown): printed, and appended to out where
    given (--out), a blank line after it."""
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n\n")


def installed_bytecode(tree: str | None = None) -> None:
    """Compiles pytest-memlab's modules (this tree's, or tree's) to bytecode,
    as installing its wheel does.  Where PYTHONDONTWRITEBYTECODE is set (as
    on this project's VM) a source tree's modules are otherwise compiled
    afresh in every measured process, 55 ms of 80 ms of the plugin's import
    on Python 3.11, a cost that no installed copy has and that the
    unmeasured runs (-p no:memlab) never pay."""
    import compileall

    root = tree or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    compileall.compile_dir(os.path.join(root, "pytest_memlab"), quiet=1)


def main() -> int:
    argv, extra = split_pytest_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", help="append the summary (markdown) to this file")
    ap.add_argument("--name", default="", help="the suite's name in the summary")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds: start no round or breakdown run that would end past this")
    ap.add_argument("--breakdown", action="store_true", help="also the runs of BREAKDOWN, once each")
    ap.add_argument("--measured-first", action="store_true",
                    help="the first round measures first (then alternating): rounds split over several "
                         "calls of a host whose speed drifts still alternate the order")
    ap.add_argument("--measured", default="--memlab-report",
                    help="the measured runs' memlab options (default: --memlab-report); e.g. '--memlab', "
                         "or with -n 4 and the reports")
    ap.add_argument("--unmeasured", default=" ".join(UNMEASURED),
                    help="the unmeasured runs' options (default: -p no:memlab); e.g. "
                         "'--memlab-gpus-per-worker', which pins xdist's workers one per GPU and measures nothing")
    args = ap.parse_args(argv)
    installed_bytecode()
    measured_args = shlex.split(args.measured)
    unmeasured_args = shlex.split(args.unmeasured)
    times = {False: [], True: []}
    cpus = {False: [], True: []}
    results = {}
    breakdown = {}
    start = time.perf_counter()

    def fits(seconds: float) -> bool:
        return not args.budget or time.perf_counter() - start + seconds <= args.budget

    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            if r and not fits(sum(times[False]) / r + sum(times[True]) / r):
                print(f"round {r + 1}: skipped (--budget {args.budget:.0f} s)", flush=True)
                break
            print(f"round {r + 1}", flush=True)
            # odd rounds measure first: a drifting host favours neither
            for measured in (False, True) if (r + args.measured_first) % 2 == 0 else (True, False):
                junit = os.path.join(tmp, f"{'on' if measured else 'off'}-{r}.xml")
                times[measured].append(run(args.suite, extra, junit, measured,
                                           measured_args if measured else unmeasured_args, cpu=cpus[measured]))
                results[(measured, r)] = outcomes(junit)
        rounds = len(times[True])
        last_log = open(os.path.join(tmp, f"on-{rounds - 1}.xml.log")).read()
        for label, memlab_args in BREAKDOWN.items() if args.breakdown else ():
            if not fits(statistics.median(times[True])):
                print(f"  {label}: skipped (--budget {args.budget:.0f} s)", flush=True)
                continue
            breakdown[label] = run(args.suite, extra, os.path.join(tmp, "breakdown.xml"), True, memlab_args, label)
    off, on = results[(False, 0)], results[(True, 0)]
    problems = []
    for r in range(rounds):
        a, b = results[(False, r)], results[(True, r)]
        for name in sorted(set(a) | set(b)):
            oa, ob = a.get(name, ("absent", False))[0], b.get(name, ("absent", False))[0]
            if oa != ob:
                problems.append(f"round {r + 1}: {name}: {oa} unmeasured, {ob} measured")
    ran = [n for n, (o, _) in on.items() if o != "skipped"]
    without = [n for n in ran if not on[n][1]]
    counts: dict[str, int] = {}
    for o, _ in off.values():
        counts[o] = counts.get(o, 0) + 1
    t_off, t_on = statistics.median(times[False]), statistics.median(times[True])
    ratio = t_on / t_off
    paired = [b / a for a, b in zip(times[False], times[True])]
    cpu_ratio = statistics.median(cpus[True]) / statistics.median(cpus[False])
    summary_line = next((ln for ln in reversed(last_log.splitlines()) if "tests measured" in ln), "")
    lines = [
        f"{args.name or args.suite}: `{' '.join(extra)}`"
        + (f", unmeasured with `{' '.join(unmeasured_args) or 'memlab loaded, measuring nothing'}`"
           if unmeasured_args != UNMEASURED else ""),
        "",
        f"- tests: {len(off)} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))})",
        f"- outcomes identical: {'yes' if not problems else 'NO'} ({len(problems)} differences)",
        f"- tests that ran with figures under `{args.measured}`: {len(ran) - len(without)} of {len(ran)}",
        f"- wall time, median of {rounds} round(s): unmeasured {t_off:.1f} s, measured {t_on:.1f} s: "
        f"**{ratio:.3f}x** (target <= {TARGET:.2f}x); each round: "
        + ", ".join(f"{a:.1f}/{b:.1f} s" for a, b in zip(times[False], times[True]))
        + f"; each round's own ratio: {', '.join(f'{x:.3f}x' for x in paired)} "
        f"(median {statistics.median(paired):.3f}x)",
        f"- CPU time (user and system, the process and its workers), median: unmeasured "
        f"{statistics.median(cpus[False]):.1f} s, measured {statistics.median(cpus[True]):.1f} s: "
        f"**{cpu_ratio:.3f}x**",
        f"- memlab's summary line: `{summary_line.strip()}`",
    ]
    for label, seconds in breakdown.items():
        lines.append(f"- {label} (once): {seconds:.1f} s, {seconds / t_off:.3f}x")
    text = "\n".join(lines)
    print(text)
    for p in problems[:30]:
        print("  " + p)
    for n in without[:30]:
        print(f"  no figures: {n}")
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")
    return 1 if problems or without else 0


if __name__ == "__main__":
    sys.exit(main())
