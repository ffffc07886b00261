"""A measured test's child processes, measured too (CPU, through pytester):
spawned ranks, multiprocessing's fork and forkserver, a subprocess running
Python, a DataLoader's workers, a DDP training step with gloo; each child's
own peak exact against the bytes it allocated; a budget judged per rank;
a child that crashes; a test that is not measured arms nothing."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import has_torch, requires_torch

pytestmark = requires_torch

# pytester's in-process runs take out of sys.modules what each run imported:
# a module with process-wide state (a forkserver, the fork handler, the
# children's folder) would be imported afresh by the next run.  Imported
# once, here.
import multiprocessing.forkserver  # noqa: E402,F401
import multiprocessing.spawn  # noqa: E402,F401

import pytest_memlab.children.gathering  # noqa: E402,F401

if has_torch():
    import torch.distributed  # noqa: F401
    import torch.multiprocessing  # noqa: F401
    import torch.utils.data  # noqa: F401

    # The inner runs fork this process.  GNU OpenMP cannot run a parallel
    # region in a fork of a process that has run one (another test's large
    # fill in this worker hung a child's fill): a forked child works on one
    # thread, as a DataLoader's workers do.
    os.register_at_fork(after_in_child=lambda: torch.set_num_threads(1))

MiB = 2**20

HEADER = """
import multiprocessing as mp, os, subprocess, sys
import pytest, torch
import torch.multiprocessing as tmp
MiB = 2**20
pytestmark = pytest.mark.cpu_memory   # the CPU, also where there is CUDA

def own(n):
    x = torch.empty(n, dtype=torch.uint8)
    x.fill_(1)
    return x
"""


def run(inner, body, *args):
    inner.makepyfile(test_kids=HEADER + body)
    result = inner.runpytest_inprocess("-v", "--memlab-json=r.json", *args)
    data = json.loads((inner.path / "r.json").read_text()) if (inner.path / "r.json").exists() else None
    return result, data


def processes(data, name):
    test = next(t for t in data["tests"] if t["nodeid"].endswith(name))
    return test.get("processes", []), test


def peaks(procs, device="cpu"):
    return {p["label"]: p["devices"][device]["peak"] for p in procs if p["state"] == "done"}


SPAWN = """
def work(rank):
    x = own((rank + 1) * MiB)
    del x
    y = own(MiB // 2)

def test_spawn():
    tmp.spawn(work, nprocs=2)
"""


def test_spawned_ranks_each_measured_exactly(inner):
    result, data = run(inner, SPAWN)
    assert result.ret == 0
    procs, test = processes(data, "test_spawn")
    # Each rank's own peak is the bytes it held at once: its first tensor
    # (freed before the second).
    assert peaks(procs) == {"rank 0": 1 * MiB, "rank 1": 2 * MiB}
    assert [p["rank"] for p in procs] == [0, 1]
    assert test["across_processes"]["cpu"] == {"over": "ranks", "processes": 2, "max": 2 * MiB, "worst": "rank 1",
                                               "min": 1 * MiB, "spread": 1 * MiB,
                                               "devices": {"rank 0": "cpu", "rank 1": "cpu"}}
    top = procs[1]["devices"]["cpu"]["top"]
    assert top[0]["file"] == "test_kids.py" and top[0]["function"] == "own" and top[0]["bytes"] == 2 * MiB + MiB // 2
    # the parent's own figure is its own: the ranks' tensors are not in it
    assert test["devices"]["cpu"]["peak"] < MiB
    result.stdout.fnmatch_lines([
        "test_kids.py::test_spawn: 2 child processes",
        "  cpu own peak: rank 0 1.0 MiB, rank 1 2.0 MiB; max 2.0 MiB (rank 1), spread 1.0 MiB",
    ])


def test_a_budget_applies_to_each_rank_and_the_failure_names_the_rank(inner):
    result, data = run(inner, SPAWN.replace("def test_spawn", '@pytest.mark.cpu_memory(max="1.5M")\ndef test_spawn'))
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*_ test_spawn _*",
        "rank 1 (pid *): cpu peak 2.0 MiB exceeds max 1.5 MiB by 512.0 KiB",
        # as the test's own failure reads: what was live at the child's
        # peak (its first tensor), not what its lines allocated over its life
        "  live at the peak, by the line that allocated it (user call chain):",
        "       2.0 MiB 100%  test_kids.py:* own: x = torch.empty(n, dtype=torch.uint8)",
        "                         <- test_kids.py:* work: x = own((rank + 1) * MiB)",
        "  every process's peak on cpu: rank 0 1.0 MiB, rank 1 2.0 MiB",
        "  exactly 2097152 B against 1572864 B",
    ])
    assert "rank 0 (pid" not in result.stdout.str()
    procs, test = processes(data, "test_spawn")
    assert test["failed_by_memlab"] == ["cpu max [rank 1]"]
    assert test["outcome"] == "failed"   # the call failed, as an exceeded budget of its own would


THREE_SITES = """
def work(rank):
    a = own(3 * MiB)
    b = own(2 * MiB)
    c = own(1 * MiB)

@pytest.mark.cpu_memory(max="1M")
def test_spawn():
    tmp.spawn(work, nprocs=1)
"""


@pytest.mark.parametrize("top", [2, 3])
def test_a_childs_failure_lists_as_many_sites_as_memlab_top(inner, top):
    """What was live at a child's peak is listed as the test's own is: as
    many sites as --memlab-top, heaviest first."""
    result, data = run(inner, THREE_SITES, f"--memlab-top={top}")
    assert result.ret == 1
    text = result.stdout.str()
    # The failure section only: on CI (pytest sees $CI) the short summary
    # repeats the whole message.
    failure = text.split("short test summary info")[0]
    sites = [line for line in failure.splitlines() if "% " in line and "test_kids.py" in line and " own: " in line]
    assert [line.split()[0] + " " + line.split()[1] for line in sites] == ["3.0 MiB", "2.0 MiB", "1.0 MiB"][:top], text


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_multiprocessing_children_each_measured(inner, method):
    result, data = run(inner, f"""
def child(n):
    x = own(n)

def test_mp():
    ctx = mp.get_context("{method}")
    ps = [ctx.Process(target=child, args=((i + 2) * MiB,)) for i in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    assert [p.exitcode for p in ps] == [0, 0]
""")
    assert result.ret == 0, result.stdout.str()
    procs, _ = processes(data, "test_mp")
    assert sorted(peaks(procs).values()) == [2 * MiB, 3 * MiB], procs
    assert all(p["rank"] is None for p in procs)


LEAVES_RANK = """
import os

def test_leaves_rank():
    os.environ["RANK"] = "0"   # as a real distributed suite's test does, and leaves it
"""


@pytest.mark.parametrize("files", [["test_kids.py"], ["test_rank.py", "test_kids.py"],
                                   ["test_kids.py", "test_rank.py"]], ids=["alone", "after", "before"])
def test_a_rank_an_earlier_test_left_is_no_childs_rank(inner, monkeypatch, files):
    """RANK set by an earlier test and left in the environment is inherited
    by every later child: no rank of theirs.  Their labels, and the test's
    baseline entries, are the same with or without that test, in either
    order."""
    monkeypatch.setenv("RANK", "-")
    monkeypatch.delenv("RANK")   # the in-process runs share os.environ: undone after
    inner.makepyfile(test_rank=LEAVES_RANK, test_kids=HEADER + '''
def child(n):
    x = own(n)

def test_mp():
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=child, args=((i + 1) * MiB,)) for i in range(2)]
    for p in ps:
        p.start()
        p.join()
    assert [p.exitcode for p in ps] == [0, 0]
''')
    result = inner.runpytest_inprocess(*files, "-p", "no:randomly", "--memlab-json=r.json",
                                       "--memlab-baseline=bl.json", "--memlab-update-baseline")
    assert result.ret == 0, result.stdout.str()
    procs, test = processes(json.loads((inner.path / "r.json").read_text()), "test_mp")
    assert peaks(procs) == {"process 0": 1 * MiB, "process 1": 2 * MiB}, procs
    assert [p["rank"] for p in procs] == [None, None]
    entries = json.loads((inner.path / "bl.json").read_text())["tests"]["test_kids.py::test_mp"]
    assert sorted(entries) == ["cpu"], entries   # no rank entry: none is a rank
    result.stdout.fnmatch_lines(["  cpu own peak: process 0 1.0 MiB, process 1 2.0 MiB; max 2.0 MiB (process 1)*"])


HARNESS = """
class Harness:   # the shape of torch's MultiProcessTestCase: _run(rank, ...) in each process
    @classmethod
    def _run(cls, rank, test_name, **kwargs):
        x = own((rank + 1) * MiB)

def test_harness():
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=Harness._run, name="process " + str(r), args=(r, "t"), kwargs={"fake_pg": False})
          for r in (1, 0)]
    for p in ps:
        p.start()
        p.join()
    assert [p.exitcode for p in ps] == [0, 0]
"""


def test_a_harness_that_passes_each_process_its_rank_names_the_ranks(inner):
    """A process started with a target whose parameter named rank is given
    an int is that rank (the multi-process test harness's children have no
    RANK variable, and their process group is gone when they report):
    labels, ranks, the spread over ranks and the baseline's rank entries."""
    result, data = run(inner, HARNESS, "--memlab-baseline=bl.json", "--memlab-update-baseline")
    assert result.ret == 0, result.stdout.str()
    procs, test = processes(data, "test_harness")
    assert peaks(procs) == {"rank 0": 1 * MiB, "rank 1": 2 * MiB}
    assert [p["rank"] for p in procs] == [0, 1]
    assert test["across_processes"]["cpu"]["worst"] == "rank 1"
    entries = json.loads((inner.path / "bl.json").read_text())["tests"]["test_kids.py::test_harness"]
    assert entries["cpu@rank 0"]["peak"] == 1 * MiB and entries["cpu@rank 1"]["peak"] == 2 * MiB


REAL_HARNESS = """
import pytest, torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

MiB = 2**20


class TestGlooRanks(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _tensor(self):
        dist.init_process_group("gloo", store=dist.FileStore(self.file_name, self.world_size),
                                rank=self.rank, world_size=self.world_size)
        x = torch.full(((self.rank + 1) * MiB // 4,), float(self.rank))
        dist.barrier()
        dist.destroy_process_group()
        return x

    @pytest.mark.cpu_memory   # gloo's ranks work on the CPU: measured there on a machine with GPUs too
    def test_ranks(self):
        self._tensor()

    @pytest.mark.cpu_memory(max="1.5M")
    def test_budget(self):
        self._tensor()
"""


@pytest.mark.skipif(importlib.util.find_spec("expecttest") is None, reason="torch's harness needs expecttest")
def test_torchs_multi_process_harness_names_its_ranks_and_judges_each(inner):
    """torch's own harness (MultiProcessTestCase, gloo on the CPU): its
    children have no RANK and their process group is gone when they
    report; they are ranks all the same, and a rank over its budget fails
    the test naming it and what was live at its peak."""
    inner.makepyfile(test_harness=REAL_HARNESS)
    result = inner.runpytest_subprocess("-p", "no:randomly", "--memlab", "--memlab-json=r.json",
                                        "--memlab-baseline=bl.json", "--memlab-update-baseline")
    result.assert_outcomes(passed=1, failed=1)
    data = json.loads((inner.path / "r.json").read_text())
    procs, test = processes(data, "test_ranks")
    # each rank's tensor, and the byte of the tensor gloo's barrier makes
    # (torch's own; a few bytes at most)
    own = {p["label"]: p["devices"]["cpu"]["top"][0]["bytes"] for p in procs}
    assert own == {"rank 0": 1 * MiB, "rank 1": 2 * MiB}, procs
    assert all(0 <= peak - own[label] <= 64 for label, peak in peaks(procs).items()), procs
    assert [p["rank"] for p in procs] == [0, 1]
    assert test["across_processes"]["cpu"]["over"] == "ranks"
    entries = json.loads((inner.path / "bl.json").read_text())["tests"]["test_harness.py::TestGlooRanks::test_ranks"]
    assert sorted(entries) == ["cpu", "cpu@rank 0", "cpu@rank 1"], entries
    assert entries["cpu@rank 1"]["peak"] == peaks(procs)["rank 1"]
    result.stdout.fnmatch_lines([
        "rank 1 (pid *): cpu peak 2.0 MiB exceeds max 1.5 MiB by 512.0 KiB",
        "  live at the peak, by the line that allocated it (user call chain):",
        "       2.0 MiB 100%  test_harness.py:* TestGlooRanks._tensor: x = torch.full(*",
    ])
    _, budget = processes(data, "test_budget")
    assert budget["failed_by_memlab"] == ["cpu max [rank 1]"]


def test_a_forkserver_that_outlives_its_test_measures_each_test_into_its_own(inner):
    """The forkserver starts in the first test, with its environment; the
    second test's children are the second test's, and a test that is not
    measured gets none."""
    result, data = run(inner, """
def child(n):
    x = own(n)

def start(n):
    p = mp.get_context("forkserver").Process(target=child, args=(n,))
    p.start(); p.join()
    assert p.exitcode == 0

def test_first():
    start(2 * MiB)

def test_second():
    start(3 * MiB)

@pytest.mark.skip
def test_skipped():
    pass
""", "-p", "no:randomly")
    assert result.ret == 0, result.stdout.str()
    assert list(peaks(processes(data, "test_first")[0]).values()) == [2 * MiB]
    assert list(peaks(processes(data, "test_second")[0]).values()) == [3 * MiB]


def test_a_subprocess_running_python_is_measured(inner):
    result, data = run(inner, """
def test_sub():
    subprocess.run([sys.executable, "-c", "import torch; x = torch.empty(5 * 2**20, dtype=torch.uint8)"], check=True)
    subprocess.run([sys.executable, "-c", "print('no torch here')"], check=True)
""")
    assert result.ret == 0
    procs, _ = processes(data, "test_sub")
    # the child that never imported torch allocated no tensor: nothing to report
    assert [(p["label"], p["devices"]["cpu"]["peak"]) for p in procs] == [("python -c", 5 * MiB)]


def test_a_folder_an_earlier_test_left_neither_hides_a_child_nor_invents_one(inner):
    """disarm asks the children's root for its link count before it looks
    for the test's own folder (a fresh lookup costs each test more): a
    folder left there by a child that outlived its test (it raises the
    count) must neither hide a later test's child nor give one to a test
    that started none."""
    result, data = run(inner, """
from pytest_memlab.children import gathering

def test_leaves_a_folder():
    os.makedirs(os.path.join(gathering._root, "left-by-a-late-child"), exist_ok=True)

def test_no_child():
    x = own(MiB)

def test_sub():
    subprocess.run([sys.executable, "-c", "import torch; x = torch.empty(3 * 2**20, dtype=torch.uint8)"], check=True)

def test_no_child_again():
    os.rmdir(os.path.join(gathering._root, "left-by-a-late-child"))
    x = own(MiB)

def test_sub_again():
    subprocess.run([sys.executable, "-c", "import torch; x = torch.empty(2 * 2**20, dtype=torch.uint8)"], check=True)
""", "-p", "no:randomly")
    assert result.ret == 0, result.stdout.str()
    assert processes(data, "test_no_child")[0] == []
    assert processes(data, "test_no_child_again")[0] == []
    assert [(p["label"], p["devices"]["cpu"]["peak"]) for p in processes(data, "test_sub")[0]] == [("python -c", 3 * MiB)]
    assert [(p["label"], p["devices"]["cpu"]["peak"]) for p in processes(data, "test_sub_again")[0]] == [
        ("python -c", 2 * MiB)]


def test_a_test_that_removes_the_childrens_folder_leaves_later_tests_measured(inner):
    result, data = run(inner, """
import shutil
from pytest_memlab.children import gathering

def test_removes_it():
    shutil.rmtree(gathering._root)

def test_no_child():
    x = own(MiB)

def test_sub():
    subprocess.run([sys.executable, "-c", "import torch; x = torch.empty(3 * 2**20, dtype=torch.uint8)"], check=True)
""", "-p", "no:randomly")
    assert result.ret == 0, result.stdout.str()
    for name in ("test_removes_it", "test_no_child", "test_sub"):
        assert not processes(data, name)[1].get("memlab_error"), processes(data, name)[1]
    assert processes(data, "test_no_child")[0] == []
    assert processes(data, "test_no_child")[1]["devices"]["cpu"]["peak"] == MiB
    assert [(p["label"], p["devices"]["cpu"]["peak"]) for p in processes(data, "test_sub")[0]] == [("python -c", 3 * MiB)]


def test_dataloader_workers_are_measured(inner):
    result, data = run(inner, """
from torch.utils.data import DataLoader

def collate(batch):
    return own(MiB)          # each batch: 1 MiB, made in a worker

def test_loader():
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, collate_fn=collate)
    sizes = [b.numel() for b in loader]
    assert sizes == [MiB] * 4
""")
    assert result.ret == 0, result.stdout.str()
    procs, _ = processes(data, "test_loader")
    assert sorted(p["label"] for p in procs) == ["DataLoader worker 0", "DataLoader worker 1"]
    for p in procs:
        # a worker's batches go to the parent through shared memory, one
        # at a time per prefetch slot: at least one batch was held at once
        assert p["devices"]["cpu"]["peak"] >= MiB, p


def test_ddp_training_step_with_gloo_per_rank(inner):
    result, data = run(inner, """
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def step(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(32, 256)).sum().backward()
    opt.step()
    dist.destroy_process_group()

def test_ddp():
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    tmp.spawn(step, args=(port,), nprocs=2)
""")
    assert result.ret == 0, result.stdout.str()
    procs, test = processes(data, "test_ddp")
    assert [p["label"] for p in procs] == ["rank 0", "rank 1"]
    weights = (256 * 256 + 256) * 4
    for p in procs:
        # the model's weights, their gradients and DDP's buckets at least
        assert p["devices"]["cpu"]["peak"] >= 2 * weights, p
    assert set(test["across_processes"]["cpu"]) == {"over", "processes", "max", "worst", "min", "spread", "devices"}


def test_a_child_that_crashes_is_reported_missing_and_the_parent_stays_sound(inner):
    result, data = run(inner, """
def test_crash():
    x = own(3 * MiB)
    p = subprocess.run([sys.executable, "-c",
                        "import os, torch; x = torch.empty(2**20, dtype=torch.uint8); os.abort()"])
    assert p.returncode != 0
""")
    assert result.ret == 0
    procs, test = processes(data, "test_crash")
    assert [p["state"] for p in procs] == ["missing"]
    assert "ended without reporting its figures (killed, or crashed)" in procs[0]["why"]
    assert test["devices"]["cpu"]["peak"] == 3 * MiB
    result.stdout.fnmatch_lines(["  python -c (pid *): no figures: it ended without reporting its figures*"])


CHECK_ENV = """
def test_unmarked():
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('MEMLAB_CHILD'))"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "None"
"""


def test_no_child_is_armed_when_the_test_is_not_measured(inner):
    unmarked = HEADER.replace("pytestmark = pytest.mark.cpu_memory", "")
    inner.makepyfile(test_kids=unmarked + CHECK_ENV)
    assert inner.runpytest_inprocess("-v").ret == 0   # no --memlab: not measured


def test_memlab_children_off_arms_nothing(inner):
    result, data = run(inner, CHECK_ENV, "--memlab-children=off")
    assert result.ret == 0
    assert "processes" not in data["tests"][0]


def test_a_bad_memlab_children_value_is_a_usage_error(inner):
    inner.makepyfile(test_kids=HEADER + CHECK_ENV)
    result = inner.runpytest_inprocess("--memlab-children=maybe")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--memlab-children*'maybe' is not one of on, off*"])


def test_a_child_of_another_plugin_version_is_refused_by_name(inner, tmp_path):
    """The child imports another copy of pytest-memlab (PYTHONPATH first):
    its figures are not mixed into this test's, and the report says why."""
    import pytest_memlab

    other = tmp_path / "other"
    shutil.copytree(os.path.dirname(pytest_memlab.__file__), other / "pytest_memlab")
    init = other / "pytest_memlab" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "0.0.1-other+'))
    result, data = run(inner, f"""
def test_other():
    env = dict(os.environ, PYTHONPATH={str(other)!r})
    p = subprocess.run([sys.executable, "-c", "import torch; x = torch.empty(2**20, dtype=torch.uint8)"],
                       env=env, capture_output=True, text=True)
    print("CHILD", p.returncode, p.stdout, p.stderr)
""", "-s")
    assert result.ret == 0
    procs, _ = processes(data, "test_other")
    assert [p["state"] for p in procs] == ["missing"], result.stdout.str()
    assert "it ran pytest-memlab 0.0.1-other+" in procs[0]["why"]
    assert "install one version for every process" in procs[0]["why"]


def test_the_startup_hook_is_inert_without_the_variable():
    """The .pth line the plugin installs runs in every Python start: without
    the variable it imports nothing of memlab's."""
    from pytest_memlab.children import startup_hook

    assert startup_hook.ensure() == ""
    assert open(startup_hook.hook_path()).read() == startup_hook.LINE
    env = {k: v for k, v in os.environ.items() if k != "MEMLAB_CHILD"}
    out = subprocess.run([sys.executable, "-c", "import sys; print(sorted(m for m in sys.modules if m.startswith('pytest_memlab')))"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[]"


def test_baselines_keep_each_rank_and_a_rank_that_grew_fails_named(inner, monkeypatch):
    body = """
def work(rank):
    grow = int(os.environ.get("GROW", "0"))
    x = own((rank + 1 + grow * rank) * MiB)

def test_spawn():
    tmp.spawn(work, nprocs=2)
"""
    result, _ = run(inner, body, "--memlab-baseline=bl.json", "--memlab-update-baseline")
    assert result.ret == 0
    entries = json.loads((inner.path / "bl.json").read_text())["tests"]["test_kids.py::test_spawn"]
    assert entries["cpu@rank 0"]["peak"] == 1 * MiB and entries["cpu@rank 1"]["peak"] == 2 * MiB
    assert "cpu" in entries   # the test's own process, as before

    result, data = run(inner, body, "--memlab-baseline=bl.json")
    assert result.ret == 0   # the same again: every rank within the tolerance

    monkeypatch.setenv("GROW", "1")   # rank 1 now holds 3 MiB, rank 0 the same 1 MiB
    result, data = run(inner, body, "--memlab-baseline=bl.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["rank 1 (pid *): cpu peak grew from 2.0 MiB to 3.0 MiB (+50.0%), over the "
                                 "tolerance 2%,64KiB (baseline bl.json)"])
    assert "rank 0 (pid" not in result.stdout.str()
    assert processes(data, "test_spawn")[1]["failed_by_memlab"] == ["cpu baseline [rank 1]"]


def test_the_html_report_lists_each_rank(inner, tmp_path):
    from test_reports import CHROMIUM

    inner.makepyfile(test_kids=HEADER + SPAWN)
    result = inner.runpytest_inprocess("--memlab-html=r.html", "--memlab-details=all")
    assert result.ret == 0
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (ci/install installs Debian's chromium)")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p'}",
                          "--dump-dom", (inner.path / "r.html").as_uri() + "#test=0"],
                         capture_output=True, text=True, timeout=120)
    assert "data-errors" not in dom.stdout.split("<body", 1)[0], dom.stdout[:500]
    table = dom.stdout.split('<table id="processes">')[1].split("</table>")[0]
    assert "<td>1.0 MiB</td>" in table and "<td>2.0 MiB</td>" in table
    assert ">rank 0</td>" in table and ">rank 1</td>" in table
    assert "2 processes: max 2.0 MiB (rank 1), spread 1.0 MiB" in dom.stdout


def test_a_child_that_cannot_be_measured_says_why(inner):
    """A child whose measurement cannot start (here: MEMLAB_BRIDGE names no
    file) runs on unmeasured, and the test's result says why."""
    result, data = run(inner, """
def test_unmeasurable():
    env = dict(os.environ, MEMLAB_BRIDGE="/nonexistent/bridge.so", MEMLAB_CORE="bridge")
    subprocess.run([sys.executable, "-c", "import torch; x = torch.empty(2**20, dtype=torch.uint8)"],
                   env=env, check=True, capture_output=True)
""")
    assert result.ret == 0
    procs, _ = processes(data, "test_unmeasurable")
    assert [p["state"] for p in procs] == ["missing"]
    assert "it could not be measured: MemlabCoreError: " in procs[0]["why"] and "/nonexistent/bridge.so" in procs[0]["why"]


def test_children_under_xdist_reach_the_controllers_report(inner):
    """A worker measures its test's children; their figures travel to the
    controller with the test's report and land in its JSON report."""
    result, data = run(inner, SPAWN, "-n", "2", "-p", "xdist")
    assert result.ret == 0, result.stdout.str()
    procs, test = processes(data, "test_spawn")
    assert peaks(procs) == {"rank 0": 1 * MiB, "rank 1": 2 * MiB}
    assert test["across_processes"]["cpu"]["worst"] == "rank 1"


def test_a_childs_imports_run_untraced_and_its_lines_after_them_are_traced(inner):
    """A measured child imports with the trace function off (Python < 3.12:
    a harness's import paid it on every frame), and has it back for the
    line that imported: what the child allocates after an import, a failed
    import caught, and a nested function's import is charged to its line."""
    inner.makepyfile(kid_helper="""
import torch
TABLE = torch.ones(1024, dtype=torch.uint8)   # allocated at its import: no line of the child's
def make(n):
    return torch.empty(n, dtype=torch.uint8)
""")
    result, data = run(inner, """
def work(rank):
    import kid_helper
    a = own(3 * MiB)
    try:
        import no_such_module_here
    except ImportError:
        pass
    b = kid_helper.make(2 * MiB)
    import json
    c = own(1 * MiB)

@pytest.mark.cpu_memory(max="1M")
def test_spawn():
    tmp.spawn(work, nprocs=1)
""", "--memlab-top=3")
    assert result.ret == 1
    failure = result.stdout.str().split("short test summary info")[0]
    result.stdout.fnmatch_lines([
        "rank 0 (pid *): cpu peak 6.0 MiB exceeds max 1.0 MiB by 5.0 MiB",
        "       3.0 MiB  50%  test_kids.py:* own: x = torch.empty(n, dtype=torch.uint8)",
        "                         <- test_kids.py:* work: a = own(3 * MiB)",
        "       2.0 MiB  33%  kid_helper.py:* make: return torch.empty(n, dtype=torch.uint8)",
        "                         <- test_kids.py:* work: b = kid_helper.make(2 * MiB)",
        "       1.0 MiB  17%  test_kids.py:* own: x = torch.empty(n, dtype=torch.uint8)",
        "                         <- test_kids.py:* work: c = own(1 * MiB)",
    ])
    assert "import kid_helper" not in failure


def test_the_parents_rank_is_read_as_os_environ_has_it(monkeypatch, tmp_path):
    """Arming a test reads the parent's RANK (a child that inherits it is
    no rank) from os.environ's own table: the same value os.environ.get
    gives, set, unset or not a str's encoding, and from a mapping a test
    put in os.environ's place.  The variable it sets is in os.environ and
    in the environment a child inherits, and disarming takes it out of
    both."""
    import json
    import subprocess

    from pytest_memlab.children.gathering import ChildWatch
    from pytest_memlab.children.startup import ENV

    monkeypatch.delenv(ENV, raising=False)
    watch = ChildWatch(tmp_path, [], 5)

    def armed_rank():
        armed = watch.arm(["cpu"])
        try:
            config = json.loads(os.environ[ENV])
            assert config["dir"] == armed[0]
            if isinstance(os.environ, dict):   # a test's own mapping: no child sees it
                return config["parent_rank"]
            seen = subprocess.run([sys.executable, "-c", f"import os; print(os.environ[{ENV!r}])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            assert json.loads(seen) == config
            assert os.getenv(ENV) == os.environ[ENV]
            return config["parent_rank"]
        finally:
            assert watch.disarm(armed) == []
            assert ENV not in os.environ and os.getenv(ENV) is None

    monkeypatch.delenv("RANK", raising=False)
    assert armed_rank() is None
    monkeypatch.setenv("RANK", "3")
    assert armed_rank() == os.environ.get("RANK") == "3"
    monkeypatch.setenv("RANK", "r\udcff")   # undecodable bytes, as os.environ holds them
    assert armed_rank() == os.environ.get("RANK")
    monkeypatch.setattr(os, "environ", {"RANK": "5"})
    assert armed_rank() == "5"


def test_arming_many_tests_leaves_nothing_allocated_in_the_environment(monkeypatch, tmp_path):
    """Each measured test sets the children's variable to a value never
    seen before.  glibc's setenv (os.putenv) keeps a copy of each for the
    life of the process; memlab writes it through buffers of its own, so
    arming and disarming thousands of tests leaves the C heap as it was,
    while the environment a child inherits says each test's folder."""
    import ctypes
    import json
    import subprocess

    from pytest_memlab.children.gathering import ChildWatch
    from pytest_memlab.children.startup import ENV

    try:
        libc = ctypes.CDLL(None)
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        pytest.skip("glibc's mallinfo2 is not here")

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                         "usmblks", "fsmblks", "uordblks", "fordblks",
                                                         "keepcost")]

    mallinfo2.restype = Mallinfo2
    monkeypatch.delenv(ENV, raising=False)
    watch = ChildWatch(tmp_path, [], 5)
    watch.disarm(watch.arm(["cpu"]))   # the first arming installs and makes what lasts
    before = mallinfo2().uordblks
    for _ in range(5000):
        armed = watch.arm(["cpu"])
        assert json.loads(os.environ[ENV])["dir"] == armed[0]
        watch.disarm(armed)
    grown = mallinfo2().uordblks - before
    assert grown < 5000 * 16, f"{grown / 5000:.0f} bytes a test left allocated"
    # (os.putenv, for comparison: what the engine's buffers avoid)
    before = mallinfo2().uordblks
    for i in range(5000):
        os.putenv(ENV, f"{'x' * 200}{i}")
    os.unsetenv(ENV)
    assert mallinfo2().uordblks - before > 5000 * 100
    armed = watch.arm(["cpu"])
    try:
        seen = subprocess.run([sys.executable, "-c", f"import os; print(os.environ[{ENV!r}])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert json.loads(seen)["dir"] == armed[0] == json.loads(os.environ[ENV])["dir"]
    finally:
        watch.disarm(armed)
    assert os.getenv(ENV) is None and ENV not in os.environ
