"""A session run once per rank: ``torchrun --nproc-per-node 2 -m pytest``
on the CPU with gloo.  Each rank measures its own process; rank 0 gathers
every rank's figures of each test, judges each rank's budget, names the
rank that broke it, and says which rank did not report."""

import json
import subprocess
import sys

import pytest

from conftest import requires_torch, torchrun

pytestmark = requires_torch

MiB = 2**20

SUITE = """
import os, pytest, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

MiB = 2**20
RANK = int(os.environ["RANK"])
pytestmark = pytest.mark.cpu_memory   # the CPU, also where there is CUDA

@pytest.fixture(scope="session", autouse=True)
def group():
    dist.init_process_group("gloo")
    yield
    dist.destroy_process_group()

def own(n):
    x = torch.empty(n, dtype=torch.uint8)
    x.fill_(1)
    return x

def test_per_rank():
    x = own((RANK + 1) * MiB)

@pytest.mark.cpu_memory(max="1.5M")
def test_budget():
    x = own((RANK + 1) * MiB)

def test_ddp_step():
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(32, 256)).sum().backward()
    opt.step()
    dist.barrier()
"""


def test_rank_zero_gathers_every_ranks_figures_and_judges_each_rank(inner):
    inner.makepyfile(test_ranked=SUITE)
    proc = torchrun(inner, "--memlab-json=r.json", "--memlab-baseline=bl.json", "--memlab-update-baseline",
                    "test_ranked.py")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out    # test_budget fails on rank 1 (and on rank 0, naming rank 1)
    # rank 0 writes the baseline: its own figures as the test's, every other rank's beside them
    entries = json.loads((inner.path / "bl.json").read_text())["tests"]["test_ranked.py::test_per_rank"]
    assert entries["cpu"]["peak"] == 1 * MiB and entries["cpu@rank 1"]["peak"] == 2 * MiB
    assert "cpu@rank 0" not in entries
    data = json.loads((inner.path / "r.json").read_text())   # rank 0's: only rank 0 writes reports
    tests = {t["nodeid"].split("::")[1]: t for t in data["tests"]}

    per_rank = tests["test_per_rank"]
    peaks = {p["label"]: p["devices"]["cpu"]["peak"] for p in per_rank["processes"]}
    assert peaks == {"rank 0": 1 * MiB, "rank 1": 2 * MiB}   # exact: each rank's own tensor
    assert per_rank["across_processes"]["cpu"] == {"over": "ranks", "processes": 2, "max": 2 * MiB, "worst": "rank 1",
                                                   "min": 1 * MiB, "spread": 1 * MiB,
                                                   "devices": {"rank 0": "cpu", "rank 1": "cpu"}}

    budget = tests["test_budget"]
    assert budget["outcome"] == "error"       # on rank 0: its own figure held; rank 1's is judged at teardown
    assert budget["failed_by_memlab"] == ["cpu max [rank 1]"]
    # rank 0 names rank 1 (rank 1 fails its own test as well, in its own words)
    assert "rank 1 (pid " in out and "): cpu peak 2.0 MiB exceeds max 1.5 MiB by 512.0 KiB" in out
    assert "every process's peak on cpu: rank 0 1.0 MiB, rank 1 2.0 MiB" in out

    ddp = tests["test_ddp_step"]
    weights = (256 * 256 + 256) * 4
    assert [p["label"] for p in ddp["processes"]] == ["rank 0", "rank 1"]
    for p in ddp["processes"]:
        assert p["devices"]["cpu"]["peak"] >= 2 * weights, p   # weights' gradients and DDP's buckets
    assert "rank 1 of 2: rank 0 gathers every rank's figures" in out


def test_a_rank_that_never_reports_is_named_and_the_run_does_not_hang(inner):
    inner.makepyfile(test_ranked=SUITE.replace('''def test_per_rank():
    x = own((RANK + 1) * MiB)''', '''def test_per_rank():
    x = own((RANK + 1) * MiB)
    if RANK == 1:
        os._exit(0)   # rank 1 is gone: it reports nothing more''').replace("dist.barrier()", "pass").replace(
        '''    yield
    dist.destroy_process_group()''', "    yield"))
    proc = torchrun(inner, "--memlab-json=r.json", "--memlab-rank-timeout=3", "test_ranked.py",
                    "-k", "per_rank or ddp_step")
    out = proc.stdout + proc.stderr
    data = json.loads((inner.path / "r.json").read_text())
    tests = {t["nodeid"].split("::")[1]: t for t in data["tests"]}
    for name in ("test_per_rank", "test_ddp_step"):
        missing = [p for p in tests[name]["processes"] if p["state"] == "missing"]
        assert [p["label"] for p in missing] == ["rank 1"], tests[name]
        assert "did not report its figures of this test within 3 s (--memlab-rank-timeout)" in missing[0]["why"]
    assert "rank 1 (pid 0): no figures: rank 1 did not report" in out


def test_ranks_with_xdist_workers_is_refused_when_every_test_is_measured(inner):
    inner.makepyfile(test_x="def test_a():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--memlab", "-n", "2"],
                          cwd=inner.path, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "RANK": "0", "WORLD_SIZE": "2"})
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "cannot also run pytest-xdist workers (-n)" in proc.stderr


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan"])
def test_a_bad_rank_timeout_is_a_usage_error(inner, value):
    inner.makepyfile(test_x="def test_a():\n    pass\n")
    result = inner.runpytest_inprocess(f"--memlab-rank-timeout={value}")
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*--memlab-rank-timeout*{value!r} is not a number of seconds above 0*"])


def test_a_rank_of_another_plugin_version_is_refused_by_name(inner, tmp_path):
    """Two ranks started by hand (RANK and WORLD_SIZE are all memlab reads),
    rank 1 importing a copy of pytest-memlab of another version: rank 0
    names it and keeps its figures out of the verdict."""
    import os
    import shutil

    import pytest_memlab

    other = tmp_path / "other"
    shutil.copytree(os.path.dirname(pytest_memlab.__file__), other / "pytest_memlab")
    init = other / "pytest_memlab" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "0.0.2-other+'))
    inner.makepyfile(test_two="""
import pytest, torch
pytestmark = pytest.mark.cpu_memory

def test_a():
    x = torch.empty(2**20, dtype=torch.uint8)
""")
    common = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q",
           f"--memlab-rank-dir={tmp_path / 'ranks'}", "--memlab-rank-timeout=30", "--memlab-json=r.json"]
    # rank 1 imports the copy first (its plugin too: loaded by name, not by entry point)
    rank1 = subprocess.Popen(cmd + ["-p", "pytest_memlab.plugin", "-p", "no:memlab"], cwd=inner.path,
                             env={**common, "RANK": "1", "WORLD_SIZE": "2", "PYTHONPATH": str(other)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rank0 = subprocess.run(cmd, cwd=inner.path, env={**common, "RANK": "0", "WORLD_SIZE": "2"},
                           capture_output=True, text=True, timeout=180)
    # (where the copy cannot build its bridge, rank 1's own test errors: its
    # turn, with its version, is taken all the same)
    out1 = rank1.communicate(timeout=180)[0]
    data = json.loads((inner.path / "r.json").read_text())
    procs = data["tests"][0]["processes"]
    assert [(p["label"], p["state"]) for p in procs] == [("rank 0", "done"), ("rank 1", "missing")], (procs, out1)
    assert "it ran pytest-memlab 0.0.2-other+" in procs[1]["why"], procs[1]
    assert "install one version for every process" in procs[1]["why"]
    assert rank0.returncode == 0, rank0.stdout + rank0.stderr
