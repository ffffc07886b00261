"""Ranks on the CPU with gloo (spawned as torch's harnesses spawn them):
each rank's phases (forward, backward, step) kept in the baseline and
compared rank by rank, and a budget on the spread between the ranks' own
peaks that names both ranks.  Each figure is checked against the bytes the
ranks allocate."""

import json

import pytest

from conftest import has_torch, requires_torch

pytestmark = requires_torch

import multiprocessing.spawn  # noqa: E402,F401  (see test_children.py: imported once)

import pytest_memlab.children.gathering  # noqa: E402,F401

if has_torch():
    import torch.distributed  # noqa: F401
    import torch.multiprocessing  # noqa: F401

MiB = 2**20

TRAINING = """
import os, socket
import pytest, torch
import torch.distributed as dist
import torch.multiprocessing as tmp

MiB = 2**20
WIDE = int(os.environ.get("WIDE", "0"))   # rank 1's forward keeps this many MiB more for its backward


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x, extra):
        h = self.fc(x)
        if extra:
            h = h + torch.zeros(extra * MiB // 4, dtype=torch.float32).sum()   # a temporary, freed in the forward
            keep = torch.ones(extra * MiB // 4, requires_grad=True)
            h = h * (keep.sum() / keep.numel())   # kept for the backward
        return h


def rank_main(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(512, 256)
    loss = model(x, WIDE if rank == 1 else 0).square().mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    dist.barrier()
    dist.destroy_process_group()


def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    return p


@pytest.mark.cpu_memory(spread=os.environ.get("SPREAD"))
def test_train():
    tmp.spawn(rank_main, args=(port(),), nprocs=2)
"""


def run(inner, *args):
    inner.makepyfile(test_rank_train=TRAINING)
    result = inner.runpytest_inprocess("-v", "--memlab-json=r.json", *args)
    data = json.loads((inner.path / "r.json").read_text())
    return result, data["tests"][0]


def rank_phases(test) -> dict:
    return {p["rank"]: p["devices"]["cpu"].get("phases") for p in test["processes"]}


def test_each_ranks_phases_are_kept_in_the_baseline_and_compared_rank_by_rank(inner, monkeypatch):
    monkeypatch.delenv("WIDE", raising=False)
    monkeypatch.delenv("SPREAD", raising=False)
    result, test = run(inner, "--memlab-baseline=bl.json", "--memlab-update-baseline")
    assert result.ret == 0, result.stdout.str()
    phases = rank_phases(test)
    assert set(phases) == {0, 1} and all(set(p) == {"forward", "backward", "step"} for p in phases.values()), phases
    # the ranks run the same step on the same data: the same phases
    assert phases[0] == phases[1]
    # forward: the output (512 x 256 float32) at least; step: the momentum buffers (parameters' size)
    assert phases[0]["forward"] >= 512 * 256 * 4 and phases[0]["step"] >= (256 * 256 + 256) * 4
    entries = json.loads((inner.path / "bl.json").read_text())["tests"]["test_rank_train.py::test_train"]
    assert entries["cpu@rank 0"]["phases"] == phases[0] and entries["cpu@rank 1"]["phases"] == phases[1]

    result, test = run(inner, "--memlab-baseline=bl.json")
    assert result.ret == 0, result.stdout.str()    # the same again: no phase moved

    monkeypatch.setenv("WIDE", "4")   # rank 1's forward keeps 1 MiB more for its backward
    result, test = run(inner, "--memlab-baseline=bl.json")
    assert result.ret == 1
    grown = rank_phases(test)[1]
    assert grown["forward"] >= phases[1]["forward"] + MiB
    out = result.stdout.str()
    # rank 1's peak grew with its forward: one failure, each phase beside it
    result.stdout.fnmatch_lines([
        "rank 1 (pid *): cpu peak grew from * to * (+*%), over the tolerance 2%,64KiB (baseline bl.json)",
        "  by phase against the baseline: forward * -> *, backward * -> *, step * -> *",
    ])
    assert "rank 0 (pid" not in out
    assert test["failed_by_memlab"] == ["cpu baseline [rank 1]"]
    # the test's own process held: the summary counts the test regressed all the same
    import torch
    lane = "cuda" if torch.cuda.is_available() else "cpu"   # in process: the lane is named by this machine
    assert f"baseline bl.json [{lane}]: 1 compared, 1 regressed" in out


def test_a_phase_that_grew_while_the_peak_held_fails_by_itself(inner, monkeypatch):
    """rank 1's forward keeps 1 MiB more, and the baseline says its step
    held more than its forward: the step's peak (the rank's peak) holds,
    its forward's grows: a failure of its own."""
    monkeypatch.delenv("SPREAD", raising=False)
    monkeypatch.delenv("WIDE", raising=False)
    result, test = run(inner, "--memlab-baseline=bl.json", "--memlab-update-baseline")
    assert result.ret == 0
    path = inner.path / "bl.json"
    data = json.loads(path.read_text())
    entry = data["tests"]["test_rank_train.py::test_train"]["cpu@rank 1"]
    entry["phases"]["forward"] -= MiB   # as if the forward had held 1 MiB less when it was written
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    result, test = run(inner, "--memlab-baseline=bl.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "rank 1 (pid *): cpu forward peak grew from * to * (+*%), over the tolerance 2%,64KiB (baseline bl.json)",
        "  the phases' peaks now: forward *, backward *, step *; the own peak *",
    ])
    assert test["failed_by_memlab"] == ["cpu forward baseline [rank 1]"]


def test_a_spread_budget_names_both_ranks_with_what_each_held(inner, monkeypatch):
    monkeypatch.setenv("WIDE", "8")   # rank 1 holds 2 MiB more than rank 0 at its peak
    monkeypatch.setenv("SPREAD", "1M")
    result, test = run(inner)
    assert result.ret == 1
    across = test["across_processes"]["cpu"]
    assert across["spread"] >= 2 * MiB and across["worst"] == "rank 1"
    peaks = {p["rank"]: p["devices"]["cpu"]["peak"] for p in test["processes"]}
    result.stdout.fnmatch_lines([
        f"cpu spread between ranks * exceeds spread 1.0 MiB by *: rank 1 * on cpu, rank 0 * on cpu",
        "  rank 1 (pid *), own peak * on cpu, live at its peak by the line that allocated it (user call chain):",
        "*test_rank_train.py:* Net.forward: keep = torch.ones(extra * MiB // 4, requires_grad=True)",
        "    at its peak, by kind: *",
        "  rank 0 (pid *), own peak * on cpu*",
        "    at its peak, by kind: *",
        f"  exactly {peaks[1] - peaks[0]} B against {MiB} B",
    ])
    assert test["failed_by_memlab"] == ["cpu spread"]
    # each rank's bytes by kind add up to its own peak; rank 1 kept its 2 MiB for the backward
    for p in test["processes"]:
        kinds = p["devices"]["cpu"]["kinds"]
        assert sum(kinds.values()) == p["devices"]["cpu"]["peak"], (p["rank"], kinds)
        assert kinds["parameter"] == (256 * 256 + 256) * 4, kinds

    monkeypatch.setenv("SPREAD", "64M")   # within the budget: passes
    result, test = run(inner)
    assert result.ret == 0, result.stdout.str()


def test_balanced_ranks_have_a_spread_of_zero(inner, monkeypatch):
    monkeypatch.delenv("WIDE", raising=False)
    monkeypatch.setenv("SPREAD", "0")
    result, test = run(inner)
    assert result.ret == 0, result.stdout.str()
    assert test["across_processes"]["cpu"]["spread"] == 0
    result.stdout.fnmatch_lines(["  cpu own peak: rank 0 *, rank 1 *; max * (rank 0), spread 0 B"])
