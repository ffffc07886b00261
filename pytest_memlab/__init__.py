"""pytest-memlab: memory as a tested property of PyTorch code.

The pytest plugin lives in :mod:`pytest_memlab.plugin` and is loaded through
the ``pytest11`` entry point ``memlab``.

The public names below are imported on first use: a process that imports
only a part of the package (a measured test's child process, whose start-up
hook must cost little) does not pay for the rest.
"""

import os
import sys
from importlib import import_module

__version__ = "0.1.0"


def _outside_assertion_rewriting() -> None:
    """pytest rewrites the asserts of every module of a plugin it loads
    through an entry point: each module is parsed to a Python AST, rewritten
    and compiled, and where bytecode is not written (PYTHONDONTWRITEBYTECODE,
    common in CI images) that happens in every session and every xdist
    worker: 0.5-1 s for this package's modules, most of them imported during
    the first test.  memlab has no asserts for pytest to explain; its modules
    are told to the rewriting hook as not to be rewritten, before any is
    imported.  The hook's cache is pytest's own (private): where it is
    missing, pytest rewrites as before."""
    for finder in sys.meta_path:
        cache = getattr(finder, "_marked_for_rewrite_cache", None)
        if type(finder).__name__ != "AssertionRewritingHook" or not isinstance(cache, dict):
            continue
        root = os.path.dirname(os.path.abspath(__file__))
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            rel = os.path.relpath(folder, root)
            package = __name__ if rel == os.curdir else ".".join([__name__, *rel.split(os.sep)])
            for file in files:
                if file.endswith(".py"):
                    name = file[:-3]
                    cache.setdefault(package if name == "__init__" else f"{package}.{name}", False)


_outside_assertion_rewriting()

_PUBLIC = {  # name -> the module that defines it
    "Courtesy": ".lab.courtesy",
    "DeviceFigures": ".engine.meters",
    "LineProfiler": ".lab.line_profiler",
    "MemReporter": ".lab.tensor_report",
    "MemlabLeakWarning": ".judging.verdicts",
    "Measurement": ".measuring.measurement",
    "MemoryBudgetExceeded": ".measuring.measurement",
    "SizeError": ".sizes",
    "StorageReport": ".lab.tensor_report",
    "clear_global_line_profiler": ".lab.line_profiler",
    "format_size": ".sizes",
    "parse_size": ".sizes",
    "profile": ".lab.line_profiler",
    "profile_every": ".lab.line_profiler",
    "set_target_gpu": ".lab.line_profiler",
}

__all__ = sorted([*_PUBLIC, "load_ipython_extension"])


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_memlab' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython):
    """``%load_ext pytest_memlab``: the ``%mlrun`` / ``%%mlrun`` magics."""
    from .lab.ipython_magics import load_ipython_extension as load

    load(ipython)
