"""pytest-memlab: memory as a tested property of PyTorch code.

The pytest plugin lives in :mod:`pytest_memlab.plugin` and is loaded through
the ``pytest11`` entry point ``memlab``.
"""

from .engine.meters import DeviceFigures
from .judging.verdicts import MemlabLeakWarning
from .lab.courtesy import Courtesy
from .lab.line_profiler import LineProfiler, clear_global_line_profiler, profile, profile_every, set_target_gpu
from .lab.tensor_report import MemReporter, StorageReport
from .measuring.measurement import Measurement, MemoryBudgetExceeded
from .sizes import SizeError, format_size, parse_size

__all__ = [
    "Courtesy", "DeviceFigures", "LineProfiler", "MemReporter", "MemlabLeakWarning", "Measurement", "StorageReport", "MemoryBudgetExceeded", "SizeError",
    "clear_global_line_profiler", "format_size", "load_ipython_extension", "parse_size",
    "profile", "profile_every", "set_target_gpu",
]


def load_ipython_extension(ipython):
    """``%load_ext pytest_memlab``: the ``%mlrun`` / ``%%mlrun`` magics."""
    from .lab.ipython_magics import load_ipython_extension as load

    load(ipython)
__version__ = "0.1.0"
