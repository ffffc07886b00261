"""pytest-memlab: memory as a tested property of PyTorch code.

The pytest plugin lives in :mod:`pytest_memlab.plugin` and is loaded through
the ``pytest11`` entry point ``memlab``.

The public names below are imported on first use: a process that imports
only a part of the package (a measured test's child process, whose start-up
hook must cost little) does not pay for the rest.
"""

from importlib import import_module

__version__ = "0.1.0"

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
