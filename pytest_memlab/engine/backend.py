"""Chooses how torch feeds the engine: the backend.

Why a choice: the engine hears allocations only through the torch bridge
(:mod:`.bridge`), which must be compiled against the torch the process
imports (its c10 headers and C++ ABI).  When it cannot be built or loaded
(no compiler, an unusual torch), CUDA budgets still work from torch.cuda's
own counters, without the engine: that is the ``counters`` backend, chosen
with one warning that says why.  ``MEMLAB_CORE=bridge`` makes that an error
(this project's CI sets it); ``MEMLAB_CORE=counters`` chooses it on purpose.
``MEMLAB_BRIDGE=PATH`` loads a bridge library built elsewhere.

Nothing here imports torch at module import: a suite that never measures
never pays for it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from ..devices import BRIDGE, COUNTERS, UNAVAILABLE
from .bridge import Bridge, MemlabCoreError
from .bridge_build import BUILT, BridgeBuildError, build, cache_dir, library_name, torch_facts
from .tracing import tracing

__all__ = ["BRIDGE", "COUNTERS", "UNAVAILABLE", "Core", "MemlabCoreError", "MemlabWarning", "core", "restore", "session_started", "unpark"]


class MemlabWarning(UserWarning):
    """pytest-memlab measures less than it was asked to; the text says why."""


class Core:
    """The chosen backend: ``bridge``, ``counters`` or ``unavailable``."""

    def __init__(self, name: str, reason: str = "", bridge: Bridge | None = None, torch=None):
        self.name = name
        self.reason = reason
        self.bridge = bridge
        self.torch = torch
        self.cuda_available: bool | None = None   # devices.cuda_available's answer, once asked
        self.built: dict | None = None   # {path, seconds} where choosing it compiled the bridge (said once)

    def __repr__(self) -> str:
        return f"Core({self.name!r}, {self.reason!r})"


def _find_or_build_bridge(torch) -> Path:
    explicit = os.environ.get("MEMLAB_BRIDGE")
    if explicit:  # a bridge built elsewhere for this torch
        if not os.path.isfile(explicit):
            raise BridgeBuildError(f"MEMLAB_BRIDGE={explicit!r} is not a file")
        return Path(explicit)
    facts = torch_facts(torch)
    prebuilt = Path(__file__).resolve().parent.parent / "_bridge" / library_name(facts)
    # MEMLAB_PREBUILT=0: built on first use even where the install built one
    # (as a wheel built without torch does; the tests take that path)
    if prebuilt.is_file() and os.environ.get("MEMLAB_PREBUILT", "1") != "0":
        return prebuilt
    BUILT.clear()
    return build(torch, cache_dir() / "bridge")


_core: Core | None = None


def unpark() -> None:
    """Takes back what measured tests left parked for the next one (the
    tracer's events, torch's wrapped profiler hooks): before a test that
    memlab does not measure, and at the end of the session."""
    tracing.unpark()
    if _core is not None and _core.bridge is not None:
        _core.bridge.unpark()


_sessions = 0   # pytest sessions configured with memlab, nested (pytester's in-process runs)


def session_started() -> None:
    global _sessions
    _sessions += 1


def restore() -> None:
    """Gives torch back what memlab set in it (its default CPU allocator)
    at the outermost session's end: an in-process session that a measured
    test runs (pytester) ends while the outer one still measures."""
    global _sessions
    _sessions = max(0, _sessions - 1)
    if _sessions == 0 and _core is not None and _core.bridge is not None:
        _core.bridge.restore_cpu_allocator()


def core() -> Core:
    """Chooses the backend on first use (importing torch then) and keeps it."""
    global _core
    if _core is None:
        _core = _choose()
    return _core


def _choose() -> Core:
    mode = os.environ.get("MEMLAB_CORE", "auto").strip().lower() or "auto"
    if mode not in ("auto", BRIDGE, COUNTERS):
        raise MemlabCoreError(f"MEMLAB_CORE={mode!r} is not one of auto, bridge, counters")
    try:
        import torch
    except Exception as exc:  # torch missing or broken: nothing to measure
        reason = f"torch is not importable ({type(exc).__name__}: {exc})"
        if mode == BRIDGE:
            raise MemlabCoreError(f"MEMLAB_CORE=bridge, but {reason}") from exc
        return Core(UNAVAILABLE, reason)
    if mode == COUNTERS:
        return Core(COUNTERS, "chosen by MEMLAB_CORE=counters", torch=torch)
    try:
        bridge = Bridge(_find_or_build_bridge(torch))
        bridge.install()  # proves that it loads and links; undone at once
        bridge.uninstall()
    except (BridgeBuildError, OSError, MemlabCoreError) as exc:
        reason = f"the torch bridge is unavailable: {exc}"
        if mode == BRIDGE:
            raise MemlabCoreError(f"MEMLAB_CORE=bridge, but {reason}") from exc
        if _sessions == 0:   # a pytest session's summary says it, with what to do
            warnings.warn(
                MemlabWarning(
                    f"pytest-memlab: {reason}. CUDA budgets fall back to torch.cuda counters "
                    "(own peak estimated as growth over the starting total, no CPU measurement)."
                ),
                stacklevel=2,
            )
        return Core(COUNTERS, reason, torch=torch)
    bridge.attach_tracker_when_cuda_starts(torch)
    bridge.install_cpu_allocator()
    reason = f"torch bridge {bridge.path.name}"
    if bridge.cpu_allocator is not True:
        # Said once, where the run's summary names the backend (a warning
        # here would be raised out of the first measured test's setup
        # where warnings are errors).
        reason += (f"; the CPU heard through torch's memory reporter, on the threads a measurement runs on "
                   f"only (a thread pool's tensors go unheard, one freed on another thread looks kept): "
                   f"{bridge.cpu_allocator}")
    chosen = Core(BRIDGE, reason, bridge=bridge, torch=torch)
    if BUILT.get("path") == str(bridge.path):   # compiled now, for this choice
        chosen.built = dict(BUILT)
    return chosen

