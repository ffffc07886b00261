"""Memory by kind against torch's profiler, and what each costs, on the
same training steps (issue 34).

For each model: build it, Adam, two steps of cross-entropy on a random
batch (timm's models: batch 32, 3x224x224; "mlp": 512-2048-2048-10 on
1024x512), all inside one test.  Each configuration runs in a fresh
process after the same warm-up at import (one step of another instance:
kernels, cuDNN's and cuBLAS's workspaces come before anything measured):
  unmeasured  pytest -p no:memlab
  memlab      pytest --memlab --memlab-report=json (kinds classified: the
              report reads them)
  profiled    torch.profiler (memory, shapes, stacks) around the same build
              and steps, and its memory timeline; the same process first
              times them plain, side by side
Reports per model: memlab's kinds at the own peak and torch's categories
at its timeline's peak, byte for byte; the parameters, gradients and
Adam's state by hand from the tensors' shapes against memlab's kinds at
the step's peak (every gradient and all state live there); the total peak
against max_memory_allocated; and the time of the build and steps inside
the test, measured against unmeasured, beside the profiler's against
plain.  With --side REPS, also the three configurations (unmeasured,
memlab, memlab with kinds: the walk, the log and the classification)
alternating in one process: what the kinds add, without the scatter
between processes.

    python bench/bench_kinds.py [--device cuda] [--models resnet18,vit_tiny_patch16_224]
                                [--rounds N] [--side REPS] [--json FILE] [--out FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2**20

STEPS = '''
import os, time
import torch
import torch.nn.functional as F

NAME = os.environ["KINDS_MODEL"]
DEVICE = os.environ["KINDS_DEVICE"]


def sync():
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def build():
    torch.manual_seed(0)
    if NAME == "encoder":   # a ViT-tiny-sized transformer without timm: 12 layers, d 192, 197 tokens
        layer = torch.nn.TransformerEncoderLayer(192, 3, 768, batch_first=True)
        model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False),
                                    torch.nn.Flatten(), torch.nn.Linear(197 * 192, 1000)).to(DEVICE)
        x, y = torch.randn(32, 197, 192, device=DEVICE), torch.randint(0, 1000, (32,), device=DEVICE)
    elif NAME == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                    torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(DEVICE)
        x, y = torch.randn(1024, 512, device=DEVICE), torch.randint(0, 10, (1024,), device=DEVICE)
    else:
        import timm
        model = timm.create_model(NAME, pretrained=False).to(DEVICE)
        x, y = torch.randn(32, 3, 224, 224, device=DEVICE), torch.randint(0, 1000, (32,), device=DEVICE)
    return model, torch.optim.Adam(model.parameters()), x, y


def two_steps(model, opt, x, y):
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()


def block(t):
    """A tensor's bytes as memlab counts them: on CUDA what it asked the
    caching allocator for, rounded up to the allocator's 512 bytes (a
    cached block handed out unsplit is larger by what earlier work left:
    memlab counts the request, the same whatever ran before); on the CPU
    its bytes."""
    n = t.untyped_storage().nbytes()
    return max(512, (n + 511) // 512 * 512) if t.device.type == "cuda" else n


def by_hand(model, opt):
    """Bytes from the tensors' shapes: parameters, their gradients, and
    Adam's state on the device (its step counts stay on the CPU)."""
    device = torch.device(DEVICE).type
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.device.type == device]
    return {"parameter": sum(block(p) for p in params),
            "gradient": sum(block(p.grad) for p in params if p.grad is not None),
            "optimizer_state": sum(block(t) for t in state),
            "shapes": sum(p.numel() * p.element_size() for p in params)}


def warm_up():
    model, opt, x, y = build()
    two_steps(model, opt, x, y)
    del model, opt, x, y
    sync()


def timed():
    """Builds and runs the steps; returns (seconds, by_hand, model, opt)."""
    sync()
    t0 = time.perf_counter()
    model, opt, x, y = build()
    two_steps(model, opt, x, y)
    sync()
    return time.perf_counter() - t0, by_hand(model, opt), model, opt
'''

TEST = '''
import json, os
import torch
from steps import DEVICE, timed, warm_up

warm_up()


def test_two_steps():
    cuda = DEVICE.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    seconds, hand, model, opt = timed()
    out = {"seconds": seconds, "hand": hand}
    if cuda:
        out["max_allocated"] = torch.cuda.max_memory_allocated()
        out["allocated_before"] = before
    with open(os.environ["KINDS_OUT"], "w") as f:
        json.dump(out, f)
'''

PROFILED = '''
import json, os, time
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline
from steps import DEVICE, build, sync, timed, two_steps, warm_up

warm_up()
plain = min(timed()[0] for _ in range(2))
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE.startswith("cuda") else [])
sync()
t0 = time.perf_counter()
with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
    model, opt, x, y = build()
    two_steps(model, opt, x, y)
    sync()
profiled = time.perf_counter() - t0
timeline = MemoryProfileTimeline(prof._memory_profile())
device = torch.device(DEVICE)
if device.type == "cuda" and device.index is None:   # the profiler's keys name the index
    device = torch.device("cuda", torch.cuda.current_device())
times, sizes = timeline._coalesce_timeline(str(device))
with_timeline = time.perf_counter() - t0
sizes = np.array(sizes)
at = int(sizes.sum(axis=1).argmax())
# a category's column is its index + 1 (torch's own plot reads them so)
categories = {(c.name.lower() if c is not None else "unknown"): int(sizes[at][i + 1])
              for c, i in _CATEGORY_TO_INDEX.items()}
print(json.dumps({"total": int(sizes[at].sum()), "categories": categories,
                  "plain": plain, "profiled": profiled, "with_timeline": with_timeline}))
'''


SIDE = '''
import json, statistics, sys, time
import torch
from steps import DEVICE, build, sync, two_steps, warm_up
from measured_like_a_test import measure
from pytest_memlab.engine.backend import core
from pytest_memlab.engine.tracing import tracing

warm_up()
c = core()
assert c.name == "bridge", c.reason
tracing.scope.configure(".")   # steps.py is the user's code
where = "cuda:0" if DEVICE.startswith("cuda") else "cpu"


def once(config):
    """The build and two steps, measured as a test is (memlab), with its
    kinds too (the walk, the log, the classification a report asks for),
    or not at all; the time of all of it, the measurement's end included."""
    def region():
        model, opt, x, y = build()
        two_steps(model, opt, x, y)
        sync()

    sync()
    t0 = time.perf_counter()
    if config == "unmeasured":
        region()
    else:
        measure(c, where, region, kinds=config == "kinds")
    return time.perf_counter() - t0


configs = ("unmeasured", "memlab", "kinds")
times = {k: [] for k in configs}
for r in range(int(sys.argv[1])):
    for config in (configs if r % 2 == 0 else configs[::-1]):
        times[config].append(once(config))
print(json.dumps({k: statistics.median(v) for k, v in times.items()}))
'''


def run_side(folder: str, env: dict, reps: int) -> dict:
    """The three configurations alternating in one process (the tracker
    attached by the first measurement stays, off, for the unmeasured runs)."""
    proc = subprocess.run([sys.executable, "side.py", str(reps)], cwd=folder, env=dict(env, MEMLAB_CORE="bridge"),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the side-by-side run failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_pytest(folder: str, env: dict, measured: bool) -> tuple[dict, float, dict | None]:
    """One pytest process over the test; returns (the test's own json,
    the process's wall seconds, memlab's device entry or None)."""
    out = os.path.join(folder, "test_out.json")
    report = os.path.join(folder, "r.json")
    args = ([f"--memlab", f"--memlab-report=json:{report}"] if measured else ["-p", "no:memlab"])
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-p", "no:xdist", *args, "test_kinds_steps.py"],
                          cwd=folder, env=dict(env, KINDS_OUT=out), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"pytest ({'measured' if measured else 'unmeasured'}) failed:\n{proc.stdout}\n{proc.stderr}")
    with open(out) as f:
        own = json.load(f)
    device = None
    if measured:
        with open(report) as f:
            tests = json.load(f)["tests"]
        devices = tests[0]["devices"]
        device = devices.get(env["KINDS_DEVICE"]) or devices.get(env["KINDS_DEVICE"] + ":0")
    return own, wall, device


def run_profiled(folder: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "profiled.py"], cwd=folder, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the profiled run failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def one_model(model: str, device: str, rounds: int, side: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        for name, text in (("steps.py", STEPS), ("test_kinds_steps.py", TEST), ("profiled.py", PROFILED),
                           ("side.py", SIDE)):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        env = dict(os.environ, KINDS_MODEL=model, KINDS_DEVICE=device, OMP_NUM_THREADS=os.environ.get(
            "OMP_NUM_THREADS", "1"), PYTHONPATH=os.pathsep.join(
            p for p in (ROOT, os.path.join(ROOT, "bench"), folder, os.environ.get("PYTHONPATH", "")) if p))
        times = {"unmeasured": [], "memlab": [], "unmeasured_wall": [], "memlab_wall": [],
                 "plain": [], "profiled": [], "with_timeline": []}
        result: dict = {"model": model, "device": device}
        for r in range(rounds):
            for measured in ((False, True) if r % 2 == 0 else (True, False)):
                own, wall, entry = run_pytest(folder, env, measured)
                key = "memlab" if measured else "unmeasured"
                times[key].append(own["seconds"])
                times[key + "_wall"].append(wall)
                if measured:
                    result.update(memlab=entry, hand=own["hand"], max_allocated=own.get("max_allocated"),
                                  allocated_before=own.get("allocated_before"))
            profiled = run_profiled(folder, env)
            for key in ("plain", "profiled", "with_timeline"):
                times[key].append(profiled[key])
            result["profiler"] = {"total": profiled["total"], "categories": profiled["categories"]}
        if side:
            result["side"] = run_side(folder, env, side)
        result["times"] = {k: statistics.median(v) for k, v in times.items()}
        result["rounds"] = times
        return result


def table(results: list) -> str:
    lines = []
    for res in results:
        entry, prof = res["memlab"], res["profiler"]
        kinds = entry.get("kinds") or {}
        step = (entry.get("phase_kinds") or {}).get("step") or {}
        t = res["times"]
        lines += [f"### {res['model']} on {res['device']}", "",
                  f"own peak {entry['peak']} B, total peak {entry.get('peak_total')} B, "
                  f"max_memory_allocated {res.get('max_allocated')} B (allocated before the test "
                  f"{res.get('allocated_before')} B); torch's profiler's peak {prof['total']} B",
                  "",
                  "| at the peak | memlab (B) | torch.profiler (B) | memlab (MiB) | torch.profiler (MiB) |",
                  "| --- | --- | --- | --- | --- |"]
        pairs = [("parameter", "parameter"), ("buffer", None), ("gradient", "gradient"),
                 ("optimizer_state", "optimizer_state"), ("input", "input"), ("activation", "activation"),
                 ("temporary", "temporary"), (None, "autograd_detail"), ("other", "unknown")]
        for mine, theirs in pairs:
            a = kinds.get(mine) if mine else None
            b = prof["categories"].get(theirs) if theirs else None
            label = " / ".join(x for x in (mine, theirs) if x)
            lines.append(f"| {label} | {'' if a is None else a} | {'' if b is None else b} | "
                         f"{'' if a is None else f'{a / MiB:.1f}'} | {'' if b is None else f'{b / MiB:.1f}'} |")
        lines.append(f"| sum | {sum(kinds.values())} | {sum(prof['categories'].values())} | | |")
        hand = res["hand"]
        lines += ["", "at the step's peak, memlab against the tensors' shapes by hand: "
                  + ", ".join(f"{k} {step.get(k)} vs {hand[k]}" for k in ("parameter", "gradient", "optimizer_state"))
                  + f" (the parameters' bytes unrounded: {hand['shapes']})", "",
                  "| time of the build and two steps | median (s) | ratio |", "| --- | --- | --- |",
                  f"| unmeasured (pytest) | {t['unmeasured']:.4f} | 1.000x |",
                  f"| memlab (pytest, kinds) | {t['memlab']:.4f} | {t['memlab'] / t['unmeasured']:.3f}x |",
                  f"| whole pytest process, unmeasured / memlab | {t['unmeasured_wall']:.2f} / "
                  f"{t['memlab_wall']:.2f} | {t['memlab_wall'] / t['unmeasured_wall']:.3f}x |",
                  f"| plain (the profiler's process) | {t['plain']:.4f} | 1.000x |",
                  f"| torch.profiler (memory, shapes, stacks) | {t['profiled']:.4f} | "
                  f"{t['profiled'] / t['plain']:.1f}x |",
                  f"| ... and its memory timeline | {t['with_timeline']:.4f} | "
                  f"{t['with_timeline'] / t['plain']:.1f}x |", ""]
        side = res.get("side")
        if side:
            lines += ["side by side in one process, alternating (the build, two steps and the measurement's end): "
                      f"unmeasured {side['unmeasured']:.4f} s, memlab {side['memlab']:.4f} s "
                      f"({side['memlab'] / side['unmeasured']:.3f}x), memlab with kinds {side['kinds']:.4f} s "
                      f"({side['kinds'] / side['unmeasured']:.3f}x; {side['kinds'] / side['memlab']:.3f}x of memlab's)",
                      ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="resnet18,vit_tiny_patch16_224")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--side", type=int, default=0, metavar="REPS",
                    help="also time unmeasured, memlab and memlab with kinds alternating in one process")
    ap.add_argument("--json")
    ap.add_argument("--out")
    args = ap.parse_args()
    results = [one_model(m, args.device, args.rounds, args.side) for m in args.models.split(",")]
    text = table(results)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
