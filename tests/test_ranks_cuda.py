"""Ranks on CUDA, one GPU: two ranks share cuda:0 with gloo, spawned by the
test and under torchrun.  Each rank's own CUDA peak must equal what the
rank itself reads from torch.cuda.max_memory_allocated after resetting it
at its start (its allocations are its own: no other tensor lives in it)."""

import json
import re

from conftest import requires_cuda, requires_two_gpus, torchrun

pytestmark = requires_cuda

MiB = 2**20

SPAWNED = """
import json, os, pytest, torch
import torch.distributed as dist
import torch.multiprocessing as tmp

MiB = 2**20

def rank_main(rank, port, out):
    torch.cuda.set_device(0)
    torch.cuda.reset_peak_memory_stats(0)
    start = torch.cuda.memory_allocated(0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x = torch.empty((rank + 1) * MiB, dtype=torch.uint8, device="cuda")
    y = torch.empty((rank + 1) * MiB // 2, dtype=torch.uint8, device="cuda")
    del x, y
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"max": torch.cuda.max_memory_allocated(0) - start}, f)

@pytest.mark.cuda_memory(max="2M")
def test_spawned(tmp_path):
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    tmp.spawn(rank_main, args=(port, str(tmp_path)), nprocs=2)
    for r in (0, 1):
        print("BY HAND", r, json.load(open(tmp_path / f"rank{r}.json"))["max"])
"""


def by_hand(text: str) -> dict:
    """What each rank printed (two ranks' prints may share a line)."""
    return {int(r): int(n) for r, n in re.findall(r"BY HAND (\d+) (\d+)", text)}


def test_two_spawned_ranks_on_one_gpu_exact_against_max_memory_allocated(inner):
    inner.makepyfile(test_spawned=SPAWNED)
    result = inner.runpytest_subprocess("-s", "--memlab-json=r.json", "-p", "no:randomly")
    out = result.stdout.str()
    hand = by_hand(out)
    assert hand == {0: int(1.5 * MiB), 1: 3 * MiB}, out
    data = json.loads((inner.path / "r.json").read_text())
    test = data["tests"][0]
    peaks = {p["rank"]: p["devices"]["cuda:0"]["peak"] for p in test["processes"]}
    assert peaks == hand, test["processes"]
    # the 2 MiB budget holds for rank 0 and not for rank 1: named
    assert test["failed_by_memlab"] == ["cuda:0 max [rank 1]"]
    result.stdout.fnmatch_lines(["*rank 1 (pid *): cuda:0 peak 3.0 MiB exceeds max 2.0 MiB by 1.0 MiB*"])


TORCHRUN = """
import os, pytest, torch
import torch.distributed as dist

MiB = 2**20
RANK = int(os.environ["RANK"])

@pytest.fixture(scope="session", autouse=True)
def group():
    torch.cuda.set_device(0)
    dist.init_process_group("gloo")
    yield
    dist.destroy_process_group()

def test_per_rank():
    torch.cuda.reset_peak_memory_stats(0)
    start = torch.cuda.memory_allocated(0)
    x = torch.empty((RANK + 1) * MiB, dtype=torch.uint8, device="cuda")
    t = torch.ones(8, device="cuda") * RANK
    dist.all_reduce(t.cpu())
    del x, t
    print(f"BY HAND {RANK} {torch.cuda.max_memory_allocated(0) - start}", flush=True)
"""


def under_torchrun(inner, source: str) -> tuple[dict, dict, str]:
    """source's one test, two ranks under torchrun around pytest: what each
    rank printed by hand, the test's JSON report entry, the output."""
    inner.makepyfile(test_ranked=source)
    proc = torchrun(inner, "-s", "--memlab-json=r.json", "test_ranked.py", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    hand = by_hand(out)
    assert set(hand) == {0, 1}, out
    return hand, json.loads((inner.path / "r.json").read_text())["tests"][0], out


def test_torchrun_ranks_sharing_one_gpu_exact_against_max_memory_allocated(inner):
    hand, test, out = under_torchrun(inner, TORCHRUN)
    peaks = {p["rank"]: p["devices"]["cuda:0"]["peak"] for p in test["processes"]}
    assert peaks == hand, (test["processes"], out)
    assert test["across_processes"]["cuda"]["worst"] == "rank 1"
    assert test["across_processes"]["cuda"]["devices"] == {"rank 0": "cuda:0", "rank 1": "cuda:0"}


# -- two GPUs, one per rank, NCCL (the nvidia-h200-x2 machine) -------------------------

SPAWNED_NCCL = (SPAWNED.replace('torch.cuda.set_device(0)', 'torch.cuda.set_device(rank)')
                .replace('reset_peak_memory_stats(0)', 'reset_peak_memory_stats(rank)')
                .replace('memory_allocated(0)', 'memory_allocated(rank)')   # max_memory_allocated(0) too
                .replace('dist.init_process_group("gloo", rank=rank, world_size=2)',
                         'dist.init_process_group("nccl", rank=rank, world_size=2, '
                         'device_id=torch.device("cuda", rank))'))


@requires_two_gpus
def test_two_spawned_nccl_ranks_one_gpu_each_exact_against_max_memory_allocated(inner):
    """Each rank on its own GPU: its figures are on that GPU, exact against
    what it reads itself, and the budget holds each rank on its own GPU."""
    assert SPAWNED_NCCL.count("set_device(rank)") == 1 and '"nccl"' in SPAWNED_NCCL
    inner.makepyfile(test_spawned=SPAWNED_NCCL)
    result = inner.runpytest_subprocess("-s", "--memlab-json=r.json", "-p", "no:randomly")
    out = result.stdout.str()
    hand = by_hand(out)
    assert hand == {0: int(1.5 * MiB), 1: 3 * MiB}, out
    test = json.loads((inner.path / "r.json").read_text())["tests"][0]
    peaks = {p["rank"]: p["devices"][f"cuda:{p['rank']}"]["peak"] for p in test["processes"]}
    assert peaks == hand, test["processes"]
    assert test["failed_by_memlab"] == ["cuda:1 max [rank 1]"], test
    result.stdout.fnmatch_lines(["*rank 1 (pid *): cuda:1 peak 3.0 MiB exceeds max 2.0 MiB by 1.0 MiB*"])


TORCHRUN_NCCL = (TORCHRUN.replace('torch.cuda.set_device(0)\n    dist.init_process_group("gloo")',
                                  'torch.cuda.set_device(RANK)\n    dist.init_process_group("nccl")')
                 .replace('reset_peak_memory_stats(0)', 'reset_peak_memory_stats(RANK)')
                 .replace('start = torch.cuda.memory_allocated(0)', 'start = torch.cuda.memory_allocated(RANK)')
                 .replace('dist.all_reduce(t.cpu())', 'dist.all_reduce(t)')
                 .replace('max_memory_allocated(0)', 'max_memory_allocated(RANK)'))


@requires_two_gpus
def test_torchrun_nccl_ranks_one_gpu_each_exact_against_max_memory_allocated(inner):
    assert '"nccl"' in TORCHRUN_NCCL and "set_device(RANK)" in TORCHRUN_NCCL
    hand, test, out = under_torchrun(inner, TORCHRUN_NCCL)
    peaks = {p["rank"]: p["devices"][f"cuda:{p['rank']}"]["peak"] for p in test["processes"]}
    assert peaks == hand, (test["processes"], out)


# Balanced ranks, one GPU each: each rank on its own device, a spread of 0 B,
# and no rank holds a CUDA context on a GPU it did not use, measured as
# unmeasured (NVML's compute processes, read by each rank at its very end:
# after memlab's own end of the process, which the rank runs first).
BALANCED_NCCL = """
import json, os, subprocess, pytest, torch
import torch.distributed as dist
import torch.multiprocessing as tmp

MiB = 2**20

def gpus_with_a_context(pid):
    uuids = dict(line.split(", ") for line in subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader"],
        capture_output=True, text=True, check=True).stdout.strip().splitlines())
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True).stdout.strip().splitlines()
    return sorted(int(uuids[u]) for p, u in (a.split(", ") for a in apps) if int(p) == pid)

def rank_main(rank, port, out):
    torch.cuda.set_device(rank)
    torch.cuda.reset_peak_memory_stats(rank)
    start = torch.cuda.memory_allocated(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    t = torch.ones(1024, device="cuda")
    dist.all_reduce(t)
    del x, t
    dist.barrier()
    dist.destroy_process_group()
    peak = torch.cuda.max_memory_allocated(rank) - start
    try:   # memlab's end of this process first, where memlab measures it
        from pytest_memlab.children import startup
        if startup._child is not None:
            startup._child.finish()
    except ImportError:
        pass
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"max": peak, "gpus": gpus_with_a_context(os.getpid())}, f)

@pytest.mark.cuda_memory
def test_balanced(tmp_path):
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    tmp.spawn(rank_main, args=(port, str(tmp_path)), nprocs=2)
    for r in (0, 1):
        got = json.load(open(tmp_path / f"rank{r}.json"))
        print("BY HAND", r, got["max"])
        print("GPUS", r, ",".join(map(str, got["gpus"])))
"""


def gpus_by_rank(text: str) -> dict:
    return {int(r): g for r, g in re.findall(r"GPUS (\d+) ([\d,]*)", text)}


@requires_two_gpus
def test_balanced_ranks_each_on_its_own_gpu_spread_zero_and_no_context_elsewhere(inner):
    inner.makepyfile(test_balanced=BALANCED_NCCL)
    plain = inner.runpytest_subprocess("-s", "-p", "no:memlab", "-p", "no:randomly")
    assert plain.ret == 0, plain.stdout.str()
    result = inner.runpytest_subprocess("-s", "--memlab-json=r.json", "-p", "no:randomly")
    out = result.stdout.str()
    assert result.ret == 0, out
    # no context where a rank does not work: the same GPUs, measured and not
    assert gpus_by_rank(out) == gpus_by_rank(plain.stdout.str()) == {0: "0", 1: "1"}, (out, plain.stdout.str())
    hand = by_hand(out)
    test = json.loads((inner.path / "r.json").read_text())["tests"][0]
    procs = {p["rank"]: p for p in test["processes"]}
    # each rank lists only the GPU it used, with its own peak exact
    assert {r: sorted(p["devices"]) for r, p in procs.items()} == {0: ["cuda:0"], 1: ["cuda:1"]}, procs
    assert {r: p["devices"][f"cuda:{r}"]["peak"] for r, p in procs.items()} == hand
    across = test["across_processes"]["cuda"]
    assert across["devices"] == {"rank 0": "cuda:0", "rank 1": "cuda:1"} and across["spread"] == 0, across
    result.stdout.fnmatch_lines([f"  cuda own peak: rank 0 {fmt(hand[0])} on cuda:0, rank 1 {fmt(hand[1])} on cuda:1; "
                                 f"max {fmt(hand[0])} (rank 0), spread 0 B"])


def fmt(n: int) -> str:
    from pytest_memlab.sizes import format_size

    return format_size(n)


# -- the FSDP2 example: per-rank phases in the baseline, compared rank by rank ----

def example(name: str) -> str:
    import pathlib

    return (pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "distributed" / name).read_text()


@requires_two_gpus
def test_the_fsdp2_example_keeps_each_ranks_phases_and_compares_them_rank_by_rank(inner, monkeypatch):
    monkeypatch.delenv("FSDP_WIDTH", raising=False)
    inner.makepyfile(test_fsdp2_memory=example("test_fsdp2_memory.py"))
    write = inner.runpytest_subprocess("--memlab-baseline=bl.json", "--memlab-update-baseline",
                                       "--memlab-json=r.json", "-p", "no:randomly")
    assert write.ret == 0, write.stdout.str()
    test = json.loads((inner.path / "r.json").read_text())["tests"][0]
    procs = {p["rank"]: p for p in test["processes"]}
    assert {r: sorted(p["devices"]) for r, p in procs.items()} == {0: ["cuda:0"], 1: ["cuda:1"]}, procs
    entries = json.loads((inner.path / "bl.json").read_text())["tests"][
        "test_fsdp2_memory.py::test_fsdp2_training_step_per_rank"]
    for r in (0, 1):
        phases = entries[f"cuda@rank {r}"]["phases"]
        assert set(phases) == {"forward", "backward", "step"}, entries
        assert phases == procs[r]["devices"][f"cuda:{r}"]["phases"]
        # each rank holds its half of the Adam state (2 x 4 layers x 2048 x 2049 floats / 2) at least
        assert phases["step"] >= 4 * 2048 * 2049 * 4, phases
    # balanced shards: within the spread budget
    assert test["across_processes"]["cuda"]["spread"] <= 2**20, test["across_processes"]

    again = inner.runpytest_subprocess("--memlab-baseline=bl.json", "-p", "no:randomly")
    assert again.ret == 0, again.stdout.str()

    monkeypatch.setenv("FSDP_WIDTH", "2560")   # a wider model: every rank and phase grows
    grown = inner.runpytest_subprocess("--memlab-baseline=bl.json", "-p", "no:randomly")
    assert grown.ret == 1
    out = grown.stdout.str()
    grown.stdout.fnmatch_lines([   # every rank and phase named, in the call's one failure
        "rank 0 (pid *): cuda:0 peak grew from * to * (+*%), over the tolerance 2%,64KiB (baseline bl.json)",
        "  by phase against the baseline: forward * -> *, backward * -> *, step * -> *",
        "rank 1 (pid *): cuda:1 peak grew from * to * (+*%), over the tolerance 2%,64KiB (baseline bl.json)",
        "  by phase against the baseline: forward * -> *, backward * -> *, step * -> *",
    ])
    assert grown.parseoutcomes() == {"failed": 1}, out


GROWS_ON_CUDA = """
import os, pytest, torch
MiB = 2**20

@pytest.mark.cuda_memory
def test_grows():
    x = torch.empty(int(os.environ.get("SIZE", 4 * MiB)), dtype=torch.uint8, device="cuda")
    del x
"""


def test_a_baseline_of_another_gpu_kind_is_not_compared_and_says_why(inner, monkeypatch):
    import torch

    monkeypatch.delenv("SIZE", raising=False)
    inner.makepyfile(test_kind=GROWS_ON_CUDA)
    assert inner.runpytest_subprocess("--memlab-baseline=bl.json", "--memlab-update-baseline").ret == 0
    path = inner.path / "bl.json"
    data = json.loads(path.read_text())
    model = torch.cuda.get_device_name(0)
    assert data["environment"]["device"] == model
    data["environment"]["device"] = "NVIDIA Z100"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    monkeypatch.setenv("SIZE", str(8 * MiB))   # twice as much: a regression on the same kind
    result = inner.runpytest_subprocess("--memlab-baseline=bl.json", "--memlab-json=r.json", "--memlab-report")
    assert result.ret == 0, result.stdout.str()
    test = json.loads((inner.path / "r.json").read_text())["tests"][0]
    assert [d["baseline"] for d in test["devices"].values()] == ["not compared"]
    result.stdout.fnmatch_lines([
        f"baseline bl.json [cuda] was measured elsewhere: device NVIDIA Z100 -> {model} (its GPU figures were not "
        "compared, the rest ran all the same)",
        "baseline bl.json [cuda]: 0 compared, 1 not compared (written on another GPU kind: keep a baseline per GPU "
        "kind, --memlab-baseline-env=NAME)",
    ])
    # on the kind it was written on, the same growth fails
    data["environment"]["device"] = model
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert inner.runpytest_subprocess("--memlab-baseline=bl.json").ret == 1
