"""Where a measured run's extra goes inside the tests' own durations, file
by file: the junit files that ``process_phases.py --keep DIR`` kept, one
configuration against another, each test's median duration over the
rounds.

    python bench/junit_diff.py DIR [--base unmeasured] [--other memlab] [--top 30]

A junit file's time for a test is pytest's setup, call and teardown
durations together: memlab's wrappers around setup and teardown and its
tracer's windows fall inside them; its makereport and logreport hooks, and
pytest's own work between tests, do not (the tests phase of
process_phases holds both).  Prints the totals (and the skipped tests'
share), then the files whose tests' durations grew the most, with their
tests, the extra a test and the base's own time: a suite whose few heavy
tests dominate its durations (kornia's SigLIP2 tests: 30 of its 69 s)
shows there how much of a phase's difference is the host's scatter.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import statistics
import sys
import xml.etree.ElementTree as ET


def load(folder: str, name: str) -> list[dict[str, tuple[float, bool]]]:
    """Each kept run of configuration name: test id -> (seconds, skipped)."""
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, f"{name}-*.xml"))):
        tests = {}
        for case in ET.parse(path).getroot().iter("testcase"):
            key = f"{case.get('classname')}::{case.get('name')}"
            tests[key] = (float(case.get("time") or 0.0), case.find("skipped") is not None)
        runs.append(tests)
    return runs


def module_of(test_id: str) -> str:
    """The test's module (junit's classname less its class, if any)."""
    classname = test_id.split("::")[0]
    parts = classname.split(".")
    return ".".join(parts[:-1]) if len(parts) > 1 and parts[-1][:1].isupper() else classname


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--base", default="unmeasured")
    ap.add_argument("--other", default="memlab")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    base, other = load(args.folder, args.base), load(args.folder, args.other)
    if not base or not other:
        print(f"no junit files of {args.base!r} and {args.other!r} in {args.folder}", file=sys.stderr)
        return 1

    def median(runs, key):
        return statistics.median(r[key][0] for r in runs if key in r)

    # module -> [tests, base s, other s, skipped tests, their extra s]
    files: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0, 0.0])
    for key in base[0]:
        if not all(key in r for r in other):
            continue
        a, b = median(base, key), median(other, key)
        entry = files[module_of(key)]
        entry[0] += 1
        entry[1] += a
        entry[2] += b
        if base[0][key][1]:
            entry[3] += 1
            entry[4] += b - a
    total = [sum(e[i] for e in files.values()) for i in range(5)]
    print(f"{total[0]} tests, {len(base)} and {len(other)} runs: {args.base} {total[1]:.2f} s, {args.other} "
          f"{total[2]:.2f} s, {total[2] - total[1]:+.2f} s ({(total[2] - total[1]) * 1e6 / max(total[0], 1):+.0f} us a "
          f"test); the {total[3]} skipped: {total[4]:+.2f} s")
    for module, e in sorted(files.items(), key=lambda kv: kv[1][1] - kv[1][2])[:args.top]:
        print(f"{e[2] - e[1]:+8.2f} s  {e[0]:5d} tests  {(e[2] - e[1]) * 1e6 / e[0]:+8.0f} us a test  "
              f"{args.base} {e[1]:7.2f} s  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
