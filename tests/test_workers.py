"""Spreading a suite: one GPU per pytest-xdist worker, and tests on a
second GPU (cuda:1 markers, set_target_gpu(1)).  The pinning itself is
checked on any machine (it only sets CUDA_VISIBLE_DEVICES); the rest needs
two GPUs (ci/gpu on nvidia-h200-x2)."""

import json
import os

import pytest

from conftest import requires_cuda, requires_torch, requires_two_gpus

pytestmark = requires_torch

MiB = 2**20


RECORD = """
import json, os
import pytest

@pytest.mark.parametrize("n", range(%(tests)d))
def test_where(n, worker_id):
    with open(f"seen-{worker_id}-{n}.json", "w") as f:
        json.dump(os.environ.get("CUDA_VISIBLE_DEVICES"), f)
"""


def seen(path) -> dict[str, set]:
    out: dict[str, set] = {}
    for f in path.glob("seen-*.json"):
        worker = f.name.split("-")[1]
        out.setdefault(worker, set()).add(json.loads(f.read_text()))
    return out


@pytest.mark.parametrize("visible, workers, per, expected", [
    ("3,5", 2, 1, {"gw0": {"3"}, "gw1": {"5"}}),
    ("3,5", 3, 1, {"gw0": {"3"}, "gw1": {"5"}, "gw2": {"3"}}),     # more workers than GPUs: they share
    ("0,1,2,3", 2, 2, {"gw0": {"0,1"}, "gw1": {"2,3"}}),
])
def test_each_worker_gets_its_own_gpus(inner, monkeypatch, visible, workers, per, expected):
    inner.makepyfile(test_where=RECORD % {"tests": 6})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    result = inner.runpytest_subprocess("-n", str(workers), f"--memlab-gpus-per-worker={per}", "--memlab")
    result.assert_outcomes(passed=6)
    assert seen(inner.path) == {w: g for w, g in expected.items() if w in seen(inner.path)}
    assert len(seen(inner.path)) >= 2
    result.stdout.fnmatch_lines(["GPUs per worker (CUDA_VISIBLE_DEVICES): gw0 -> *, gw1 -> *"])


def test_the_bare_flag_means_one_gpu_each(inner, monkeypatch):
    inner.makepyfile(test_where=RECORD % {"tests": 4})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,8")
    result = inner.runpytest_subprocess("-n", "2", "--memlab-gpus-per-worker", "--memlab")
    result.assert_outcomes(passed=4)
    assert {g for gs in seen(inner.path).values() for g in gs} <= {"7", "8"}


def test_without_workers_it_says_so_and_changes_nothing(inner, monkeypatch):
    inner.makepyfile(test_where=RECORD.replace(", worker_id", "").replace("{worker_id}", "main") % {"tests": 1})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    result = inner.runpytest_subprocess("--memlab-gpus-per-worker=1", "--memlab")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["--memlab-gpus-per-worker works under pytest-xdist (-n N) only; this run has no workers"])
    assert json.loads((inner.path / "seen-main-0.json").read_text()) == "3,5"


@pytest.mark.parametrize("visible, device, expected", [
    (None, "cuda:0", ""), ("", "cuda:1", ""), ("3,5", "cuda:0", "3"), ("3, 5", "cuda:1", "5"),
    ("3,5", "cuda:2", ""), ("3,5", "cpu", ""),
    ("GPU-8f4c2a61-0d2e-4b1c-9a7e-1c2d3e4f5a6b", "cuda:0", "GPU-8f4c2a61-0d2e-4b1c-9a7e-1c2d3e4f5a6b"),
])
def test_the_machines_gpu_behind_a_device(monkeypatch, visible, device, expected):
    from pytest_memlab.devices import machine_gpu

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert machine_gpu(device) == expected


ON_MY_GPU = """
import torch, pytest

@pytest.mark.parametrize("n", range(4))
@pytest.mark.cuda_memory(max="64MiB")
def test_on_my_gpu(n):
    x = torch.empty((n + 1) * 2**20, dtype=torch.uint8, device="cuda")
    del x
"""


@requires_cuda
def test_pinned_workers_on_one_gpu_share_it_and_the_report_names_it(inner, monkeypatch):
    """On a one-GPU machine both workers get GPU 0; each test's figures are
    its own, and the report names the machine's GPU behind cuda:0."""
    inner.makepyfile(test_gpus=ON_MY_GPU)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    result = inner.runpytest_subprocess("-n", "2", "--memlab-gpus-per-worker", "--memlab-json=r.json")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["GPUs per worker (CUDA_VISIBLE_DEVICES): gw0 -> 0, gw1 -> 0"])
    tests = {t["nodeid"]: t["devices"] for t in json.loads((inner.path / "r.json").read_text())["tests"]}
    assert {nodeid: (d["cuda:0"]["peak"], d["cuda:0"]["gpu"]) for nodeid, d in tests.items()} == \
        {f"test_gpus.py::test_on_my_gpu[{n}]": ((n + 1) * 2**20, "0") for n in range(4)}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    result = inner.runpytest_subprocess("--memlab-json=r.json")
    result.assert_outcomes(passed=4)
    assert {t["devices"]["cuda:0"]["gpu"] for t in json.loads((inner.path / "r.json").read_text())["tests"]} == {None}


# -- two GPUs ---------------------------------------------------------------------
ON_TWO = """
import torch, pytest
MiB = 2**20

@pytest.mark.cuda_memory(max="10MiB", device="cuda:1")
def test_second_gpu_in_budget():
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda:1")
    y = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda:0")   # measured too, not held to this budget
    del x, y

@pytest.mark.cuda_memory(max="10MiB", device="cuda:1")
def test_second_gpu_over_budget():
    x = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda:1")
    del x

@pytest.mark.cuda_memory(max="10MiB", device=1)
def test_second_gpu_by_index():
    with torch.cuda.device(1):
        x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    del x
"""


@requires_two_gpus
def test_markers_measure_the_second_gpu(inner):
    inner.makepyfile(test_two=ON_TWO)
    result = inner.runpytest_subprocess("--junitxml=junit.xml")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*cuda:1 peak 16.0 MiB exceeds max 10.0 MiB by 6.0 MiB*"])
    junit = (inner.path / "junit.xml").read_text()
    assert 'name="memlab.cuda:1.peak" value="8388608"' in junit
    assert 'name="memlab.cuda:1.peak" value="4194304"' in junit
    # the first GPU, used beside the budget's: its figures, no budget
    assert junit.count('name="memlab.cuda:0.peak"') == 1 and 'name="memlab.cuda:0.peak" value="67108864"' in junit
    assert 'name="memlab.cuda:0.max"' not in junit


BOTH = """
import torch, pytest
MiB = 2**20

@pytest.mark.cuda_memory(max="10MiB", device="cuda:0")
@pytest.mark.cuda_memory(max="10MiB", device="cuda:1")
def test_both_gpus():
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda:0")     # within cuda:0's budget
    y = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda:1")    # over cuda:1's
    del x, y
"""


@requires_two_gpus
def test_a_test_on_both_gpus_is_held_to_each_gpus_budget(inner):
    inner.makepyfile(test_both=BOTH)
    result = inner.runpytest_subprocess("--memlab-json=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cuda:1 peak 16.0 MiB exceeds max 10.0 MiB by 6.0 MiB*"])
    assert "cuda:0 peak 8.0 MiB exceeds" not in result.stdout.str()
    test = json.loads((inner.path / "r.json").read_text())["tests"][0]
    peaks = {device: figures["peak"] for device, figures in test["devices"].items()}
    assert peaks == {"cuda:0": 8 * 2**20, "cuda:1": 16 * 2**20}, test["devices"]
    assert test["failed_by_memlab"] == ["cuda:1 max"]


UNASKED = """
import torch, pytest
MiB = 2**20
kept = []

def test_unmarked_on_both():
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda:0")
    y = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda:1")
    del x, y

def test_unmarked_on_the_first_only():
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda:0")
    del x

@pytest.mark.cuda_memory(max="4MiB")
def test_budget_on_the_first_and_the_second_used_too():
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda:0")
    y = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda:1")   # no budget of its own: reported
    del x, y

def test_leaks_on_the_second():
    kept.append(torch.empty(MiB, dtype=torch.uint8, device="cuda:1"))
"""


@requires_two_gpus
def test_every_gpu_a_test_uses_is_measured(inner):
    """A test that asks for one GPU (or none: --memlab) and uses another
    too: both are measured and reported, the budget holds on its own GPU
    only, a GPU the test did not use is left out, and a leak on the other
    GPU is caught."""
    inner.makepyfile(test_unasked=UNASKED)
    result = inner.runpytest_subprocess("--memlab-json=r.json", "-p", "no:randomly")
    result.assert_outcomes(passed=4)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((inner.path / "r.json").read_text())["tests"]}
    peaks = {name: {d: f["peak"] for d, f in t["devices"].items()} for name, t in tests.items()}
    assert peaks == {
        "test_unmarked_on_both": {"cuda:0": 3 * MiB, "cuda:1": 5 * MiB},
        "test_unmarked_on_the_first_only": {"cuda:0": 2 * MiB},
        "test_budget_on_the_first_and_the_second_used_too": {"cuda:0": 3 * MiB, "cuda:1": 6 * MiB},
        # cuda:0 is the one it asked for; what it kept is left out of the
        # peak of record (the leak check reports it), not out of the figures
        "test_leaks_on_the_second": {"cuda:0": 0, "cuda:1": 0},
    }, peaks
    leaked = tests["test_leaks_on_the_second"]["devices"]["cuda:1"]
    assert (leaked["peak_with_kept"], leaked["kept"]) == (MiB, MiB), leaked
    budgeted = tests["test_budget_on_the_first_and_the_second_used_too"]["devices"]
    assert (budgeted["cuda:0"]["max"], budgeted["cuda:1"]["max"]) == (4 * MiB, None)
    assert tests["test_leaks_on_the_second"]["warned"] == ["cuda:1 leaks"]
    assert tests["test_leaks_on_the_second"]["devices"]["cuda:1"]["leaked"] == MiB


@requires_two_gpus
def test_set_target_gpu_one(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "prof.py"
    script.write_text(textwrap.dedent("""
        import torch
        from pytest_memlab import profile, set_target_gpu
        set_target_gpu(1)

        @profile
        def work():
            a = torch.empty(2**20, dtype=torch.uint8, device="cuda:1")
            b = torch.empty(2**22, dtype=torch.uint8, device="cuda:0")
            return a, b

        work()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env={**os.environ, "MEMLAB_CORE": "bridge"})
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if 'device="cuda:1"' in line)
    assert "1.0 MiB" in row
    row0 = next(line for line in out.stdout.splitlines() if 'device="cuda:0"' in line)
    assert "4.0 MiB" not in row0   # cuda:0 is not the target


PER_WORKER = """
import json, torch, pytest
MiB = 2**20

@pytest.mark.parametrize("n", range(8))
@pytest.mark.cuda_memory(max="64MiB")
def test_on_my_gpu(n, worker_id):
    assert torch.cuda.device_count() == 1
    x = torch.empty((n + 1) * MiB, dtype=torch.uint8, device="cuda")
    with open(f"uuid-{worker_id}-{n}.json", "w") as f:
        json.dump(str(torch.cuda.get_device_properties(0).uuid), f)
    del x
"""


@requires_two_gpus
def test_one_worker_per_gpu_writes_one_baseline(inner):
    inner.makepyfile(test_gpus=PER_WORKER)
    result = inner.runpytest_subprocess("-n", "2", "--memlab-gpus-per-worker", "--memlab-baseline=bl.json",
                                        "--memlab-update-baseline", "--memlab-json=r.json")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["GPUs per worker (CUDA_VISIBLE_DEVICES): gw0 -> 0, gw1 -> 1",
                                 "baseline bl.json [[]cuda[]] updated: 8 tests written (8 new, 0 changed)"])
    uuids = {}
    for f in inner.path.glob("uuid-*.json"):
        uuids.setdefault(f.name.split("-")[1], set()).add(json.loads(f.read_text()))
    assert len(uuids) == 2 and all(len(u) == 1 for u in uuids.values())
    assert uuids["gw0"] != uuids["gw1"]     # two workers, two GPUs
    # the report names the machine's GPU behind each worker's cuda:0
    ran_on = {int(f.name.split("-")[2].split(".")[0]): f.name.split("-")[1] for f in inner.path.glob("uuid-*.json")}
    report = {t["nodeid"]: t["devices"]["cuda:0"] for t in json.loads((inner.path / "r.json").read_text())["tests"]}
    assert {n: report[f"test_gpus.py::test_on_my_gpu[{n}]"]["gpu"] for n in range(8)} == \
        {n: {"gw0": "0", "gw1": "1"}[w] for n, w in ran_on.items()}
    assert [report[f"test_gpus.py::test_on_my_gpu[{n}]"]["peak"] for n in range(8)] == [(n + 1) * 2**20 for n in range(8)]
    tests = json.loads((inner.path / "bl.json").read_text())["tests"]
    assert sorted(tests[f"test_gpus.py::test_on_my_gpu[{n}]"]["cuda"]["peak"] for n in range(8)) == \
        [(n + 1) * 2**20 for n in range(8)]
    result = inner.runpytest_subprocess("-n", "2", "--memlab-gpus-per-worker", "--memlab-baseline=bl.json")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["baseline bl.json [[]cuda[]]: 8 compared"])
    print(result.stdout.str())
