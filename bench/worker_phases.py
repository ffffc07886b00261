"""A pytest plugin for `ci/gpu startup` (``-p worker_phases``, with bench/ on
the path): in each pytest-xdist worker (or a serial process), when each
phase of its start came, from the process's own start (the kernel's
clock for it, /proc/self/stat) to its first test's end, and how long
its first test's setup took against the rest's.  Written as JSON to
$WORKER_PHASES.<worker id> at the end.  It tells where a measured worker's
start goes that a plain one's does not (issue 50: kornia's packed and
measured -n runs took longer from configure to the first report)."""

import json
import os
import sys
import time

import pytest

_marks: dict[str, float] = {}
_setup: list[float] = []


def _process_start() -> float | None:
    """The process's start on the wall clock (the kernel's starttime in
    clock ticks since boot, against /proc/uptime)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


_marks["plugin imported"] = time.time()


def _on() -> bool:
    return bool(os.environ.get("WORKER_PHASES"))


def pytest_configure(config):
    if _on():
        _marks["configure"] = time.time()


def pytest_collection_finish(session):
    if _on():
        _marks["collected"] = time.time()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    t = time.perf_counter()
    try:
        return (yield)
    finally:
        _setup.append(time.perf_counter() - t)


def pytest_runtest_logstart(nodeid, location):
    if _on():
        _marks.setdefault("first test starts", time.time())


def pytest_runtest_logfinish(nodeid, location):
    if _on():
        _marks.setdefault("first test ends", time.time())
        _marks["last test ends"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if not _on():
        return
    _marks["unconfigure"] = time.time()
    start = _process_start()
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    out = {"process start": start, "marks": _marks, "setups": len(_setup),
           "first setup s": _setup[0] if _setup else None,
           "setup s, the rest": sum(_setup[1:]) if len(_setup) > 1 else 0.0}
    with open(f"{os.environ['WORKER_PHASES']}.{worker}", "w") as f:
        json.dump(out, f)


def summarize(prefix: str) -> str:
    """One line a worker: each phase's time from the process's start."""
    import glob

    lines = []
    for path in sorted(glob.glob(prefix + ".*")):
        with open(path) as f:
            d = json.load(f)
        t0 = d["process start"] or d["marks"]["plugin imported"]
        steps = ", ".join(f"{k} {v - t0:.2f}" for k, v in sorted(d["marks"].items(), key=lambda kv: kv[1]))
        setups = (f"; first setup {d['first setup s']:.3f} s, the other {d['setups'] - 1} setups "
                  f"{d['setup s, the rest']:.3f} s") if d["setups"] else ""
        lines.append(f"{path.rsplit('.', 1)[1]}: {steps}{setups}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(sys.argv[1]))
