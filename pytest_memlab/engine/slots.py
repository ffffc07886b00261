"""The engine's device numbering (csrc/engine.h, exported by the module):
slot SLOT_CPU is the CPU, SLOT_CPU + 1 + N is cuda:N."""

from __future__ import annotations

from .. import _engine
from ..devices import CPU, cuda_index

SLOT_CPU = _engine.SLOT_CPU
MAX_DEVICES = _engine.MAX_DEVICES


def slot_of(device: str) -> int:
    """The slot of a concrete device ("cpu", "cuda:N")."""
    return SLOT_CPU if device == CPU else SLOT_CPU + 1 + cuda_index(device)
