"""Overhead of measuring, as ratios to the unmeasured run, side by side.

Workloads (CUDA):
  transformer  4-layer TransformerEncoder, d=512, batch 32x128, AdamW, 10 steps
  launch       20k tiny CUDA ops (x = x + 1 on 16 floats): one alloc and one
               free per op, the worst case for a per-event hook
Configurations, each in its own process (the CUDA trace tracker cannot be
detached once attached, so an "unmeasured" run in a process that attached it
would not be unmeasured):
  unmeasured        plain torch
  memlab            a test's measurement: bridge reporter, CUDA trace tracker,
                    and line attribution (the C tracer on the loop's code)
  memlab-kinds      memlab with memory by kind as a measured test has it:
                    the walk at each phase's boundary, the allocation log,
                    and the classification at the end (as a report reads it)
  memlab-notracker  the same with MEMLAB_CUDA_TRACKER=0
  memlab-nolines    memlab without line attribution
  and, on the transformer loop, the peers:
  pytorch_memlab    pytorch_memlab's LineProfiler on the loop function
  memory-history    torch.cuda.memory._record_memory_history + _snapshot()
  torch-profiler    torch.profiler.profile(profile_memory=True)
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

CONFIGS = {
    "transformer": ("unmeasured", "memlab", "memlab-kinds", "memlab-notracker", "memlab-nolines",
                    "pytorch_memlab", "memory-history", "torch-profiler"),
    "launch": ("unmeasured", "memlab", "memlab-notracker", "memlab-nolines"),
}
TARGETS = {"transformer": 1.02, "launch": 1.10}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(workload: str, config: str, reps: int) -> None:
    import torch

    torch.manual_seed(0)
    dev = os.environ.get("BENCH_DEVICE", "cuda")   # cpu: to try the bench here
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    where = "cuda:0" if dev == "cuda" else "cpu"
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

    def plain():
        run()
        sync()

    once = plain
    if config.startswith("memlab"):
        from measured_like_a_test import measure
        from pytest_memlab.engine.backend import core
        from pytest_memlab.engine.tracing import tracing

        c = core()
        assert c.name == "bridge", c.reason
        tracing.scope.configure(ROOT)  # this file is the user's code

        def once():
            figures = measure(c, where, plain, lines=config != "memlab-nolines", kinds=config == "memlab-kinds")
            assert figures[where].peak > 0
            if config != "memlab-nolines":
                assert figures[where].attribution.at_peak, "no line attribution"
    elif config == "pytorch_memlab":
        from pytorch_memlab import LineProfiler

        def once():
            with LineProfiler(run):
                plain()
    elif config == "memory-history":
        def once():
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
            plain()
            torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
    elif config == "torch-profiler":
        from torch.profiler import ProfilerActivity, profile

        def once():
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True):
                plain()

    for _ in range(2):  # warm-up: kernels, allocator pools, the bridge build
        once()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"median": statistics.median(times), "min": min(times)}))


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
    results = {w: {c: [] for c in CONFIGS[w]} for w in TARGETS}
    failed = {}
    for r in range(args.rounds):
        for workload in TARGETS:
            order = CONFIGS[workload] if r % 2 == 0 else tuple(reversed(CONFIGS[workload]))
            for config in order:
                if config in failed.get(workload, {}):
                    continue
                env = dict(os.environ, MEMLAB_CORE="bridge")
                if config == "memlab-notracker":
                    env["MEMLAB_CUDA_TRACKER"] = "0"
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", workload, config, "--reps", str(args.reps)],
                    capture_output=True, text=True, env=env,
                )
                if proc.returncode != 0:
                    if config.startswith("memlab") or config == "unmeasured":
                        print(proc.stdout, proc.stderr, file=sys.stderr)
                        return 1
                    tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                    failed.setdefault(workload, {})[config] = tail  # a peer tool missing: say so
                    continue
                results[workload][config].append(json.loads(proc.stdout.strip().splitlines()[-1])["median"])
    lines = ["| workload | configuration | median time (s) | ratio to unmeasured | target |",
             "| --- | --- | --- | --- | --- |"]
    ok = True
    for workload, target in TARGETS.items():
        base = statistics.median(results[workload]["unmeasured"])
        for config in CONFIGS[workload]:
            if config in failed.get(workload, {}):
                lines.append(f"| {workload} | {config} | not run: {failed[workload][config]} | | |")
                continue
            t = statistics.median(results[workload][config])
            goal = f"<= {target:.2f}x" if config in ("memlab", "memlab-kinds") else ""
            if goal:
                ok &= t / base <= target
            lines.append(f"| {workload} | {config} | {t:.4f} | {t / base:.3f}x | {goal} |")
    table = "\n".join(lines)
    print(table)
    print("raw:", json.dumps(results))
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n\nraw medians per round (s): " + json.dumps(results) + "\n")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
