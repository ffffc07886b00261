"""--memlab-pack against plain pytest-xdist, side by side in one call.

    python bench/bench_packing.py SUITE_DIR [--workers 4,8] [--generate] [--serial-plain] [--measured-plain]
        [--pack-args=OPTIONS] [--out FILE] -- PYTEST_ARGS...

First a serial run, measured, writes the suite's baseline (and pytest's
cache, a fresh one, keeps the footprints of the tests the baseline does
not hold: the skipped ones); with --serial-plain an unmeasured serial run
as well, the wall a team has today.  Then for each N: ``-n N`` plain (the
plugin loaded, measuring nothing) and ``-n N --memlab-pack`` against that
baseline.  Each run's wall, its out-of-memory failures, its outcomes
against the serial run's test by test, and the packed runs' summaries.

--generate writes the memory-heavy suite into SUITE_DIR first: 16 tests,
each holding 5% to 30% of the GPU's memory for 1.5 s (issue 50's suite).
--generate-fixtures writes instead a suite whose tests share module-scoped
fixtures: three modules, each with a fixture holding 22% of the GPU and
six tests holding 8% for 1 s; every worker that runs a module's tests
builds its own copy of its fixture (what --memlab-pack counts per worker).

Exit status 1 when a packed run has an out-of-memory failure or an
outcome that differs from the serial run's.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

# shares of the card, in the order the tests are collected: plain -n puts
# large ones side by side
SHARES = [0.30, 0.25, 0.20, 0.30, 0.05, 0.10, 0.30, 0.25, 0.15, 0.20, 0.30, 0.10, 0.25, 0.05, 0.15, 0.20]

GENERATED = '''
import json
import os
import time

import pytest
import torch

SHARES = {shares!r}


@pytest.mark.parametrize("share", SHARES, ids=[f"{{i:02d}}-{{int(s * 100)}}pct" for i, s in enumerate(SHARES)])
def test_hold(share, request):
    start = time.time()
    total = torch.cuda.mem_get_info()[1]
    x = torch.ones(int(total * share), dtype=torch.uint8, device="cuda")
    held = time.time()
    time.sleep(1.5)
    assert int(x[-1]) == 1
    spans = os.environ.get("PACK_SPANS")
    if spans:   # when this test held its memory, for the bench's timeline
        with open(os.path.join(spans, request.node.callspec.id + ".json"), "w") as f:
            json.dump([share, start, held, time.time(), os.environ.get("PYTEST_XDIST_WORKER", "-")], f)
'''

# three modules of GENERATED_FIXTURES: their fixtures' shares and the tests'
FIXTURE_SHARE, FIXTURE_TEST_SHARE, FIXTURE_MODULES, FIXTURE_TESTS = 0.22, 0.08, "abc", 6

GENERATED_FIXTURES = '''
import json
import os
import time

import pytest
import torch


def span(name, share, start, held):
    spans = os.environ.get("PACK_SPANS")
    if spans:   # when this held its memory, for the bench's timeline
        with open(os.path.join(spans, name + ".json"), "w") as f:
            json.dump([share, start, held, time.time(), os.environ.get("PYTEST_XDIST_WORKER", "-")], f)


@pytest.fixture(scope="module")
def weights():
    start = time.time()
    w = torch.ones(int(torch.cuda.mem_get_info()[1] * {fixture_share}), dtype=torch.uint8, device="cuda")
    held = time.time()
    yield w
    assert int(w[-1]) == 1
    del w
    span(f"{{__name__}}-weights-{{os.getpid()}}", {fixture_share}, start, held)


@pytest.mark.parametrize("i", range({tests}))
def test_with_weights(weights, i, request):
    start = time.time()
    x = torch.ones(int(torch.cuda.mem_get_info()[1] * {test_share}), dtype=torch.uint8, device="cuda")
    held = time.time()
    time.sleep(1.0)
    assert int(x[-1]) == 1 and int(weights[0]) == 1
    span(f"{{__name__}}-{{request.node.callspec.id}}", {test_share}, start, held)
'''


def timeline(folder: str) -> list[str]:
    """The generated suite's spans: each worker's tests in order, with the
    gaps between them, and the most of the card held at once."""
    import glob
    import json
    spans = [json.load(open(p)) for p in glob.glob(os.path.join(folder, "*.json"))]
    if not spans:
        return []
    t0 = min(s[1] for s in spans)
    by = {}
    for share, start, held, end, worker in sorted(spans, key=lambda s: s[1]):
        by.setdefault(worker, []).append((share, start - t0, held - t0, end - t0))
    most = max(sum(s[0] for s in spans if s[2] <= t < s[3]) for t in [s[2] for s in spans])
    out = [f"holding from first to last {max(s[3] for s in spans) - t0:.2f} s; most of the card held at once "
           f"{most:.0%}"]
    for worker, items in sorted(by.items()):
        parts = [f"{int(sh * 100)}% {a:.2f}+{h - a:.2f}..{e:.2f}" for sh, a, h, e in items]
        out.append(f"{worker}: " + ", ".join(parts))
    return out


def outcomes(junit: str) -> tuple[dict[str, str], int]:
    """name -> outcome (of a test re-run alone, the re-run's), and the
    count of failures that were out of memory (a set-aside attempt's too)."""
    attempts, oom = {}, 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None and re.search(r"OutOfMemoryError|out of memory",
                                         (bad.get("message") or "") + (bad.text or "")):
            oom += 1
        set_aside = any(p.get("name") == "memlab.rerun" for p in case.iter("property"))
        outcome = "failed" if bad is not None else "skipped" if case.find("skipped") is not None else "passed"
        attempts.setdefault(name, []).append((set_aside, outcome))
    out = {}
    for name, tries in attempts.items():
        kept = [o for aside, o in tries if not aside] or [tries[-1][1]]
        out[name] = kept[-1]
    return out, oom


PHASES = ("configure", "first report", "last report", "last worker down", "session finish", "unconfigure")


def run(folder: str, args: list[str], label: str, junit: str, cache: str) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "pack_phases", f"--junitxml={junit}",
           "-o", "junit_family=xunit2", "-o", f"cache_dir={cache}", *args]
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PACK_PHASES=junit + ".phases.json",
               PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    t0, w0 = time.perf_counter(), time.time()
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    end = time.time()
    text = proc.stdout + proc.stderr
    last = [x for x in text.splitlines() if re.search(r"\d+ (passed|failed|error)", x)][-1:] or [""]
    print(f"  {label}: {wall:.1f} s, exit {proc.returncode}: {last[0].strip('= ')}", flush=True)
    try:   # where the time went: the controller's phases (bench/pack_phases.py)
        import json
        marks = json.load(open(junit + ".phases.json"))
        points = [("start", w0)] + [(k, marks[k]) for k in PHASES if k in marks] + [("exit", end)]
        print("    " + ", ".join(f"{a} -> {b} {tb - ta:.2f} s" for (a, ta), (b, tb) in zip(points, points[1:])),
              flush=True)
    except (OSError, ValueError, KeyError):
        pass
    with open(junit + ".log", "w") as f:
        f.write(text)
    return wall, text


def pack_summary(text: str) -> list[str]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("pytest-memlab pack ("):
            out = [line]
            for follow in lines[i + 1:]:
                if not follow.startswith("  "):
                    break
                out.append(follow.strip())
            return out
    return []


def main() -> int:
    argv = sys.argv[1:]
    rest = []
    if "--" in argv:
        k = argv.index("--")
        argv, rest = argv[:k], argv[k + 1:]
    ap = argparse.ArgumentParser()
    ap.add_argument("suite")
    ap.add_argument("--workers", default="4,8")
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--generate-fixtures", action="store_true")
    ap.add_argument("--serial-plain", action="store_true")
    ap.add_argument("--measured-plain", action="store_true",
                    help="also -n N measured under xdist's own scheduler: what measuring costs apart from packing")
    ap.add_argument("--pack-args", default="", help="the packed runs' own options (--memlab-pack-capacity=...)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of the -n runs, each in another order (the packed run first in the second "
                         "round, ...): the table gives each run's median wall and every round's")
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    suite = os.path.abspath(args.suite)
    if args.generate:
        os.makedirs(suite, exist_ok=True)
        with open(os.path.join(suite, "test_held_memory.py"), "w") as f:
            f.write(GENERATED.format(shares=SHARES))
        rest = rest or ["test_held_memory.py"]
    if args.generate_fixtures:
        os.makedirs(suite, exist_ok=True)
        for m in FIXTURE_MODULES:
            with open(os.path.join(suite, f"test_fixture_{m}.py"), "w") as f:
                f.write(GENERATED_FIXTURES.format(fixture_share=FIXTURE_SHARE, test_share=FIXTURE_TEST_SHARE,
                                                  tests=FIXTURE_TESTS))
        rest = rest or [f"test_fixture_{m}.py" for m in FIXTURE_MODULES]
    name = args.name or os.path.basename(suite)
    tmp = tempfile.mkdtemp(prefix="memlab-pack-")
    cache = os.path.join(tmp, "cache")
    baseline = os.path.join(tmp, "baseline.json")
    print(f"== {name}: {' '.join(rest)}", flush=True)
    rows = []   # (label, wall, outcomes, oom, summary)

    wall, _ = run(suite, [*rest, f"--memlab-baseline={baseline}", "--memlab-update-baseline"],
                  "serial, measured (writes the baseline)", os.path.join(tmp, "serial.xml"), cache)
    serial, serial_oom = outcomes(os.path.join(tmp, "serial.xml"))
    rows.append(("serial, measured, writes the baseline", wall, serial, serial_oom, []))
    if args.serial_plain:
        wall, _ = run(suite, rest, "serial, unmeasured", os.path.join(tmp, "plain.xml"), cache)
        got, oom = outcomes(os.path.join(tmp, "plain.xml"))
        rows.append(("serial, unmeasured", wall, got, oom, []))
    for n in [int(x) for x in args.workers.split(",") if x]:
        # plain, measured by xdist's own scheduler (--measured-plain: what
        # measuring costs apart from packing), packed
        kinds = {"plain": ("", []),
                 "measured": (" --memlab-baseline (xdist's scheduler)", [f"--memlab-baseline={baseline}"]),
                 "packed": (" --memlab-pack", ["--memlab-pack", f"--memlab-baseline={baseline}",
                                               *args.pack_args.split()])}
        order = ("plain", "measured", "packed") if args.measured_plain else ("plain", "packed")
        walls, last = {}, {}
        for r in range(args.rounds):
            # each round in another order: a run's place in the sequence (the
            # GPU's and the page cache's state after the run before) is not
            # taken for its own cost
            for kind in order[len(order) - r % len(order):] + order[:len(order) - r % len(order)]:
                packed = kind == "packed"
                label = f"-n {n}" + kinds[kind][0]
                extra = ["-n", str(n)] + kinds[kind][1]
                junit = os.path.join(tmp, f"n{n}-{kind}-r{r}.xml")
                spans = os.path.join(tmp, f"spans-n{n}-{kind}-r{r}")
                os.makedirs(spans)
                os.environ["PACK_SPANS"] = spans
                wall, text = run(suite, [*rest, *extra], label + (f" (round {r + 1})" if args.rounds > 1 else ""),
                                 junit, cache)
                walls.setdefault(kind, []).append(wall)
                got, oom = outcomes(junit)
                if kind in last:   # outcomes and out of memory: every round's, the first unlike serial kept
                    prev = last[kind]
                    got = {k: v if prev[1].get(k, v) == serial.get(k) else prev[1][k] for k, v in got.items()}
                    oom += prev[2]
                last[kind] = (label, got, oom, (pack_summary(text) if packed else []) + timeline(spans))
                trace = [x for x in text.splitlines() if x.startswith("[packsched]")]   # with --pack-args=--debug
                if trace and args.out:
                    with open(os.path.splitext(args.out)[0] + f"-trace-n{n}.log", "w") as f:
                        f.write("\n".join(trace) + "\n")
        for kind in order:
            label, got, oom, summary = last[kind]
            each = walls[kind]
            if len(each) > 1:
                label += " (median of " + ", ".join(f"{w:.1f}" for w in each) + " s)"
            rows.append((label, statistics.median(each), got, oom, summary))

    failed = False
    serial_wall = rows[1][1] if args.serial_plain else rows[0][1]
    lines = [f"### {name}", "", f"`{' '.join(rest)}`; {len(serial)} tests; the ratio is against the "
             f"{'unmeasured' if args.serial_plain else 'measured'} serial run's wall.", "",
             "| run | wall (s) | x serial | out of memory | passed | failed | skipped | outcomes unlike serial |",
             "|---|---|---|---|---|---|---|---|"]
    for label, wall, got, oom, summary in rows:
        unlike = sorted(k for k in serial if got.get(k) != serial[k])
        counts = {o: sum(1 for v in got.values() if v == o) for o in ("passed", "failed", "skipped")}
        lines.append(f"| {label} | {wall:.1f} | {wall / serial_wall:.2f}x | {oom} | {counts['passed']} | "
                     f"{counts['failed']} | {counts['skipped']} | {len(unlike)} |")
        if "--memlab-pack" in label and (oom or unlike):
            failed = True
        for k in unlike[:10]:
            print(f"  {label}: {k}: {serial[k]} serially, {got.get(k)} here")
    lines.append("")
    for label, wall, got, oom, summary in rows:
        if summary:
            lines += [f"- `{label}`: " + summary[0]] + [f"  {s}" for s in summary[1:]]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
