"""What measuring costs per test: a suite of trivial tests (each
``torch.ones(16)``) run unmeasured, under ``--memlab`` and under pytest-memray
(``--memray``, where installed), side by side in one run.

Each configuration is its own pytest process; rounds alternate the
configurations and the table shows the median over rounds.  Two figures per
configuration: the whole process's wall time, and the CPU time the process
spent inside the test protocols (a timing plugin wraps
pytest_runtest_protocol outermost and sums time.process_time()), which is
where measuring costs and which shared machines disturb far less.  The
added time per test is (configuration - unmeasured) / tests.

    python bench/bench_pertest.py [--tests N] [--rounds R] [--out FILE] [--profile]

--profile also runs one --memlab round under cProfile and prints where
memlab's own time went.

Side by side in one process (the figure the 100 us target is judged on):
one ``--memlab`` process runs the suite with memlab's measurement taken off
every other block of 50 tests (a bench plugin drops memlab's per-test spec
after collection, so those tests run exactly as unmeasured ones do), and
times every test protocol.  The added cost per test is the median of the
measured tests minus the median of the unmeasured ones: both halves share
the process, the machine's state and its disturbances, so what a shared or
throttled host does to one process and not the next cancels out.

    python bench/bench_pertest.py --suite DIR [--rounds R] [-- PYTEST_ARGS...]

runs only the side-by-side rounds, in a suite of one's own (the large-heap
suite, a real project's), with PYTEST_ARGS added to its ``--memlab`` run:
what a measured test of that suite costs, and with an option off
(``-- --memlab-children=off``) what that part of the per-test path costs
there (issue 51's ablations, bench/RESULTS.md's twenty-fourth session).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_suite import split_pytest_args  # noqa: E402

TARGET_US = 100.0
TARGET_RATIO = 1.10


TIMER = '''
import os, time, pytest

_cpu = [0.0]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    t0 = time.process_time()
    yield
    _cpu[0] += time.process_time() - t0


def pytest_unconfigure(config):
    with open(os.environ["PERTEST_CPU_OUT"], "w") as f:
        f.write(repr(_cpu[0]))
'''


INTERLEAVE = '''
import os, statistics, time, pytest

BLOCK = 25
_times = {True: [], False: []}
_blocks = {}   # block number -> protocol times of its tests


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    from pytest_memlab.plugin import SPECS

    for i, item in enumerate(session.items):
        if (i // BLOCK) % 2 and SPECS in item.stash:
            del item.stash[SPECS]
        item.stash[_BLOCK] = i // BLOCK


_BLOCK = pytest.StashKey[int]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    from pytest_memlab.plugin import SPECS

    measured = SPECS in item.stash
    t0 = time.perf_counter_ns()
    yield
    elapsed = time.perf_counter_ns() - t0
    _times[measured].append(elapsed)
    _blocks.setdefault(item.stash[_BLOCK], []).append(elapsed)


def pytest_unconfigure(config):
    # The first pair of blocks warms up.  Each measured block is compared
    # with the unmeasured block after it: a disturbance longer than a pair
    # of blocks shifts both alike.
    medians = [statistics.median(_blocks[b]) for b in sorted(_blocks)]
    pairs = [medians[b] - medians[b + 1] for b in range(2, len(medians) - 1, 2)]
    with open(os.environ["PERTEST_CPU_OUT"], "w") as f:
        f.write(repr({"measured": statistics.median(_times[True][BLOCK:]) / 1000,
                      "unmeasured": statistics.median(_times[False][BLOCK:]) / 1000,
                      "paired": statistics.median(pairs) / 1000}))
'''


# With PERTEST_CUDA_INIT=1 the session initialises CUDA and holds a tensor
# there, as a GPU suite does: each measured test then starts from the CUDA
# allocator's live totals (an uninitialised CUDA holds nothing to ask).
CONFTEST = '''
import os


def pytest_sessionstart(session):
    if os.environ.get("PERTEST_CUDA_INIT") == "1":
        import torch

        global HELD
        HELD = torch.zeros(1024, device="cuda")
'''


def write_suite(folder: str, n: int) -> None:
    with open(os.path.join(folder, "conftest.py"), "w") as f:
        f.write(CONFTEST)
    with open(os.path.join(folder, "protocol_timer.py"), "w") as f:
        f.write(TIMER)
    with open(os.path.join(folder, "interleave_timer.py"), "w") as f:
        f.write(INTERLEAVE)
    lines = ["import torch\n\n"]
    for i in range(n):
        lines.append(f"def test_{i}():\n    torch.ones(16)\n\n")
    with open(os.path.join(folder, "test_trivial.py"), "w") as f:
        f.write("".join(lines))
    with open(os.path.join(folder, "pytest.ini"), "w") as f:
        f.write("[pytest]\naddopts = -p no:cacheprovider -p no:randomly -p no:asyncio -p no:benchmark "
                "-p no:hypothesispytest -p no:cov -p no:xdist -p no:timeout -p no:rerunfailures\n")


CONFIGS = {
    "unmeasured": ["-p", "no:memlab"],
    "memlab": ["--memlab"],
    "memray": ["-p", "no:memlab", "--memray"],
}


def run_once(folder: str, args: list[str]) -> tuple[float, float]:
    """(wall seconds of the process, CPU seconds inside test protocols)."""
    cpu_out = os.path.join(folder, "cpu.txt")
    env = {**os.environ, "MEMLAB_CORE": os.environ.get("MEMLAB_CORE", "bridge"), "PERTEST_CPU_OUT": cpu_out,
           "PYTHONPATH": folder + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYTEST_ADDOPTS", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "protocol_timer", *args], cwd=folder,
                          env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    with open(cpu_out) as f:
        return elapsed, float(f.read())


def side_by_side(folder: str, cuda_init: bool = False, suite: str | None = None,
                 extra: tuple = ()) -> tuple[float, float, float]:
    """(median us per measured test, per unmeasured test, median of the
    differences between neighbouring blocks) in one process: the trivial
    suite in folder, or suite (the timing plugin read from folder) with
    extra pytest options."""
    cpu_out = os.path.join(folder, "cpu.txt")
    env = {**os.environ, "MEMLAB_CORE": os.environ.get("MEMLAB_CORE", "bridge"), "PERTEST_CPU_OUT": cpu_out,
           "PYTHONPATH": folder + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PERTEST_CUDA_INIT": "1" if cuda_init else "0"}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "interleave_timer", "--memlab", *extra],
                          cwd=suite or folder, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the side-by-side run failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    with open(cpu_out) as f:
        medians = eval(f.read(), {})
    return medians["measured"], medians["unmeasured"], medians["paired"]


def profile(folder: str) -> str:
    """Where memlab's time goes in one --memlab run: its functions by
    cumulative time."""
    out = os.path.join(folder, "prof.out")
    subprocess.run([sys.executable, "-m", "cProfile", "-o", out, "-m", "pytest", "-q", "--memlab"], cwd=folder,
                   capture_output=True, text=True, env={**os.environ, "MEMLAB_CORE": "bridge"})
    import io
    import pstats

    buf = io.StringIO()
    stats = pstats.Stats(out, stream=buf)
    stats.sort_stats("cumulative").print_stats("pytest_memlab", 25)
    return buf.getvalue()


def side_table(rounds: list[tuple[float, float, float]], target: bool = True) -> list[str]:
    rows = ["| round | measured (us) | unmeasured (us) | added: medians (us) | added: block pairs (us) |",
            "| --- | --- | --- | --- | --- |"]
    for r, (m, u, p) in enumerate(rounds, 1):
        rows.append(f"| {r} | {m:.1f} | {u:.1f} | {m - u:.1f} | {p:.1f} |")
    medians = statistics.median(m - u for m, u, _ in rounds)
    paired = statistics.median(p for _, _, p in rounds)
    aim = f" (target <= {TARGET_US:.0f} us)" if target else ""   # (the trivial test's)
    rows.append(f"| median | | | {medians:.1f} | **{paired:.1f}**{aim} |")
    return rows


def suite_side_by_side(suite: str, rounds: int, extra: list[str], out: str | None) -> None:
    """--suite: the side-by-side rounds in a suite of one's own."""
    side = []
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "interleave_timer.py"), "w") as f:
            f.write(INTERLEAVE)
        for r in range(rounds):
            side.append(side_by_side(folder, suite=suite, extra=tuple(extra)))
            print(f"round {r + 1}: measured {side[-1][0]:.1f} us, unmeasured {side[-1][1]:.1f} us per test, "
                  f"block pairs {side[-1][2]:.1f} us", flush=True)
    import platform

    rows = [f"`{suite}` `--memlab {' '.join(extra)}`, side by side in one process (blocks of 25 tests measured "
            f"and not), {rounds} rounds; Python {platform.python_version()}", ""] + side_table(side, target=False)
    table = "\n".join(rows)
    print(table)
    if out:
        with open(out, "a") as f:
            f.write(table + "\n\n")


def main() -> None:
    argv, extra = split_pytest_args(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="append the table (markdown) to this file")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-memray", action="store_true", help="leave pytest-memray out (it takes minutes)")
    ap.add_argument("--side-only", action="store_true",
                    help="only the side-by-side rounds (no whole-process configurations)")
    ap.add_argument("--suite", help="only the side-by-side rounds, in this suite (a folder), with the pytest "
                    "options after --")
    args = ap.parse_args(argv)
    from bench_suite import installed_bytecode

    installed_bytecode()   # as an installed wheel has it (this VM sets PYTHONDONTWRITEBYTECODE)
    if args.suite:
        suite_side_by_side(os.path.abspath(args.suite), args.rounds, extra, args.out)
        return
    import torch

    cuda = torch.cuda.is_available()
    configs = dict(CONFIGS)
    if args.no_memray or importlib.util.find_spec("pytest_memray") is None:
        del configs["memray"]
    side: list[tuple[float, float, float]] = []
    side_cuda: list[tuple[float, float, float]] = []
    if args.side_only:
        configs = {"unmeasured": configs["unmeasured"]}
    times: dict[str, list[float]] = {name: [] for name in configs}
    cpu: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as folder:
        write_suite(folder, args.tests)
        run_once(folder, configs["unmeasured"])  # warm the file system and the bytecode caches
        for r in range(args.rounds):
            for name, cfg in configs.items():
                wall, in_tests = run_once(folder, cfg)
                times[name].append(wall)
                cpu[name].append(in_tests)
            side.append(side_by_side(folder))
            print(f"round {r + 1}: side by side, measured {side[-1][0]:.1f} us, unmeasured {side[-1][1]:.1f} us "
                  f"per test, block pairs {side[-1][2]:.1f} us", flush=True)
            if cuda:
                side_cuda.append(side_by_side(folder, cuda_init=True))
                print(f"round {r + 1}: side by side, CUDA initialised, measured {side_cuda[-1][0]:.1f} us, "
                      f"unmeasured {side_cuda[-1][1]:.1f} us per test, block pairs {side_cuda[-1][2]:.1f} us",
                      flush=True)
            print(f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f}s ({cpu[n][-1]:.2f}s in tests)"
                                                 for n in times), flush=True)
        report = profile(folder) if args.profile else ""
    base = statistics.median(times["unmeasured"])
    base_cpu = statistics.median(cpu["unmeasured"])
    import platform

    rows = [f"{args.tests} trivial tests (`torch.ones(16)`), {args.rounds} alternating rounds, median wall time; "
            f"Python {platform.python_version()}, torch {torch.__version__}, "
            f"{'sys.monitoring' if sys.version_info >= (3, 12) else 'PyEval_SetTrace'} tracer",
            "",
            "| configuration | wall, median (s) | ratio | added per test, wall (us) | CPU in test protocols (s) "
            "| ratio | added per test, CPU (us) | target |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, values in times.items():
        med = statistics.median(values)
        med_cpu = statistics.median(cpu[name])
        added = (med - base) / args.tests * 1e6
        added_cpu = (med_cpu - base_cpu) / args.tests * 1e6
        target = f"<= {TARGET_US:.0f} us, <= {TARGET_RATIO:.2f}x" if name == "memlab" else ""
        rows.append(f"| {name} | {med:.3f} | {med / base:.3f}x | {added:.0f} | {med_cpu:.3f} | "
                    f"{med_cpu / base_cpu:.3f}x | {added_cpu:.0f} | {target} |")
    rows += ["", "Side by side in one `--memlab` process (blocks of 25 tests measured and not; "
             "medians of the test protocols, and the median difference between each measured block and "
             "the unmeasured block after it; each round's process its own):", ""] + side_table(side)
    if side_cuda:
        rows += ["", "The same with CUDA initialised by the session and a tensor held there (a GPU suite: "
                 "each measured test reads the CUDA allocator's totals when it starts):", ""] + side_table(side_cuda)
    table = "\n".join(rows)
    print(table)
    if report:
        print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table + "\n\n")


if __name__ == "__main__":
    main()
