"""Devices as memlab names them, in one place: ``"cpu"`` and ``"cuda:N"``
(concrete), and ``"cuda"`` (the current CUDA device when a test starts).
Markers, the laboratory API and the meters all parse and resolve through
here; the engine numbers them in slots (:mod:`.engine.slots`).

Resolving never initialises CUDA: a test that never touches the GPU leaves
it untouched under measurement too (CUDA that is not initialised holds no
memory, so its totals are 0 by definition).
"""

from __future__ import annotations

import os

CPU = "cpu"

# The backends' names (engine/backend.py chooses one): the torch bridge
# feeds the engine; torch.cuda's counters measure CUDA without it.
BRIDGE = "bridge"
COUNTERS = "counters"
UNAVAILABLE = "unavailable"


class DeviceError(ValueError):
    """A device that memlab cannot name; the message says what was given."""


def parse_device(value: object, *, allow_cpu: bool = True, default_cuda: str = "cuda") -> str:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` from a string, an int (a CUDA
    index) or a torch.device; raises DeviceError naming the value."""
    if isinstance(value, bool):
        raise DeviceError(f"{value!r} is not a device")
    if isinstance(value, int):
        if value < 0:
            raise DeviceError(f"{value!r} is negative")
        return f"cuda:{value}"
    if type(value).__name__ == "device" and hasattr(value, "type"):  # torch.device
        if value.type == "cuda":
            return default_cuda if value.index is None else f"cuda:{value.index}"
        if value.type == "cpu" and allow_cpu:
            return CPU
        raise DeviceError(f"{value!r} is not a {'CPU or ' if allow_cpu else ''}CUDA device")
    if isinstance(value, str):
        text = value.strip()
        if text == "cuda":
            return default_cuda
        if text.startswith("cuda:") and text[5:].isdigit():
            return f"cuda:{int(text[5:])}"
        if text == CPU and allow_cpu:
            return CPU
    expected = "'cpu', " if allow_cpu else ""
    raise DeviceError(f"{value!r} is not a device (expected {expected}'cuda', 'cuda:N', an int or a torch.device)")


def cuda_index(device: str) -> int:
    return int(device.split(":")[1])


def machine_gpu(device: str) -> str:
    """The GPU behind ``cuda:N`` as the machine numbers it, where this
    process sees a narrowed set (``CUDA_VISIBLE_DEVICES``, as
    --memlab-gpus-per-worker sets it: a worker's ``cuda:0`` may be the
    machine's GPU 1): the variable's N-th entry; "" where nothing narrows
    it, or for the CPU."""
    if not device.startswith("cuda:"):   # (before the environment: a miss there raises and catches a KeyError)
        return ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return ""
    entries = [e.strip() for e in visible.split(",")]
    index = cuda_index(device)
    return entries[index] if index < len(entries) else ""


def cuda_available(core) -> bool:
    """Asked of torch once per process: the CUDA devices a process sees are
    fixed when it first looks."""
    known = getattr(core, "cuda_available", None)
    if known is None:
        known = core.cuda_available = core.torch is not None and core.torch.cuda.is_available()
    return known


def other_gpus(core, requested: list[str]) -> list[str]:
    """The CUDA devices this process sees besides those of requested
    (``"cuda"``: the current one), where requested has a CUDA device and
    the process sees more than one: a test that asked for one GPU may use
    another too.  Counted once per process, without initialising CUDA."""
    # (a list, not a generator: 3.12 runs it inline, with no frame, in every measured test)
    if not any([d.startswith("cuda") for d in requested]) or not cuda_available(core):
        return []
    gpus = getattr(core, "cuda_devices", None)
    if gpus is None:
        gpus = core.cuda_devices = [f"cuda:{i}" for i in range(core.torch.cuda.device_count())]
    if len(gpus) < 2:
        return []
    current = f"cuda:{current_cuda(core.torch.cuda)}"
    asked = {current if d == "cuda" else d for d in requested}
    return [g for g in gpus if g not in asked]


def default_device(core) -> str:
    """What an unmarked test or a profiler without a target measures: CUDA
    where there is CUDA, else the CPU."""
    return "cuda" if cuda_available(core) else CPU


def current_cuda(cuda) -> int:
    """The current CUDA device, without initialising CUDA (before its
    initialisation the current device is 0)."""
    return cuda.current_device() if cuda.is_initialized() else 0


def resolve(core, device: str) -> tuple[str, str]:
    """A concrete device for ``device``, or why it cannot be measured:
    returns (device, reason); reason is empty when measurable."""
    if core.name not in (BRIDGE, COUNTERS):
        return device, core.reason
    if device == CPU:
        if core.name != BRIDGE:
            return device, "CPU memory is measured only through the torch bridge, which is unavailable here"
        return device, ""
    cuda = core.torch.cuda
    if not cuda_available(core):
        return device, "CUDA is not available"
    if device == "cuda":
        return f"cuda:{current_cuda(cuda)}", ""
    if cuda_index(device) >= cuda.device_count():
        return device, f"{device} does not exist ({cuda.device_count()} CUDA devices)"
    return device, ""
