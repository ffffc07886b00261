"""Compiles the torch bridge (csrc/bridge.cpp) against the torch in hand.

The bridge must match the torch that the process imports (its C++ ABI and its
c10 headers), so it is built either at install, when torch is importable
there, into the package's ``_bridge/`` folder, or on first use into a cache
folder.  Both paths use :func:`build`.  This module imports nothing of the
package, so that ``setup.py`` can load it before the package exists.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

BRIDGE_SOURCES = ("bridge.cpp", "memlab_bridge.h")

# The build this process made, if it made one: (path, seconds), for the one
# line that says where the bridge went and how long it took.
BUILT: dict = {}


class BridgeBuildError(RuntimeError):
    """The bridge could not be compiled; the message says why."""


def source_dir() -> Path:
    """Where bridge.cpp lives: inside the installed package, or csrc/ of a
    source checkout (editable installs, running from the tree)."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "csrc", package.parent / "csrc"):
        if all((candidate / name).is_file() for name in BRIDGE_SOURCES):
            return candidate
    raise BridgeBuildError(
        f"the bridge sources {BRIDGE_SOURCES} are in neither {package / 'csrc'} "
        f"nor {package.parent / 'csrc'}"
    )


def torch_facts(torch) -> dict:
    return {
        "version": torch.__version__,
        "abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "cuda": torch.version.cuda or "",
        "root": os.path.dirname(torch.__file__),
    }


def cuda_include_dir(facts: dict) -> str | None:
    """CUDA's headers (c10/cuda includes cuda_runtime_api.h), if any."""
    if not facts["cuda"]:
        return None
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates = [os.path.join(r, "include") for r in roots if r]
    for site in {os.path.dirname(facts["root"])}:
        for sub in ("nvidia/cuda_runtime/include", "nvidia/cu13/include", "nvidia/cu12/include"):
            candidates.append(os.path.join(site, sub))
    for inc in candidates:
        if os.path.isfile(os.path.join(inc, "cuda_runtime_api.h")):
            return inc
    return None


def bridge_key(facts: dict) -> str:
    digest = hashlib.sha256()
    src = source_dir()
    for name in BRIDGE_SOURCES:
        digest.update((src / name).read_bytes())
    cuda = "cu" + facts["cuda"].replace(".", "") if facts["cuda"] else "cpu"
    machine = sysconfig.get_platform().replace("-", "_")
    return f"torch{facts['version'].replace('+', '_')}-abi{facts['abi']}-{cuda}-{machine}-{digest.hexdigest()[:12]}"


def library_name(facts: dict) -> str:
    return f"memlab_bridge-{bridge_key(facts)}.so"


def cache_dir() -> Path:
    explicit = os.environ.get("MEMLAB_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-memlab"


def compile_command(facts: dict, output: str) -> list[str]:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise BridgeBuildError("no C++ compiler found (set CXX, or install g++)")
    src = source_dir()
    inc = os.path.join(facts["root"], "include")
    lib = os.path.join(facts["root"], "lib")
    cmd = [
        cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
        "-Wall", "-Wextra", "-Wno-unused-parameter",
        f"-D_GLIBCXX_USE_CXX11_ABI={facts['abi']}",
        "-I", str(src), "-I", inc,
    ]
    libs = ["-lc10", "-ltorch_cpu"]  # torch_cpu: the profiler state base class
    cuda_inc = cuda_include_dir(facts)
    if cuda_inc and os.path.isfile(os.path.join(inc, "c10", "cuda", "CUDACachingAllocator.h")):
        cmd += ["-DMEMLAB_WITH_CUDA", "-I", cuda_inc]
        libs.append("-lc10_cuda")
    cmd += [str(src / "bridge.cpp"), "-o", output, "-L", lib, f"-Wl,-rpath,{lib}"] + libs
    return cmd


def build(torch, out_dir: str | os.PathLike) -> Path:
    """Builds the bridge for this torch into out_dir (atomically: parallel
    workers may race) and returns its path; reuses a build already there."""
    facts = torch_facts(torch)
    out_dir = Path(out_dir)
    target = out_dir / library_name(facts)
    if target.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".building-", suffix=".so", dir=out_dir)
    os.close(fd)
    started = time.perf_counter()
    try:
        cmd = compile_command(facts, tmp)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:
            raise BridgeBuildError(f"cannot run the C++ compiler {cmd[0]!r}: {exc}") from None
        if proc.returncode != 0:
            # the whole command and output go to a file; the message stays one line
            log = out_dir / f"build-{bridge_key(facts)}.log"
            log.write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
            raise BridgeBuildError(f"the C++ compiler {cmd[0]!r} failed (exit {proc.returncode}); "
                                   f"its command and output: {log}")
        os.replace(tmp, target)
        BUILT.update(path=str(target), seconds=time.perf_counter() - started)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


if __name__ == "__main__":  # python -m pytest_memlab._bridge_build [OUT_DIR]
    import torch

    print(build(torch, sys.argv[1] if len(sys.argv) > 1 else cache_dir()))
