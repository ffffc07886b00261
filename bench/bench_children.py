"""What measuring a child process costs at its start: the same Python child
started with and without the variable that arms the start-up hook
(pytest_memlab_children.pth, installed first), side by side, rounds
alternating; the added start-up cost is the difference of the medians.

Three children:
  python -c pass              no torch: the hook's own import only
  python -c "import torch"    the measurement starts at torch's import
  torch + a 1 MiB tensor      and the figures written at exit

    python bench/bench_children.py [--rounds R] [--out FILE]

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

TARGET_MS = 50.0

CHILDREN = [
    ("python -c pass (no torch)", "pass"),
    ("import torch", "import torch"),
    ("torch, a 1 MiB tensor", "import torch; x = torch.empty(2**20, dtype=torch.uint8)"),
]


def start(code: str, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - t0


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
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        armed = dict(plain)
        armed[ENV] = json.dumps({"dir": os.path.join(folder, "t"), "devices": ["cpu"], "rootdir": os.getcwd(),
                                 "include": [], "version": __version__, "top": 5})
        for label, code in CHILDREN:
            start(code, plain)   # warm the page cache and the bridge's build cache
            start(code, armed)
            off, on = [], []
            for _ in range(args.rounds):
                off.append(start(code, plain))
                on.append(start(code, armed))
            added = (statistics.median(on) - statistics.median(off)) * 1e3
            rows.append((label, statistics.median(off) * 1e3, statistics.median(on) * 1e3, added))
            print(f"{label}: unmeasured {rows[-1][1]:.1f} ms, measured {rows[-1][2]:.1f} ms, added {added:.1f} ms")
        written = [n for n in os.listdir(os.path.join(folder, "t"))] if os.path.isdir(os.path.join(folder, "t")) else []
    import torch

    lines = [
        f"{time.strftime('%Y-%m-%d')}, {platform.node() or 'this machine'}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {args.rounds} rounds alternating (median wall time of a child's whole run):",
        "",
        "| child | unmeasured (ms) | measured (ms) | added (ms) |",
        "| --- | --- | --- | --- |",
    ]
    for label, off, on, added in rows:
        mark = "" if added <= TARGET_MS else " (over the target)"
        lines.append(f"| {label} | {off:.1f} | {on:.1f} | **{added:.1f}**{mark} |")
    lines.append("")
    lines.append(f"({len(written)} figures files written by the measured children; target <= {TARGET_MS:.0f} ms added)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
