"""Overhead of measuring, as ratios to the unmeasured run, side by side.

Workloads (CUDA):
  transformer  4-layer TransformerEncoder, d=512, batch 32x128, AdamW, 10 steps
  launch       20k tiny CUDA ops (x = x + 1 on 16 floats): one alloc and one
               free per op, the worst case for a per-event hook
Configurations, each in its own process (the CUDA trace tracker cannot be
detached once attached, so an "unmeasured" run in a process that attached it
would not be unmeasured):
  unmeasured   plain torch
  memlab       a test's measurement (bridge reporter + CUDA trace tracker)
  memlab-notracker   the same with MEMLAB_CUDA_TRACKER=0
Rounds alternate the configurations; each process times several repetitions
after warm-up and reports its median; the table shows the median over rounds.

    python bench/bench_overhead.py [--rounds N] [--out FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = ("unmeasured", "memlab", "memlab-notracker")
TARGETS = {"transformer": 1.02, "launch": 1.10}


def worker(workload: str, config: str, reps: int) -> None:
    import torch

    torch.manual_seed(0)
    dev = "cuda"
    if workload == "transformer":
        layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, num_layers=4).to(dev)
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(32, 128, 512, device=dev)

        def run():
            for _ in range(10):
                model(x).float().pow(2).mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    else:
        def run():
            x = torch.zeros(16, device=dev)
            for _ in range(20_000):
                x = x + 1

    measurement = None
    if config != "unmeasured":
        from pytest_memlab._core import core
        from pytest_memlab.measure import Measurement

        c = core()
        assert c.name == "bridge", c.reason

        def measured():
            m = Measurement(c, ["cuda:0"])
            m.begin()
            try:
                run()
                torch.cuda.synchronize()
            finally:
                figures = m.end()
            return figures

    for _ in range(2):  # warm-up: kernels, allocator pools, the bridge build
        if config == "unmeasured":
            run()
        else:
            measured()
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if config == "unmeasured":
            run()
            torch.cuda.synchronize()
        else:
            measurement = measured()
        times.append(time.perf_counter() - t0)
    out = {"median": statistics.median(times), "min": min(times)}
    if measurement is not None:
        out["peak_total"] = measurement["cuda:0"].peak_total
    print(json.dumps(out))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out")
    ap.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "CONFIG"))
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker, args.reps)
        return 0
    results = {w: {c: [] for c in CONFIGS} for w in TARGETS}
    for r in range(args.rounds):
        for workload in TARGETS:
            order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
            for config in order:
                env = dict(os.environ, MEMLAB_CORE="bridge")
                if config == "memlab-notracker":
                    env["MEMLAB_CUDA_TRACKER"] = "0"
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", workload, config, "--reps", str(args.reps)],
                    capture_output=True, text=True, env=env,
                )
                if proc.returncode != 0:
                    print(proc.stdout, proc.stderr, file=sys.stderr)
                    return 1
                results[workload][config].append(json.loads(proc.stdout.strip().splitlines()[-1])["median"])
    lines = ["| workload | unmeasured (s) | memlab (s) | ratio | memlab, no tracker (s) | ratio | target |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    ok = True
    for workload, target in TARGETS.items():
        base = statistics.median(results[workload]["unmeasured"])
        full = statistics.median(results[workload]["memlab"])
        notr = statistics.median(results[workload]["memlab-notracker"])
        ok &= full / base <= target
        lines.append(f"| {workload} | {base:.4f} | {full:.4f} | {full / base:.3f}x | {notr:.4f} | {notr / base:.3f}x | <= {target:.2f}x |")
    table = "\n".join(lines)
    print(table)
    print("raw:", json.dumps(results))
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n\nraw medians per round (s): " + json.dumps(results) + "\n")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
