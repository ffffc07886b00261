"""Issue 19's shape without the third-party suite: a generated suite of
2000+ tests in a process with a large heap, unmeasured, under ``--memlab``
(the leak check on, a warning for unmarked tests) and under
``--memlab --memlab-leaks=off``, serially and with ``-n N`` (pytest-xdist,
the measured runs then also writing the JSON and HTML reports and updating
a baseline).  Targets: serial <= 1.05x, -n N <= 1.10x of the unmeasured run
of the same mode.

    python bench/bench_leak_suite.py [--tests 2000] [--rounds 2] [--xdist 4]
        [--heap 400000] [--budget SECONDS] [--keep DIR] [--out FILE]

The suite (``--keep DIR`` keeps it, and every run's junit, log and reports,
in DIR; otherwise a temp folder):

- conftest.py imports torch, torch._dynamo, numpy, sympy (scipy, pandas and
  onnx too where importable) and builds ``--heap`` small live records in
  module-level structures, so that a full ``gc.collect()`` costs what it
  costs in a real project's process (printed: the probe run measures it
  after collection, every test module imported);
- test files of 100 tests each (the last one shorter), by the test's global
  index g:
  - g % 10 == 3: ``test_cycle``: leaves its tensors in reference cycles that
    only the cyclic collector frees (four variants: an object that refers to
    itself; an autograd graph referenced from a self-referencing dict; a
    closure cycle; a module and its loss in a cycle after a training step);
  - g % 25 == 7: ``test_cache``: fills a module-global dict of constant
    tensors keyed by (dtype, device, size) when the key is missing (15 keys
    shared by all cache tests, so the cache stops growing after the first 15
    of them in a process);
  - ``--leaks`` (default 4) tests spread over the suite: ``test_leak_grows``,
    each appending a new tensor to a module-global list every time it runs;
  - the rest: ``test_small``: a few small matmuls, a tiny Linear forward and
    backward, nothing left behind.
  Every test passes, measured or not.  Tensors go to the device named by
  env TORCH_DEVICE (default cpu).

Each configuration is its own pytest process (bench_suite.run) with a junit
file; rounds alternate the configurations, each round starting each mode at
another one.  Reported per configuration: the median wall time and its ratio
to the unmeasured run of the same mode, the median of each round's own ratio
(the measured run against the unmeasured one of the same round: a host that
drifts between rounds cancels), the CPU time of the process and its workers
(user and system: what a loaded host disturbs least) and its ratio,
whether every test's outcome is the unmeasured serial run's, the tests memlab
warned of leaks for (its summary line, and by kind from the warnings the
conftest heard), and the JSON report's size per test and the HTML report's
size where written.  Exit status 1 when an outcome differs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_suite import installed_bytecode, outcomes, run  # noqa: E402

TARGETS = {"serial": 1.05, "xdist": 1.10}
PER_FILE = 100
KINDS = ("small", "cycle", "cache", "leak")

CONFTEST = '''\
"""The leak benchmark's process: big libraries imported and a large live
heap, so that a full gc.collect() costs what it does in a real project."""

import gc
import json
import os
import time

import numpy  # noqa: F401
import sympy  # noqa: F401
import torch
import torch.nn  # noqa: F401

IMPORTED = ["torch", "numpy", "sympy"]
for _name in ("torch._dynamo", "scipy", "scipy.linalg", "scipy.sparse", "pandas", "onnx"):
    try:
        __import__(_name)
        IMPORTED.append(_name)
    except Exception:
        pass

HEAP_RECORDS = {heap}


class _Record:
    def __init__(self, i, prev):
        self.i = i
        self.name = "r%d" % i
        self.prev = prev
        self.tags = [i, (i, self.name)]


HEAP = []
prev = None
for _i in range(HEAP_RECORDS):
    prev = _Record(_i, prev if _i % 64 else None)
    HEAP.append(prev)
INDEX = {{r.name: r for r in HEAP[::8]}}
del prev

import leakbench_helpers  # noqa: E402

_WARNED = []
_ALIVE = []
# The collector's work from the end of collection to the end of the
# session (the tests, and memlab's end): collections and seconds by
# generation.
_GC = {{"counting": False, "start": 0.0, "by_gen": [[0, 0.0], [0, 0.0], [0, 0.0]]}}


def _gc_timer(phase, info):
    if not _GC["counting"]:
        return
    if phase == "start":
        _GC["start"] = time.perf_counter()
    else:
        entry = _GC["by_gen"][info["generation"]]
        entry[0] += 1
        entry[1] += time.perf_counter() - _GC["start"]


gc.callbacks.append(_gc_timer)


def pytest_collection_finish(session):
    _GC["counting"] = True
    path = os.environ.get("LEAKBENCH_GC_PROBE")
    if not path:
        return
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    objects = gc.get_objects()
    tensors = sum(1 for o in objects if isinstance(o, torch.Tensor))
    walk = time.perf_counter() - t0
    with open(path, "w") as f:
        json.dump({{"gc_collect_s": times, "objects": len(objects), "get_objects_walk_s": walk,
                   "tensors": tensors, "imported": IMPORTED, "heap_records": HEAP_RECORDS,
                   "tests": len(session.items)}}, f)


def pytest_warning_recorded(warning_message, when, nodeid, location):
    # the end's warnings (nodeid "") name their test in the message: the log has them
    if warning_message.category.__name__ == "MemlabLeakWarning" and nodeid:
        _WARNED.append(nodeid)


def pytest_runtest_logfinish(nodeid, location):
    # The cycle tests' tensors still alive once pytest is done with the test
    # (no collection forced here: only weak references looked at).
    if leakbench_helpers.take_alive():
        _ALIVE.append(nodeid)


import pytest  # noqa: E402


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    yield   # memlab's end (the leak check's confirmation) runs inside
    _GC["counting"] = False
    path = os.environ.get("LEAKBENCH_STATS")
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{{path}}.{{worker}}.json", "w") as f:
            json.dump({{"warned": _WARNED, "cycles_alive_after_test": _ALIVE, "gc": _GC["by_gen"]}}, f)
'''

HELPERS = '''\
"""What the generated tests do, by kind."""

import os
import weakref

import torch

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))

_TRACKED = []


def _track(t):
    _TRACKED.append(weakref.ref(t))


def take_alive():
    alive = any(r() is not None for r in _TRACKED)
    _TRACKED.clear()
    return alive


def small_work(i):
    a = torch.randn(16, 16, device=DEVICE)
    b = torch.randn(16, 16, device=DEVICE)
    c = a @ b
    d = c @ a.T
    e = (d @ b).sum()
    model = torch.nn.Linear(16, 4).to(DEVICE)
    x = torch.randn(8, 16, device=DEVICE)
    loss = model(x).square().mean()
    loss.backward()
    assert model.weight.grad.shape == (4, 16)
    assert torch.isfinite(e)


class _Holder:
    def __init__(self):
        self.me = self


def cycle_work(i):
    variant = (i // 10) % 4
    if variant == 0:      # an object that refers to itself, holding tensors
        h = _Holder()
        h.t = torch.randn(64, 64, device=DEVICE)
        h.u = h.t @ h.t
        _track(h.u)
    elif variant == 1:    # an autograd graph (its saved tensors) referenced from a cycle
        w = torch.randn(32, 32, device=DEVICE, requires_grad=True)
        x = torch.randn(16, 32, device=DEVICE)
        y = torch.tanh(x @ w) @ w
        state = {"out": y, "w": w}
        state["self"] = state
        assert y.requires_grad
        _track(w)
    elif variant == 2:    # a closure cycle
        t = torch.randn(64, 64, device=DEVICE)

        def step():
            return step, t

        assert step()[1] is t
        _track(t)
    else:                 # a module and its loss in a cycle after a training step
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(DEVICE)
        loss = model(torch.randn(8, 32, device=DEVICE)).mean()
        loss.backward()
        model.__dict__["_last"] = (model, loss)
        _track(model[0].weight)


_CONSTS = {}
_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
_SIZES = (8, 16, 32, 64, 128)


def _const(dtype, n):
    key = (dtype, str(DEVICE), n)
    c = _CONSTS.get(key)
    if c is None:
        c = torch.linspace(0, 1, n, dtype=dtype, device=DEVICE)
        _CONSTS[key] = c
    return c


def cache_work(k):
    dtype = _DTYPES[k % 3]
    n = _SIZES[(k // 3) % 5]
    y = torch.ones(n, dtype=dtype, device=DEVICE) * _const(dtype, n)
    assert y.shape == (n,)


GROWING = []


def leak_work():
    GROWING.append(torch.randn(1024, device=DEVICE))
    assert GROWING[-1].numel() == 1024
'''


def plan(n_tests: int, n_leaks: int) -> list[str]:
    """The kind of each test, by global index."""
    kinds = []
    for g in range(n_tests):
        kinds.append("cycle" if g % 10 == 3 else "cache" if g % 25 == 7 else "small")
    for k in range(min(n_leaks, n_tests)):
        g = int(n_tests * (k + 0.5) / max(n_leaks, 1))
        while kinds[g % n_tests] != "small":
            g += 1
        kinds[g % n_tests] = "leak"
    return kinds


def generate(folder: str, n_tests: int, n_leaks: int, heap: int) -> dict[str, int]:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")
    with open(os.path.join(folder, "conftest.py"), "w") as f:
        f.write(CONFTEST.format(heap=heap))
    with open(os.path.join(folder, "leakbench_helpers.py"), "w") as f:
        f.write(HELPERS)
    kinds = plan(n_tests, n_leaks)
    n_cache = 0
    for fi, start in enumerate(range(0, n_tests, PER_FILE)):
        by_kind: dict[str, list[int]] = {k: [] for k in KINDS}
        cache_keys = []
        for g in range(start, min(start + PER_FILE, n_tests)):
            by_kind[kinds[g]].append(g)
            if kinds[g] == "cache":
                cache_keys.append(n_cache)
                n_cache += 1
        src = ["import pytest", "", "from leakbench_helpers import cache_work, cycle_work, leak_work, small_work", ""]
        if by_kind["small"]:
            src += ["", f"@pytest.mark.parametrize('i', {by_kind['small']})", "def test_small(i):",
                    "    small_work(i)", ""]
        if by_kind["cycle"]:
            src += ["", f"@pytest.mark.parametrize('i', {by_kind['cycle']})", "def test_cycle(i):",
                    "    cycle_work(i)", ""]
        if cache_keys:
            src += ["", f"@pytest.mark.parametrize('k', {cache_keys})", "def test_cache(k):",
                    "    cache_work(k)", ""]
        for g in by_kind["leak"]:
            src += ["", f"def test_leak_grows_{g}():", "    leak_work()", ""]
        with open(os.path.join(folder, f"test_leak_suite_{fi:03d}.py"), "w") as f:
            f.write("\n".join(src))
    return {k: kinds.count(k) for k in KINDS}


def kind_of(nodeid: str) -> str:
    for k in KINDS:
        if f"::test_{k}" in nodeid:
            return k
    return "other"


def probe_gc(suite: str, work: str) -> dict:
    path = os.path.join(work, "gc_probe.json")
    env = dict(os.environ, LEAKBENCH_GC_PROBE=path)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:memlab", "-p", "no:randomly",
                    "-p", "no:cacheprovider", "-p", "no:xdist"], cwd=suite, env=env, capture_output=True, text=True)
    with open(path) as f:
        return json.load(f)


def summary_count(log: str) -> int | None:
    m = re.search(r"(\d+) tests? left tensors allocated after teardown", log)
    return int(m.group(1)) if m else None


def warned_in_log(log: str) -> set[str]:
    """The node ids of pytest's warnings summary that a MemlabLeakWarning names
    (under the test's id, or "in NODEID" in the message when memlab confirms a
    leak at the session's end)."""
    found, where, inside = set(), [], False
    for line in log.splitlines():
        if "warnings summary" in line:
            inside = True
            continue
        if not inside:
            continue
        if line.startswith("-- Docs:") or line.startswith("====="):
            break
        if line and not line[0].isspace():
            where = [line.strip()] if not where or where[-1] != "" else [line.strip()]
        elif "MemlabLeakWarning" in line:
            m = re.search(r" in (\S+::\S+?)[,\s]", line + " ")
            if m:
                found.add(m.group(1))
            else:
                found.update(w for w in where if "::" in w)
    return found


def fmt_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def json_sizes(path: str) -> tuple[int, float, int] | None:
    """(tests, median bytes per test entry, file bytes)."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        data = json.load(f)
    sizes = [len(json.dumps(t, indent=2, sort_keys=True)) for t in data.get("tests", [])]
    return len(sizes), statistics.median(sizes) if sizes else 0, os.path.getsize(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", type=int, default=2000)
    ap.add_argument("--leaks", type=int, default=4, help="tests that truly leak (a growing module-global list)")
    ap.add_argument("--heap", type=int, default=400000, help="live records conftest.py builds (each a few objects)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--xdist", type=int, default=4, help="the -n of the xdist configurations; 0 skips them")
    ap.add_argument("--no-serial", action="store_true", help="skip the serial configurations")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds: start no round (or configuration) that would end past this")
    ap.add_argument("--keep", metavar="DIR", help="generate the suite and keep every run's files in DIR")
    ap.add_argument("--out", help="append the summary (markdown) to this file")
    ap.add_argument("--tree", metavar="DIR",
                    help="measure the pytest_memlab of DIR (a checkout with its extensions built in place, "
                         "prepended to PYTHONPATH) instead of the installed one; the commit reported is DIR's")
    args = ap.parse_args()
    start = time.perf_counter()

    if args.keep:
        work = os.path.abspath(args.keep)
        os.makedirs(work, exist_ok=True)
        tmp = None
    else:
        tmp = tempfile.TemporaryDirectory(prefix="memlab-leak-suite-")
        work = tmp.name
    suite = os.path.join(work, "suite")
    if os.path.isdir(suite):
        shutil.rmtree(suite)
    counts = generate(suite, args.tests, args.leaks, args.heap)
    runs_dir = os.path.join(work, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args.tree:
        tree = os.path.abspath(args.tree)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)
    installed_bytecode(tree)
    commit = subprocess.run(["git", "log", "--oneline", "-1"], cwd=tree, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "pytest_memlab", "csrc"],
                           cwd=tree, capture_output=True, text=True).stdout.strip()
    where = subprocess.run([sys.executable, "-c", "import pytest_memlab; print(pytest_memlab.__file__)"],
                           cwd=suite, capture_output=True, text=True).stdout.strip()
    print(f"pytest_memlab from {where}", flush=True)
    device = os.environ.get("TORCH_DEVICE", "cpu")
    print(f"suite: {suite}: {args.tests} tests: " + ", ".join(f"{v} {k}" for k, v in counts.items())
          + f"; device {device}; commit {commit}{' (pytest_memlab/csrc modified in the tree)' if dirty else ''}",
          flush=True)
    gc_info = probe_gc(suite, runs_dir)
    gc_s = statistics.median(gc_info["gc_collect_s"])
    print(f"heap: {gc_info['objects']} gc-tracked objects ({gc_info['heap_records']} records built, imported "
          f"{', '.join(gc_info['imported'])}); full gc.collect(): {gc_s:.3f} s (median of 3); one walk of "
          f"gc.get_objects(): {gc_info['get_objects_walk_s']:.3f} s", flush=True)

    base = ["-p", "no:randomly", "-p", "no:cacheprovider"]
    configs: list[tuple[str, str, list[str]]] = [] if args.no_serial else [
        ("serial", "unmeasured", ["-p", "no:memlab"]),
        ("serial", "--memlab", ["--memlab"]),
        ("serial", "--memlab --memlab-leaks=off", ["--memlab", "--memlab-leaks=off"]),
    ]
    if args.xdist:
        configs += [
            ("xdist", "unmeasured", ["-n", str(args.xdist), "-p", "no:memlab"]),
            ("xdist", "--memlab +reports", ["-n", str(args.xdist), "--memlab"]),
            ("xdist", "--memlab --memlab-leaks=off +reports", ["-n", str(args.xdist), "--memlab", "--memlab-leaks=off"]),
        ]
    # each mode's unmeasured configuration: what its measured ones are compared with
    ref_of = {mode: next(i for i, c in enumerate(configs) if c[0] == mode and c[1] == "unmeasured")
              for mode in {c[0] for c in configs}}
    baseline = os.path.join(runs_dir, "baseline.json")
    times: dict[int, list[float]] = {i: [] for i in range(len(configs))}
    cpus: dict[int, list[float]] = {i: [] for i in range(len(configs))}
    paired: dict[int, list[float]] = {i: [] for i in range(len(configs))}   # a round's time / its unmeasured one
    loads: dict[int, list[float]] = {i: [] for i in range(len(configs))}
    results: dict[tuple[int, int], dict] = {}
    logs: dict[tuple[int, int], str] = {}
    stats: dict[tuple[int, int], dict] = {}
    reports: dict[tuple[int, int], tuple[str, str]] = {}
    round_times: list[float] = []

    def fits(seconds: float) -> bool:
        return not args.budget or time.perf_counter() - start + seconds <= args.budget

    for r in range(args.rounds):
        if round_times and not fits(statistics.mean(round_times)):
            print(f"round {r + 1}: skipped (--budget {args.budget:.0f} s)", flush=True)
            break
        print(f"round {r + 1}", flush=True)
        t_round = time.perf_counter()
        # each round starts each mode at another configuration: a drifting
        # host favours none
        order = []
        for mode in dict.fromkeys(c[0] for c in configs):
            group = [i for i, c in enumerate(configs) if c[0] == mode]
            order += group[r % len(group):] + group[:r % len(group)]
        this_round: dict[int, float] = {}
        for ci in order:
            mode, label, cargs = configs[ci]
            if times[ci] and not fits(statistics.mean(times[ci])):
                print(f"  {mode} {label}: skipped (--budget {args.budget:.0f} s)", flush=True)
                continue
            tag = f"{mode}-{ci}-{r}"
            junit = os.path.join(runs_dir, f"{tag}.xml")
            extra = list(cargs)
            if mode == "xdist" and "--memlab" in cargs:
                j, h = os.path.join(runs_dir, f"{tag}.json"), os.path.join(runs_dir, f"{tag}.html")
                extra += [f"--memlab-json={j}", f"--memlab-html={h}", f"--memlab-baseline={baseline}",
                          "--memlab-update-baseline"]
                reports[(ci, r)] = (j, h)
            stats_path = os.path.join(runs_dir, f"{tag}.stats")
            os.environ["LEAKBENCH_STATS"] = stats_path
            try:
                # measured=True only so that run() keeps the log (junit + ".log")
                times[ci].append(run(suite, base, junit, True, extra, f"{mode} {label}", cpus[ci]))
                this_round[ci] = times[ci][-1]
            finally:
                del os.environ["LEAKBENCH_STATS"]
            loads[ci].append(os.getloadavg()[0])
            print(f"    load average (1 min) after it: {loads[ci][-1]:.1f} on {os.cpu_count()} CPUs", flush=True)
            results[(ci, r)] = outcomes(junit)
            with open(junit + ".log") as f:
                logs[(ci, r)] = f.read()
            st = {"warned": set(), "alive": set(), "gc": [[0, 0.0], [0, 0.0], [0, 0.0]]}
            for p in glob.glob(stats_path + ".*.json"):
                with open(p) as f:
                    d = json.load(f)
                st["warned"].update(d["warned"])
                st["alive"].update(d["cycles_alive_after_test"])
                for g, (n, secs) in enumerate(d.get("gc", [])):
                    st["gc"][g][0] += n
                    st["gc"][g][1] += secs
            print("    the collector from collection's end to the session's end: "
                  + ", ".join(f"generation {g}: {n} ({secs:.2f} s)" for g, (n, secs) in enumerate(st["gc"])),
                  flush=True)
            stats[(ci, r)] = st
        for ci, t in this_round.items():
            unmeasured = this_round.get(ref_of[configs[ci][0]])
            if unmeasured:
                paired[ci].append(t / unmeasured)
        round_times.append(time.perf_counter() - t_round)

    ref = results.get((0, 0), {})
    problems = []
    for (ci, r), res in sorted(results.items()):
        mode, label, _ = configs[ci]
        if len(res) != args.tests:
            problems.append(f"{mode} {label} round {r + 1}: {len(res)} tests in its junit, not {args.tests}")
        for name in sorted(set(ref) | set(res)):
            a, b = ref.get(name, ("absent", False))[0], res.get(name, ("absent", False))[0]
            if a != b or b != "passed":
                problems.append(f"{mode} {label} round {r + 1}: {name}: {a} unmeasured serial, {b} here")

    def med(ci):
        return statistics.median(times[ci]) if times[ci] else None

    rows = [("mode", "configuration", "median wall (s)", "ratio", "target", "paired ratio (median)",
             "CPU (s)", "CPU ratio", "outcomes identical",
             "tests warned (summary line)", "warned by kind", "caches reported", "JSON per test (median) / total", "HTML", "each round (s)",
             "load avg after (1 min)")]
    for ci, (mode, label, _) in enumerate(configs):
        if not times[ci]:
            continue
        ref_t = med(ref_of[mode])
        ratio = med(ci) / ref_t if ref_t else float("nan")
        bad = [p for p in problems if p.startswith(f"{mode} {label} ")]
        last = max(r for (c, r) in results if c == ci)
        n_sum = summary_count(logs[(ci, last)])
        warned = stats[(ci, last)]["warned"] | warned_in_log(logs[(ci, last)])
        caches = [ln for ln in logs[(ci, last)].splitlines() if re.match(r"\S+ cache: ", ln)]
        by_kind = {}
        for n in warned:
            by_kind[kind_of(n)] = by_kind.get(kind_of(n), 0) + 1
        kinds_txt = ", ".join(f"{v} {k}" for k, v in sorted(by_kind.items())) or "-"
        js, html = "-", "-"
        if (ci, last) in reports:
            j, h = reports[(ci, last)]
            s = json_sizes(j)
            if s:
                js = f"{fmt_size(s[1])} / {fmt_size(s[2])} ({s[0]} tests)"
            if os.path.exists(h):
                html = fmt_size(os.path.getsize(h))
        measured = label != "unmeasured"
        cpu, cpu_ref = statistics.median(cpus[ci]), statistics.median(cpus[ref_of[mode]] or [float("nan")])
        rows.append((mode if mode == "serial" else f"-n {args.xdist}", label, f"{med(ci):.1f}",
                     f"**{ratio:.2f}x**" if measured else "1.00x",
                     f"<= {TARGETS[mode]:.2f}x" if measured else "",
                     f"{statistics.median(paired[ci]):.3f}x ({', '.join(f'{x:.2f}' for x in paired[ci])})"
                     if measured and paired[ci] else "",
                     f"{cpu:.1f}", f"{cpu / cpu_ref:.3f}x" if measured else "1.000x",
                     "yes" if not bad else f"NO ({len(bad)})",
                     "-" if n_sum is None else str(n_sum), kinds_txt, str(len(caches)) if measured else "-", js, html,
                     "/".join(f"{t:.1f}" for t in times[ci]), "/".join(f"{x:.1f}" for x in loads[ci])))
    table = "\n".join("| " + " | ".join(row) + " |" + ("\n|" + " --- |" * len(row) if i == 0 else "")
                      for i, row in enumerate(rows))
    alive = stats.get((0, 0), {}).get("alive", set())
    head = [
        f"`bench/bench_leak_suite.py --tests {args.tests} --rounds {args.rounds} --xdist {args.xdist} "
        f"--heap {args.heap}{' --tree ' + args.tree if args.tree else ''}` at `{commit}`{' (pytest_memlab/csrc modified in the tree)' if dirty else ''}, "
        f"device {device}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs",
        "",
        f"- suite: {args.tests} tests in {-(-args.tests // PER_FILE)} files: "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
        + f"; all pass unmeasured and measured: {'yes' if not problems else 'NO'}",
        f"- heap: {gc_info['objects']} gc-tracked objects (imported {', '.join(gc_info['imported'])}; "
        f"{gc_info['heap_records']} records built); one full gc.collect(): {gc_s:.3f} s; "
        f"a walk of gc.get_objects(): {gc_info['get_objects_walk_s']:.3f} s",
        f"- cycle tests whose tensors were still alive when pytest was done with them (unmeasured serial, "
        f"no collection forced): {len(alive)} of {counts['cycle']}",
        "",
    ]
    text = "\n".join(head) + table
    print()
    print(text)
    for p in problems[:30]:
        print("  " + p)
    for ci, (mode, label, _) in enumerate(configs):
        rs = [r for (c, r) in stats if c == ci]
        if not rs:
            continue
        w = stats[(ci, max(rs))]["warned"] | warned_in_log(logs[(ci, max(rs))])
        if w:
            print(f"  warned ({mode} {label}): " + ", ".join(sorted(w)[:40]))
        for ln in logs[(ci, max(rs))].splitlines():
            if re.match(r"\S+ cache: ", ln):
                print(f"  ({mode} {label}) {ln}")
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")
    if tmp is not None:
        tmp.cleanup()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
