"""What measuring a child process costs at its start: the same Python child
started with and without the variable that arms the start-up hook
(pytest_memlab_children.pth, installed first), rounds alternating.

Two figures:
  the hook          python -c pass, armed and not: the hook's own import in
                    a child that never imports torch (wall time, medians)
  the measurement   in a child that has imported torch: memlab's start (what
                    the hook does when torch's import finishes: the engine,
                    the bridge, the tracer) and its figures written at exit,
                    each timed inside the child (a whole child's wall time
                    is dominated by torch's import, whose spread is larger
                    than what is measured here)

    python bench/bench_children.py [--rounds R] [--out FILE]

  a harness child   a child that imports torch, then a large test harness
                    (torch's multi-process harness, common_distributed, or
                    modules of its weight where expecttest is missing) and
                    runs a short body, armed and not: what a real suite's
                    rank pays (the tracer runs over the harness's import)

Target (README, issue 21): at most 50 ms added per child.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_suite import print_summary  # noqa: E402

TARGET_MS = 50.0

TIMED = """
import json, sys, time, torch
from pytest_memlab.children import startup
config = json.loads(sys.argv[1])
t0 = time.perf_counter()
startup._start(config)
t1 = time.perf_counter()
x = torch.empty(2**20, dtype=torch.uint8)
del x
t2 = time.perf_counter()
startup._child.finish()
t3 = time.perf_counter()
print(json.dumps({"start": (t1 - t0) * 1e3, "finish": (t3 - t2) * 1e3}))
"""


HARNESS = """
import json, time, torch
t0 = time.perf_counter()
try:
    import torch.testing._internal.common_distributed  # noqa: F401  the multi-process harness
    what = "torch.testing._internal.common_distributed"
except ImportError:   # it needs expecttest: modules of the same weight
    import torch.distributed.fsdp, torch.distributed.checkpoint, torch.nn.parallel, torch.testing  # noqa
    what = "torch.distributed.fsdp, torch.distributed.checkpoint, torch.nn.parallel, torch.testing"
t1 = time.perf_counter()
x = torch.ones(1 << 16)
for _ in range(50):
    x = torch.nn.functional.relu(x * 2 - 1)
t2 = time.perf_counter()
print(json.dumps({"import": (t1 - t0) * 1e3, "body": (t2 - t1) * 1e3, "what": what}))
"""


def start(code: str, env: dict, *args: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from pytest_memlab import __version__
    from pytest_memlab.children import startup_hook
    from pytest_memlab.children.startup import ENV

    why = startup_hook.ensure()
    if why:
        print(why)
        return 1
    # Bytecode written as a user's Python writes it (the warm-up run below
    # caches it): PYTHONDONTWRITEBYTECODE would make every child compile
    # memlab's modules afresh.
    plain = {k: v for k, v in os.environ.items() if k not in (ENV, "PYTHONDONTWRITEBYTECODE")}
    with tempfile.TemporaryDirectory() as folder:
        config = json.dumps({"dir": os.path.join(folder, "t"), "devices": ["cpu"], "rootdir": os.getcwd(),
                             "include": [], "version": __version__, "top": 5})
        armed = dict(plain, **{ENV: config})
        start("pass", plain), start("pass", armed)   # warm the page cache, write the bytecode
        off, on = [], []
        for _ in range(4 * args.rounds):   # cheap, and small beside the start's own spread
            off.append(start("pass", plain)[0])
            on.append(start("pass", armed)[0])
        hook = (statistics.median(on) - statistics.median(off)) * 1e3
        print(f"the hook: python -c pass {statistics.median(off) * 1e3:.1f} ms, armed "
              f"{statistics.median(on) * 1e3:.1f} ms, added {hook:.1f} ms")
        start(TIMED, plain, config)
        timed = [json.loads(start(TIMED, plain, config)[1]) for _ in range(args.rounds)]
        begin = statistics.median(t["start"] for t in timed)
        finish = statistics.median(t["finish"] for t in timed)
        print(f"the measurement: start {begin:.1f} ms, figures at exit {finish:.1f} ms")
        start(HARNESS, plain), start(HARNESS, armed)
        runs = {"off": [], "on": []}
        for _ in range(args.rounds):   # alternating
            runs["off"].append(json.loads(start(HARNESS, plain)[1]))
            runs["on"].append(json.loads(start(HARNESS, armed)[1]))
        h = {k: {part: statistics.median(r[part] for r in v) for part in ("import", "body")}
             for k, v in runs.items()}
        what = runs["off"][0]["what"]
        print(f"a harness child ({what}): import {h['off']['import']:.1f} -> {h['on']['import']:.1f} ms, "
              f"body {h['off']['body']:.1f} -> {h['on']['body']:.1f} ms")
    import torch

    lines = [
        f"{time.strftime('%Y-%m-%d')}, {platform.node() or 'this machine'}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {args.rounds} rounds:",
        "",
        "| what a measured child adds | ms (median) |",
        "| --- | --- |",
        f"| the start-up hook, armed (python -c pass: {statistics.median(off) * 1e3:.1f} ms unarmed) | {hook:.1f} |",
        f"| the measurement's start, at torch's import (engine, bridge, tracer) | {begin:.1f} |",
        f"| the figures written at exit | {finish:.1f} |",
        f"| **a child that imports torch, in all** | **{hook + begin + finish:.1f}**"
        f"{'' if hook + begin + finish <= TARGET_MS else ' (over the target)'} |",
        "",
        f"(target <= {TARGET_MS:.0f} ms added per child)",
        "",
        f"A harness child (imports torch, then {what}; a short body), unarmed -> armed, medians:",
        "",
        "| part | unarmed ms | armed ms | added ms |",
        "| --- | --- | --- | --- |",
        *(f"| {part} | {h['off'][part]:.1f} | {h['on'][part]:.1f} | {h['on'][part] - h['off'][part]:.1f} |"
          for part in ("import", "body")),
    ]
    text = "\n".join(lines)
    print_summary(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
