import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

import forked_pytest

pytest_plugins = ["pytester"]

# A CI job's summary file: every run these tests start would append memlab's
# section there (the summary's own tests name their file).
os.environ.pop("GITHUB_STEP_SUMMARY", None)

HAS_ASYNCIO = importlib.util.find_spec("pytest_asyncio") is not None
HAS_BENCHMARK = importlib.util.find_spec("pytest_benchmark") is not None


def pytest_addoption(parser):
    # setup.cfg sets pytest-asyncio's loop scope (the zoo's plugin warns
    # when it is unset); where that plugin is not installed (the torch-free
    # lanes) the key is declared here, so that pytest does not call it unknown.
    if not HAS_ASYNCIO:
        parser.addini("asyncio_default_fixture_loop_scope", "pytest-asyncio's, when installed")

MiB = 2**20


def pytest_configure(config):
    # xdist's own marker, declared where xdist is not installed too
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one xdist worker "
                            "(ci/test: --dist loadgroup)")


def _measured_durations() -> dict:
    """ci/test-durations.txt: each slow test's measured seconds, by node id."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ci", "test-durations.txt")
    durations = {}
    try:
        with open(path) as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    seconds, nodeid = line.split(None, 1)
                    durations[nodeid.strip()] = float(seconds)
    except (OSError, ValueError):
        return {}
    return durations


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Under xdist, the slowest tests (as measured: ci/test-durations.txt)
    first, so that no long test is left to run alone at the end; the others
    keep their order.  A serial run keeps pytest's order (a module-scoped
    fixture is then set up once)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.getvalue("loadgroup"):
        _keep_xdist_groups(items)
    durations = _measured_durations()
    if durations:
        items.sort(key=lambda item: -durations.get(item.nodeid.split("@")[0], 0.0))


def _keep_xdist_groups(items) -> None:
    """pytest-xdist 3.8's --dist loadgroup names a test's group by setting
    item._nodeid to "NODEID@GROUP"; pytest 9.2 keeps a node's id in
    item._id, so the group was lost and each test of a group went to any
    worker (the zoo's unmeasured run, shared by a group, was made on both
    workers; pytest-dev/pytest-xdist#1386).  Here the suffix is set where
    pytest 9.2 reads it."""
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:   # a pytest before 9.2: xdist's own naming works
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid.rsplit("]", 1)[-1]:
            continue   # no group, or xdist named it (a pytest that reads _nodeid)
        item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def has_cuda() -> bool:
    if not has_torch():
        return False
    import torch

    return torch.cuda.is_available()


requires_torch = pytest.mark.skipif(not has_torch(), reason="needs torch")

if has_torch():
    # pytester's in-process runs put sys.modules back as they found it; a
    # module torch imports lazily the first time inside one (dynamo, which
    # optimizers and checkpoint reach) would be imported again by the next
    # and register its operator library twice.  Imported once, here.
    import torch._dynamo  # noqa: F401
requires_cuda = pytest.mark.skipif(not has_cuda(), reason="needs CUDA")


def cuda_count() -> int:
    if not has_torch():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


requires_two_gpus = pytest.mark.skipif(cuda_count() < 2, reason="needs two CUDA devices")


def torchrun(pytester, *args, timeout=240):
    """pytest under torchrun, two ranks on this machine, in pytester's folder."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q", *args]
    return subprocess.run(cmd, cwd=pytester.path, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def pytester(pytester, monkeypatch):
    """pytester, whose in-process runs leave out avoidable warnings.

    pytest-asyncio (installed for the zoo) warns in every run whose ini
    leaves asyncio_default_fixture_loop_scope unset, and an inner run's
    configure-time warnings reach this session's summary past its filters.
    """
    quiet = []
    if HAS_ASYNCIO:
        quiet += ["-o", "asyncio_default_fixture_loop_scope=function"]
    if HAS_BENCHMARK:   # (where installed, as on the GPU machine) warns in every run under xdist
        quiet += ["-p", "no:benchmark"]
    if quiet:
        inline_run = pytester.inline_run

        def quiet_inline_run(*args, **kwargs):
            return inline_run(*quiet, *args, **kwargs)

        monkeypatch.setattr(pytester, "inline_run", quiet_inline_run)
    # runpytest_subprocess's runs: forked from a process that imported torch
    # once (forked_pytest), where the test does not ask for a new interpreter
    popen = pytester.popen

    def forked_popen(cmdargs, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=pytester.CLOSE_STDIN, **kw):
        args = [os.fspath(a) for a in cmdargs]
        if (args[:2] == [sys.executable, "-mpytest"] and stdin is pytester.CLOSE_STDIN and not kw
                and hasattr(stdout, "fileno") and hasattr(stderr, "fileno")):
            env = os.environ.copy()
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
            run = forked_pytest.popen("pytest", args[2:], os.getcwd(), env, stdout, stderr)
            if run is not None:
                return run
        return popen(cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **kw)

    monkeypatch.setattr(pytester, "popen", forked_popen)
    return pytester


@pytest.fixture(scope="session")
def made_once(tmp_path_factory):
    """made_once(key, folder, names, make): the files names in folder, made
    by make() (which writes them into folder) the first time key is asked
    for in this process, and copied from where they were kept after that.
    For runs that several tests read and none changes (an xdist group keeps
    those tests on one worker): ci/test runs the slowest tests first, which
    interleaves modules, so a module-scoped fixture would be made again."""
    kept = tmp_path_factory.mktemp("made-once")

    def made(key: str, folder, names, make) -> None:
        store = kept / key
        if store.is_dir():
            for name in names:
                shutil.copyfile(store / name, folder / name)
            return
        make()
        store.mkdir()
        for name in names:
            shutil.copyfile(folder / name, store / name)

    return made


@pytest.fixture
def inner(pytester):
    """A pytester whose runs see this checkout's environment (MEMLAB_CORE)."""
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\n")
    os.environ.setdefault("MEMLAB_CORE", os.environ.get("MEMLAB_CORE", "auto"))
    return pytester


def device_figures(pytester, name: str = "r.json", device: str = "cpu") -> dict:
    """A run's JSON report (written with --memlab-json=NAME): each test's
    figures on one device, by the test's name."""
    return {t["nodeid"].split("::")[-1]: t["devices"][device]
            for t in json.loads(pytester.path.joinpath(name).read_text())["tests"]}


def line_no(path, text: str) -> int:
    """The number of the first line of a written file that contains text."""
    for i, line in enumerate(open(path).read().splitlines(), 1):
        if text in line:
            return i
    raise AssertionError(f"{text!r} not in {path}")


@pytest.fixture
def core():
    """The chosen backend, which must be the torch bridge."""
    from pytest_memlab.engine.backend import BRIDGE, core

    c = core()
    if c.name != BRIDGE:
        pytest.fail(f"the torch bridge is not in use: {c.reason}")
    return c
