"""A real third-party test suite, unmeasured and under ``--memlab-report``:
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


def run(folder: str, args: list[str], junit: str, measured: bool) -> float:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           "-o", "junit_family=xunit2", *args]
    cmd += ["--memlab-report"] if measured else ["-p", "no:memlab"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
    print(f"  {'measured' if measured else 'unmeasured'}: {elapsed:.1f}s, exit {proc.returncode}: "
          f"{tail[0] if tail else ''}", flush=True)
    if measured:
        with open(junit + ".log", "w") as f:
            f.write(proc.stdout + proc.stderr)
    return elapsed


def main() -> int:
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", help="append the summary (markdown) to this file")
    ap.add_argument("--name", default="", help="the suite's name in the summary")
    args = ap.parse_args(argv)
    times = {False: [], True: []}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            print(f"round {r + 1}", flush=True)
            for measured in (False, True):
                junit = os.path.join(tmp, f"{'on' if measured else 'off'}-{r}.xml")
                times[measured].append(run(args.suite, extra, junit, measured))
                results[(measured, r)] = outcomes(junit)
        last_log = open(os.path.join(tmp, f"on-{args.rounds - 1}.xml.log")).read()
    off, on = results[(False, 0)], results[(True, 0)]
    problems = []
    for r in range(args.rounds):
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
    summary_line = next((ln for ln in reversed(last_log.splitlines()) if "tests measured" in ln), "")
    lines = [
        f"{args.name or args.suite}: `{' '.join(extra)}`",
        "",
        f"- tests: {len(off)} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))})",
        f"- outcomes identical: {'yes' if not problems else 'NO'} ({len(problems)} differences)",
        f"- tests that ran with figures under --memlab-report: {len(ran) - len(without)} of {len(ran)}",
        f"- wall time, median of {args.rounds}: unmeasured {t_off:.1f} s, measured {t_on:.1f} s: "
        f"**{ratio:.3f}x** (target <= {TARGET:.2f}x)",
        f"- memlab's summary line: `{summary_line.strip()}`",
    ]
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
