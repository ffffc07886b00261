"""Builds the C engine (CPython headers only) and, when torch is importable
in the build environment, the torch bridge for that torch.

Install with ``pip install --no-build-isolation .`` in an environment that
has torch to get the bridge prebuilt; otherwise it is compiled on first use.
"""

import importlib.util
import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE_SOURCES = [
    "csrc/module.c", "csrc/module_engine.c", "csrc/module_reporter.c", "csrc/heap_walk.c", "csrc/environ_buffer.c", "csrc/referrer_index.c", "csrc/reporter.c", "csrc/engine.c", "csrc/ledger.c", "csrc/kept.c", "csrc/scope.c", "csrc/sites.c",
    "csrc/shadow_stack.c", "csrc/timeline.c", "csrc/phases.c", "csrc/alloc_log.c", "csrc/tracer.c", "csrc/phase_labels.c", "csrc/tracer_sysmon.c", "csrc/tracer_settrace.c",
]
BRIDGE_FILES = ["csrc/bridge.cpp", "csrc/memlab_bridge.h"]


def load_bridge_builder():
    path = os.path.join(HERE, "pytest_memlab", "engine", "bridge_build.py")
    spec = importlib.util.spec_from_file_location("_memlab_bridge_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPy(build_py):
    """Ships the bridge sources inside the package, for builds on first use."""

    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "pytest_memlab", "csrc")
        os.makedirs(dest, exist_ok=True)
        for name in BRIDGE_FILES:
            shutil.copy2(os.path.join(HERE, name), dest)


class BuildExt(build_ext):
    """Builds the engine, then tries the bridge (never failing the install:
    a missing or unusable torch only defers the bridge to first use)."""

    def run(self):
        super().run()
        try:
            import torch  # noqa: F401  (only with --no-build-isolation)
        except Exception as exc:  # torch absent or broken: build on first use
            print(f"pytest-memlab: torch not importable here ({exc!r}); "
                  "the bridge will be built on first use", file=sys.stderr)
            return
        builder = load_bridge_builder()
        out = os.path.join(HERE if self.inplace else self.build_lib, "pytest_memlab", "_bridge")
        try:
            path = builder.build(torch, out)
            print(f"pytest-memlab: built the torch bridge {path}", file=sys.stderr)
        except Exception as exc:
            print(f"pytest-memlab: could not prebuild the torch bridge ({exc}); "
                  "it will be built on first use", file=sys.stderr)


engine = Extension(
    "pytest_memlab._engine",
    sources=ENGINE_SOURCES,
    include_dirs=["csrc"],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"],
)

setup(ext_modules=[engine], cmdclass={"build_ext": BuildExt, "build_py": BuildPy})
