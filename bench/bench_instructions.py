"""The per-test cost in instructions, which host noise does not move: valgrind's
callgrind counts the instructions of a `--memlab` run of bench_pertest's
trivial suite with few and with many tests; the slope is the instructions per
measured test (the process's start and end cancel).  Trees side by side: a
change's cost before and after, where wall times on a shared GPU host spread
by more than the difference sought.

    python bench/bench_instructions.py [--tests 50,450] [--out FILE] TREE [TREE ...]

Each TREE is a checkout with its engine built for this Python (a git
worktree: `git worktree add build/before COMMIT`, then `python setup.py
build_ext --inplace` there).  Slow: a run is torch's import under valgrind
(minutes).  Each tree's modules are imported once first, so that both runs
read the same bytecode (a first run that compiles would lower the slope).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pertest import write_suite  # noqa: E402
from bench_suite import print_summary  # noqa: E402


def instructions(tree: str, folder: str) -> int:
    out = os.path.join(folder, "callgrind.out")
    env = {**os.environ, "PYTHONHASHSEED": "0", "MEMLAB_CORE": "bridge",
           "PYTHONPATH": os.pathsep.join([tree, folder])}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
                           "pytest", "-q", "--memlab"], cwd=folder, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: the run failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    with open(out) as f:
        for line in f:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise SystemExit(f"{tree}: no summary in {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--tests", default="50,450")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    few, many = (int(n) for n in args.tests.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (few, many):
            os.makedirs(os.path.join(tmp, str(n)))
            write_suite(os.path.join(tmp, str(n)), n)
        for tree in args.trees:
            tree = os.path.abspath(tree)
            instructions(tree, os.path.join(tmp, str(few)))   # writes the tree's and the suite's bytecode
            instructions(tree, os.path.join(tmp, str(many)))
            counts = {n: instructions(tree, os.path.join(tmp, str(n))) for n in (few, many)}
            commit = subprocess.run(["git", "-C", tree, "log", "--oneline", "-1"], capture_output=True,
                                    text=True).stdout.strip()[:60] or tree
            slope = (counts[many] - counts[few]) / (many - few)
            rows.append((commit, counts[few], counts[many], slope))
            print(f"{commit}: {counts[few]:,} / {counts[many]:,}: {slope:,.0f} per measured test", flush=True)
    lines = [f"Python {platform.python_version()}, {few} and {many} trivial tests under --memlab, callgrind:", "",
             f"| tree | instructions, {few} tests | instructions, {many} tests | per measured test |",
             "| --- | --- | --- | --- |"]
    for commit, a, b, slope in rows:
        lines.append(f"| {commit} | {a:,} | {b:,} | {slope:,.0f} |")
    text = "\n".join(lines)
    print_summary(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
