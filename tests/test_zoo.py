"""The conformance zoo (fixtures/zoo): small torch programs run unmeasured,
under --memlab and under markers, and next to other pytest plugins with
memlab on and off.  Each run must give every test the same outcome and the
same bits in every recorded result.  Each run is its own pytest process, as
a user's would be."""

import importlib.util
import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import forked_pytest
from conftest import has_cuda, requires_torch

pytestmark = requires_torch

ZOO = Path(__file__).resolve().parent.parent / "fixtures" / "zoo"
# What the zoo does on its own, unmeasured: these tests fail or error on
# purpose, so that an outcome memlab changed would show.
DELIBERATE = {
    "test_zoo_control_flow.py::test_fails_on_its_own": "failed",
    "test_zoo_control_flow.py::test_errors_in_its_fixture": "error",
    "test_zoo_control_flow.py::test_xfails": "xfailed",
    "test_zoo_control_flow.py::test_skips": "skipped",
}
if has_cuda():
    DELIBERATE["test_zoo_cuda.py::test_out_of_memory_fails_this_test_only"] = "failed"


def run_zoo(tmp_path: Path, name: str, *args: str, env: dict | None = None, files=()):
    """Runs the zoo in a new process; returns (process, results by nodeid)."""
    out = tmp_path / f"{name}.json"
    full_env = {**os.environ, "ZOO_RESULTS": str(out), "PYTHONDONTWRITEBYTECODE": "1",
                "COVERAGE_FILE": str(tmp_path / f".coverage-{name}"), **(env or {})}
    full_env.pop("PYTEST_XDIST_WORKER", None)
    full_env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", *files, *args]
    proc = forked_pytest.run_captured(cmd, ZOO, full_env, timeout=900)
    results: dict = {}
    for part in sorted(tmp_path.glob(f"{name}.json*")):
        results.update(json.loads(part.read_text()))
    if not results:
        pytest.fail(f"the zoo run {name!r} wrote no results (exit {proc.returncode}):\n"
                    + proc.stdout[-4000:] + proc.stderr[-4000:])
    return proc, results


def differences(base: dict, other: dict) -> list[str]:
    """Every test whose outcome or recorded bits differ between two runs."""
    problems = []
    for nodeid in sorted(set(base) | set(other)):
        a, b = base.get(nodeid), other.get(nodeid)
        if a is None or b is None:
            problems.append(f"{nodeid}: ran in only one of the two runs")
            continue
        if a.get("outcome") != b.get("outcome"):
            problems.append(f"{nodeid}: {a.get('outcome')} without memlab, {b.get('outcome')} with it: "
                            f"{b.get('why') or a.get('why')}")
        if a.get("reruns", 0) != b.get("reruns", 0):
            problems.append(f"{nodeid}: rerun {a.get('reruns', 0)} times without memlab, {b.get('reruns', 0)} with it")
        for key in sorted(set(a.get("values", {})) | set(b.get("values", {}))):
            va, vb = a.get("values", {}).get(key), b.get("values", {}).get(key)
            if va != vb:
                problems.append(f"{nodeid}: result {key!r} differs: {va} without memlab, {vb} with it")
    return problems


def measured_tests(junit: Path) -> tuple[set[str], set[str]]:
    """(tests that ran, tests with memlab figures) in a junit file."""
    ran, measured = set(), set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            continue
        name = f"{case.get('classname')}::{case.get('name')}"
        ran.add(name)
        if any(p.get("name", "").endswith(".peak") for p in case.iter("property")):
            measured.add(name)
    return ran, measured


# The tests that compare with the unmeasured run share it (a module-scoped
# fixture, 40 s): under xdist they go to one worker together (ci/test runs
# --dist loadgroup), so that it runs once.
ZOO_GROUP = pytest.mark.xdist_group("zoo-unmeasured")


@pytest.fixture(scope="session")   # not "module": ci/test's order (slowest first) interleaves modules
def unmeasured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zoo")
    _, results = run_zoo(tmp, "unmeasured", "-p", "no:memlab", "-p", "no:randomly")
    return results


@ZOO_GROUP
def test_the_zoo_does_what_it_says_unmeasured(unmeasured):
    outcomes = {nodeid: r["outcome"] for nodeid, r in unmeasured.items()}
    for nodeid, expected in DELIBERATE.items():
        assert outcomes.pop(nodeid) == expected, nodeid
    wrong = {n: (o, unmeasured[n].get("why")) for n, o in outcomes.items()
             if o != "passed" and not (o == "skipped" and ("cuda" in n or "asyncio" in n))}
    assert not wrong
    assert len(outcomes) >= 45


@ZOO_GROUP
@pytest.mark.parametrize("mode", ["--memlab", "markers"])
def test_measuring_changes_no_outcome_and_no_result(unmeasured, tmp_path, mode):
    junit = tmp_path / "junit.xml"
    args = ["-p", "no:randomly", f"--junitxml={junit}"]
    env = {"MEMLAB_CORE": "bridge"}
    if mode == "markers":
        env["ZOO_MARK"] = "1"
    else:
        args.append(mode)
    proc, results = run_zoo(tmp_path, mode.strip("-"), *args, env=env)
    assert differences(unmeasured, results) == []
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
    ran, measured = measured_tests(junit)
    assert ran and ran == measured, f"not measured: {sorted(ran - measured)}"
    # memlab's summary speaks of budgets and leaks only, never of the
    # user's own failures.
    assert "measured tests failed" not in proc.stdout


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# Other plugins: the zoo (its fast part) with the plugin, memlab off and on.
FAST = ["test_zoo_checkpoint.py", "test_zoo_autograd.py", "test_zoo_control_flow.py",
        "test_zoo_process_state.py", "test_zoo_asyncio.py"]
PLUGINS = {
    "pytest-cov": ("pytest_cov", ["--cov=.", "--cov-report="], {}),
    "pytest-cov-sysmon": ("pytest_cov", ["--cov=.", "--cov-report="], {"COVERAGE_CORE": "sysmon"}),
    "pytest-xdist": ("xdist", ["-n", "2"], {}),
    "pytest-timeout": ("pytest_timeout", ["--timeout=300"], {}),
    "pytest-rerunfailures": ("pytest_rerunfailures", ["--reruns=1"], {}),
    "pytest-randomly": ("pytest_randomly", ["-p", "randomly", "-p", "no:xdist", "--randomly-seed=1234"], {}),
    "pytest-asyncio": ("pytest_asyncio", ["-p", "asyncio"], {}),
}


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
def test_next_to_other_plugins_memlab_changes_nothing(tmp_path, plugin):
    module, args, env = PLUGINS[plugin]
    if not _have(module):
        pytest.skip(f"{plugin} is not installed")
    if env.get("COVERAGE_CORE") == "sysmon" and sys.version_info < (3, 12):
        pytest.skip("COVERAGE_CORE=sysmon needs Python 3.12+")
    randomly = [] if plugin == "pytest-randomly" else ["-p", "no:randomly"]
    env = {**env, "MEMLAB_CORE": "bridge"}
    off_proc, off = run_zoo(tmp_path, "off", "-p", "no:memlab", *randomly, *args, env=env, files=FAST)
    on_proc, on = run_zoo(tmp_path, "on", "--memlab", *randomly, *args, env=env, files=FAST)
    assert differences(off, on) == []
    assert "INTERNALERROR" not in on_proc.stdout + on_proc.stderr
    if plugin == "pytest-rerunfailures":
        assert on["test_zoo_control_flow.py::test_fails_on_its_own"].get("reruns") == 1


@ZOO_GROUP
@pytest.mark.skipif(not has_cuda(), reason="needs CUDA")
def test_cuda_zoo_with_expandable_segments(unmeasured, tmp_path):
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "MEMLAB_CORE": "bridge"}
    _, off = run_zoo(tmp_path, "off", "-p", "no:memlab", "-p", "no:randomly", env=env, files=["test_zoo_cuda.py"])
    _, on = run_zoo(tmp_path, "on", "--memlab", "-p", "no:randomly", env=env, files=["test_zoo_cuda.py"])
    assert differences(off, on) == []
