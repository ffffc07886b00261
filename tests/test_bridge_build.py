"""The bridge's build on first use: into a cache folder keyed by torch
version, C++ ABI and CUDA, and a clear error when it cannot be built."""

import ctypes

import pytest

from conftest import requires_torch
from pytest_memlab.engine import bridge_build as bb

pytestmark = requires_torch


def test_build_into_cache_is_keyed_and_loadable(tmp_path):
    import torch

    path = bb.build(torch, tmp_path)
    facts = bb.torch_facts(torch)
    assert path.parent == tmp_path
    assert f"abi{facts['abi']}" in path.name
    assert torch.__version__.replace("+", "_") in path.name
    lib = ctypes.CDLL(str(path))
    from pytest_memlab import _engine

    assert lib.memlab_bridge_abi() == _engine.BRIDGE_ABI == 2
    assert bb.build(torch, tmp_path) == path  # reused, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary files left


def test_a_missing_compiler_is_named(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(bb.BridgeBuildError, match="cannot run the C\\+\\+ compiler '/nonexistent/g\\+\\+'"):
        bb.build(torch, tmp_path / "other")
    assert not any((tmp_path / "other").glob("*.so"))


def test_a_compile_error_is_reported_with_the_command(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("CXX", "false")
    with pytest.raises(bb.BridgeBuildError, match=r"the C\+\+ compiler 'false' failed \(exit 1\); its command and "
                       r"output: .*\.log$") as info:
        bb.build(torch, tmp_path)
    log = str(info.value).rsplit(": ", 1)[1]
    assert open(log).read().startswith("false -O2 -std=c++17")   # the whole command, then its output


def test_cuda_totals_without_cuda_fall_back_to_torch(core):
    """Where the bridge cannot read the CUDA allocator (a CPU build of
    torch, no CUDA), it says so with None and memlab asks torch.cuda."""
    import torch

    from pytest_memlab import _engine as engine

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: tests/test_cuda.py checks the totals")
    assert engine.bridge_cuda_totals(0) is None

    class FakeCuda:   # torch.cuda's two functions, as the fallback calls them
        def memory_allocated(self, index):
            return 1000 + index

        def memory_reserved(self, index):
            return 2000 + index

    assert core.bridge.cuda_totals(FakeCuda(), 3) == (1003, 2003)
    with pytest.raises(OverflowError):
        engine.bridge_cuda_totals(2**80)


def test_a_bridge_of_another_interface_is_refused_with_a_clear_error(tmp_path):
    """A bridge built by another pytest-memlab (MEMLAB_BRIDGE) would send
    events this engine reads otherwise: refused, naming both versions."""
    import shutil
    import subprocess

    from pytest_memlab import _engine
    from pytest_memlab.engine.bridge import Bridge, MemlabCoreError

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "old.c"
    src.write_text("int memlab_bridge_abi(void) { return 1; }\n")
    lib = tmp_path / "libold.so"
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    with pytest.raises(MemlabCoreError, match=f"speaks interface 1, this engine {_engine.BRIDGE_ABI}: rebuild it"):
        Bridge(lib)
