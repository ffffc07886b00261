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

In a suite of one's own (the large heap, a real project's), configurations
side by side:

    python bench/bench_instructions.py --suite DIR [--config NAME=ARGS ...]
        [--skip 100] [--jobs 2] [--top 25] [-- PYTEST_ARGS...]

Each configuration is one pytest process under callgrind, its instructions
counted from the test after ``--skip`` (imports, first decisions and caches
warm up before) to the session's end, before memlab's end: a small plugin
(``-p memlab_instruction_marks``) turns callgrind's instrumentation on and off
(``callgrind_control -i``).  Printed per test and over the first
configuration; ``--top`` adds the functions whose own count moved most.
``--config`` as in process_phases.py: ``NAME=ARGS``, a word
``@VAR=VALUE`` setting VAR in that configuration's environment
(``@PYTHONPATH=/tmp/other-tree``: another checkout's pytest_memlab).  On this
project's 2-core VM two wall-clock calls of one configuration differ by more
than two configurations 15 us a test apart (bench/RESULTS.md, the
thirty-fourth session); instructions do not depend on the host (about ±10k a
test where dict probing follows the hash seed, fixed here).  They are not
the wall time, which also pays for what a test's work leaves out of the
caches, but a change that executes fewer costs less.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

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


PLUGIN = '''
import os, subprocess, pytest

_seen = [0]
_SKIP = int(os.environ["MEMLAB_INSTRUCTIONS_SKIP"])


def _instrument(on):
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def pytest_runtest_logstart(nodeid, location):
    _seen[0] += 1
    if _seen[0] == _SKIP + 1:
        _instrument(True)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    _instrument(False)
    with open(os.environ["MEMLAB_INSTRUCTIONS_COUNT"], "w") as f:
        f.write(str(max(0, _seen[0] - _SKIP)))
'''


def run_config(name: str, args: list[str], env_extra: dict, suite: str, python: str, work: str,
               skip: int, pytest_args: list[str]) -> dict:
    out = os.path.join(work, f"{name}.callgrind")
    count = os.path.join(work, f"{name}.tests")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", MEMLAB_INSTRUCTIONS_SKIP=str(skip),
               MEMLAB_INSTRUCTIONS_COUNT=count)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env_extra.get("PYTHONPATH"), work, env.get("PYTHONPATH")) if p)
    env.update({k: v for k, v in env_extra.items() if k != "PYTHONPATH"})
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
           python, "-m", "pytest", "-q", "-p", "memlab_instruction_marks", "-p", "no:cacheprovider",
           "-p", "no:randomly", *args, *pytest_args]
    proc = subprocess.run(cmd, cwd=suite, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    refs = re.search(r"I\s+refs:\s+([\d,]+)", proc.stdout)
    if refs is None or not os.path.exists(count):
        raise SystemExit(f"{name}: no count (rc {proc.returncode}):\n{proc.stdout[-2000:]}")
    with open(count) as f:
        tests = int(f.read() or 0)
    return {"name": name, "instructions": int(refs.group(1).replace(",", "")), "tests": tests, "out": out}


def own_counts(path: str) -> collections.Counter:
    """Each function's own instructions (callgrind_annotate's listing)."""
    text = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100", path],
                          capture_output=True, text=True).stdout
    counts: collections.Counter = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)", line)
        if m and "PROGRAM TOTALS" not in line:
            where = re.sub(r"^.*?/(Python|Objects|Modules|Include|csrc)/", r"\1/", m.group(2))
            counts[re.sub(r" \[.*\]$", "", where)] += int(m.group(1).replace(",", ""))
    return counts


def suite_main(args, pytest_args: list[str]) -> int:
    configs = []
    for spec in args.config or ["unmeasured=-p no:memlab", "memlab=--memlab"]:
        name, _, rest = spec.partition("=")
        words = shlex.split(rest)
        env = dict(w[1:].split("=", 1) for w in words if w.startswith("@") and "=" in w)
        configs.append((name, [w for w in words if not (w.startswith("@") and "=" in w)], env))
    work = tempfile.mkdtemp(prefix="memlab-instructions-")
    with open(os.path.join(work, "memlab_instruction_marks.py"), "w") as f:
        f.write(PLUGIN)
    suite = os.path.abspath(args.suite)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda c: run_config(c[0], c[1], c[2], suite, sys.executable, work, args.skip,
                                                     pytest_args), configs))
    ref = results[0]
    lines = [f"`{args.suite}` {' '.join(pytest_args)}: Python {platform.python_version()}, instructions a test "
             f"over {ref['tests']} tests (after {args.skip}), PYTHONHASHSEED=0", "",
             f"| configuration | a test | over {ref['name']} |", "|---|---|---|"]
    for r in results:
        per = r["instructions"] / max(r["tests"], 1)
        over = (r["instructions"] - ref["instructions"]) / max(r["tests"], 1)
        lines.append(f"| {r['name']} | {per / 1e6:.3f} M | {'' if r is ref else f'{over / 1e3:+.1f}k'} |")
    if args.top:
        base = own_counts(ref["out"])
        for r in results[1:]:
            counts = own_counts(r["out"])
            moved = {k: counts[k] - base[k] for k in set(counts) | set(base)}
            lines += ["", f"{r['name']} over {ref['name']}, the functions whose own count moved most "
                      "(instructions a test):", ""]
            lines += [f"    {v / max(r['tests'], 1):+10.0f}  {k[:120]}"
                      for k, v in sorted(moved.items(), key=lambda kv: -abs(kv[1]))[:args.top]]
    print_summary("\n".join(lines), args.out)
    return 0


def main() -> int:
    argv = sys.argv[1:]
    pytest_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, pytest_args = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*")
    parser.add_argument("--tests", default="50,450")
    parser.add_argument("--out", default=None)
    parser.add_argument("--suite", help="count configurations side by side in this suite")
    parser.add_argument("--config", action="append", help="--suite: NAME=ARGS (default: unmeasured and memlab)")
    parser.add_argument("--skip", type=int, default=100, help="--suite: tests not counted at the start")
    parser.add_argument("--jobs", type=int, default=2, help="--suite: configurations at once (one core each)")
    parser.add_argument("--top", type=int, default=0, help="--suite: the functions that moved most, per test")
    args = parser.parse_args(argv)
    if args.suite:
        return suite_main(args, pytest_args)
    if not args.trees:
        parser.error("give TREE paths, or --suite DIR")
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
