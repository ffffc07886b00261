"""pytest-memlab: memory as a tested property of PyTorch code.

The pytest plugin lives in :mod:`pytest_memlab.plugin` and is loaded through
the ``pytest11`` entry point ``memlab``.
"""

from .measure import DeviceFigures, Measurement, MemoryBudgetExceeded
from .sizes import SizeError, format_size, parse_size

__all__ = ["DeviceFigures", "Measurement", "MemoryBudgetExceeded", "SizeError", "format_size", "parse_size"]
__version__ = "0.1.0"
