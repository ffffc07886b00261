"""What a CPU allocation event costs, measured in one process, side by side:
a loop of tiny CPU ops (``x * 2`` then ``+ 1`` on 64 floats) unmeasured,
measured through memlab's CPU allocator, and measured through torch's
reporting path (the fallback), rounds alternating.

    python bench/bench_cpu_events.py [--ops N] [--rounds R] [--out FILE]

Prints the nanoseconds each measured run adds per event (an allocation or a
free the engine heard) over the unmeasured loop, and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pytest_memlab.engine.backend import core
from pytest_memlab.measuring.measurement import Measurement


def loop(ops: int) -> None:
    x = torch.ones(64)
    for _ in range(ops):
        y = x * 2
        y = y + 1


def timed(ops: int, measured: bool) -> tuple[float, int]:
    m = None
    if measured:
        m = Measurement(core(), ["cpu"])
        m.begin()
    t0 = time.perf_counter()
    loop(ops)
    took = time.perf_counter() - t0
    events = 0
    if m is not None:
        fig = m.end()["cpu"]
        events = fig.allocs + fig.frees
    return took, events


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out")
    a = p.parse_args()
    bridge = core().bridge
    if bridge is None:
        raise SystemExit("bench_cpu_events: needs the torch bridge")
    loop(10_000)
    runs: dict[str, list[float]] = {"unmeasured": [], "allocator": [], "reporter": []}
    events = {}
    for _ in range(a.rounds):
        for name in runs:
            if name == "reporter":
                bridge.restore_cpu_allocator()
                bridge.cpu_allocator = "the reporter's round"
            elif name == "allocator" and bridge.cpu_allocator is not True:
                bridge.cpu_allocator = None
                bridge.install_cpu_allocator()
            took, n = timed(a.ops, name != "unmeasured")
            runs[name].append(took)
            if n:
                events[name] = n
    base = statistics.median(runs["unmeasured"])
    lines = [f"{a.ops} iterations of `y = x * 2; y = y + 1` on 64 floats, {a.rounds} rounds alternating, "
             f"medians (torch {torch.__version__}):", "",
             "| run | s | per op (us) | events | added per event (ns) | ratio |", "| --- | --- | --- | --- | --- | --- |"]
    for name, times in runs.items():
        med = statistics.median(times)
        n = events.get(name, 0)
        added = (med - base) / n * 1e9 if n else 0.0
        lines.append(f"| {name} | {med:.3f} | {med / (2 * a.ops) * 1e6:.2f} | {n} | "
                     f"{added:.0f} | {med / base:.3f}x |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
