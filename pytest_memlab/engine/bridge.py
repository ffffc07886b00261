"""The torch bridge as loaded: the small C++ library, compiled against the
torch the process imports, that pushes memlab's reporter into torch's
thread-local profiler slot (and attaches the CUDA trace tracker); and
torch's profiler start and stop hooks, through which memlab steps aside when
torch.profiler starts inside a measured test.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path

from .. import _engine

# Called with torch as CUDA initialises (its device allocators exist; its
# flag is not set yet), after the tracker attaches: what a layer above needs
# then registers itself here (measuring/out_of_memory.py: torch's
# out-of-memory observer).  A hook must not raise; one that does is passed.
CUDA_STARTED: list = []


def on_cuda_start(hook) -> None:
    """Registers hook(torch), called as CUDA initialises."""
    if hook not in CUDA_STARTED:
        CUDA_STARTED.append(hook)


class MemlabCoreError(RuntimeError):
    """The measurement backend that was required is not available."""


class Bridge:
    """The loaded bridge library, installed on the threads that measure."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        lib.memlab_bridge_abi.restype = ctypes.c_int
        abi = lib.memlab_bridge_abi()
        if abi != _engine.BRIDGE_ABI:
            # another version's bridge (MEMLAB_BRIDGE) would send events this engine reads otherwise
            raise MemlabCoreError(f"the torch bridge {path} speaks interface {abi}, this engine "
                                  f"{_engine.BRIDGE_ABI}: rebuild it with this pytest-memlab")
        lib.memlab_bridge_installed.restype = ctypes.c_int
        for name in ("memlab_bridge_install",):
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
            getattr(lib, name).restype = ctypes.c_int
        for name in ("memlab_bridge_uninstall", "memlab_bridge_attach_cuda_tracker"):
            getattr(lib, name).argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            getattr(lib, name).restype = ctypes.c_int
        for name in ("memlab_bridge_set_cpu", "memlab_bridge_set_tracker"):
            getattr(lib, name).argtypes = [ctypes.c_int]
            getattr(lib, name).restype = None
        self.lib = lib
        self.path = path
        address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
        # A bridge from MEMLAB_BRIDGE may be older and lack the totals.
        totals = getattr(lib, "memlab_bridge_cuda_totals", None)
        _engine.bridge_bind(address(lib.memlab_bridge_install), address(lib.memlab_bridge_uninstall),
                            address(lib.memlab_bridge_set_cpu), address(lib.memlab_bridge_set_tracker),
                            address(totals) if totals is not None else 0)
        self.tracker = None  # None: not tried; True: attached; str: why not
        self.cpu_allocator = None  # None: not tried; True: installed; str: why not (the reporter hears the CPU)
        install_cpu = getattr(lib, "memlab_bridge_install_cpu_allocator", None)
        if install_cpu is not None:
            install_cpu.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            install_cpu.restype = ctypes.c_int
            lib.memlab_bridge_restore_cpu_allocator.restype = ctypes.c_int
        self._hooks_lock = threading.Lock()
        self._hook_users = 0
        self._saved_hooks = None
        self._hooks_parked = False

    # The install depth of each thread and the count of scopes open on each
    # device live in the engine module, which pushes and pops the reporter
    # itself: a ctypes call would drop and retake the GIL, and the counting
    # is part of the one call that opens a measured scope (engine.open).
    def install(self) -> None:
        """Pushes the reporter into torch's profiler slot on the calling
        thread, unless it is there already; each install is undone by one
        uninstall, and the last one pops it, so that the slot is torch's
        again between measurements."""
        self._installing(_engine.bridge_install)

    def uninstall(self, park: bool = False) -> None:
        """Undoes one install."""
        self._uninstalling(park, _engine.bridge_uninstall)

    def open_scope(self, slot: int, detached: bool, total: int, reserved: int, timeline: bool,
                   log_max: int) -> int:
        """install() and an engine scope on slot, the device's reporting on,
        its timeline and allocation log: one call (engine.open), undone
        whole if any part fails.  Returns the scope id."""
        return self._installing(_engine.open, slot, detached, total, reserved, timeline, log_max)

    def close_scope(self, slot: int, scope: int, park: bool = False) -> dict:
        """Undoes open_scope (also when the scope is not the innermost: the
        engine's ValueError then); returns the closed scope's figures."""
        return self._uninstalling(park, _engine.close, slot, scope)

    def close_plain(self, slot: int, scope: int, failed: int, park: bool = False) -> tuple | None:
        """close_scope where the scope left nothing behind (engine.close_plain):
        (peak, peak_total, reserved_peak, kept head), else None, the scope
        still open."""
        return self._uninstalling(park, _engine.close_plain, slot, scope, failed)

    # Each engine entry that installs returns whether it was the thread's
    # first install (alone, or after its result); each that uninstalls,
    # whether it was the last: torch's profiler hooks follow those.
    def _installing(self, entry, *args):
        try:
            answer = entry(*args)
        except _engine.BridgeError as exc:
            raise MemlabCoreError(f"installing the torch bridge failed: {exc}") from None
        result, first = answer if isinstance(answer, tuple) else (None, answer)
        if first:
            self.entered()
        return result

    def _uninstalling(self, park: bool, entry, *args):
        try:
            answer = entry(*args)
        except BaseException as exc:
            if _engine.bridge_depth() == 0:   # the last install was undone all the same
                self.left(park)
            if isinstance(exc, _engine.BridgeError):
                raise MemlabCoreError(f"removing the torch bridge failed: {exc}") from None
            raise
        result, last = answer if isinstance(answer, tuple) else (None, answer)
        if last:
            self.left(park)
        return result

    def entered(self) -> None:
        """A thread's first install: torch's profiler hooks are wrapped
        (or the parked wrapping taken over)."""
        if self._hooks_parked:
            self._hooks_parked = False  # the parked hold becomes this one
        else:
            self._profiler_hooks(+1)

    def left(self, park: bool = False) -> None:
        """A thread's last uninstall.  With park, torch's profiler hooks
        stay wrapped (they only pass through while nothing measures) for the
        next measured test, until :meth:`unpark`."""
        if park and not self._hooks_parked:
            self._hooks_parked = True
        else:
            self._profiler_hooks(-1)

    def unpark(self) -> None:
        """Gives torch its own profiler hooks back after a parked uninstall."""
        if self._hooks_parked:
            self._hooks_parked = False
            self._profiler_hooks(-1)

    # torch.profiler refuses to start on a thread whose profiler slot holds
    # anything, the reporter included.  While memlab measures, torch's own
    # start and stop hooks (autograd.profiler._run_on_profiler_start/_stop,
    # which profile, emit_nvtx and emit_itt call) step the reporter aside
    # and bring it back; on CUDA the trace tracker still hears the
    # allocations meanwhile.  The hooks are torch's again when no thread
    # measures.
    def _profiler_hooks(self, delta: int) -> None:
        with self._hooks_lock:
            self._hook_users += delta
            if delta > 0 and self._hook_users == 1:
                self._saved_hooks = _wrap_profiler_hooks(self)
            elif delta < 0 and self._hook_users == 0 and self._saved_hooks is not None:
                _restore_profiler_hooks(self._saved_hooks)
                self._saved_hooks = None

    def _profiler_starts(self) -> None:
        if _engine.bridge_depth() > 0 and self.installed():
            _engine.bridge_step_aside(True)

    def _profiler_stopped(self) -> None:
        _engine.bridge_step_aside(False)

    def installed(self) -> bool:
        """Whether the reporter is the innermost profiler state of this thread."""
        return bool(self.lib.memlab_bridge_installed())

    def attach_tracker(self) -> None:
        """Attaches the CUDA trace tracker, once CUDA is initialised
        (attached before, it would hear nothing)."""
        if os.environ.get("MEMLAB_CUDA_TRACKER", "1") == "0":
            self.tracker = "turned off by MEMLAB_CUDA_TRACKER=0"
        else:
            err = ctypes.create_string_buffer(512)
            rc = self.lib.memlab_bridge_attach_cuda_tracker(err, len(err))
            self.tracker = True if rc == 0 else err.value.decode(errors="replace")

    def install_cpu_allocator(self) -> None:
        """Makes memlab's CPU allocator torch's (once, before the first CPU
        measurement): torch's default allocator, which also tells the engine
        of every thread's allocations and frees.  Where it cannot be (a
        bridge without it, another allocator already set, MEMLAB_CPU_ALLOCATOR=0),
        the reporter hears the CPU on the threads it is installed on
        (:attr:`cpu_allocator` says why; the backend's reason, in the run's
        summary, repeats it)."""
        if os.environ.get("MEMLAB_CPU_ALLOCATOR", "1") == "0":
            self.cpu_allocator = "turned off by MEMLAB_CPU_ALLOCATOR=0"
            return
        install = getattr(self.lib, "memlab_bridge_install_cpu_allocator", None)
        if install is None:
            self.cpu_allocator = "this bridge has no CPU allocator of its own (an older build)"
        else:
            err = ctypes.create_string_buffer(512)
            rc = install(err, len(err))
            self.cpu_allocator = True if rc == 0 else err.value.decode(errors="replace") or f"error {rc}"

    def restore_cpu_allocator(self) -> None:
        """Gives torch its default CPU allocator back (at the session's end)."""
        if self.cpu_allocator is True:
            rc = self.lib.memlab_bridge_restore_cpu_allocator()
            # 1: another allocator was set over memlab's since (the mobile
            # one): torch's business; the reporter hears the CPU meanwhile
            self.cpu_allocator = None if rc == 0 else "another CPU allocator was set over memlab's"

    def attach_tracker_when_cuda_starts(self, torch) -> None:
        """Attaches the tracker as CUDA initialises, on whichever thread
        does it (a pool thread's first allocation included), before that
        thread's first allocation: torch runs the calls queued with
        ``torch.cuda._lazy_call`` right after it creates the device
        allocators (and at once where CUDA is initialised already).
        Attached later, at the next measured scope, the first test to use
        CUDA would be heard only through the reporter of its own thread,
        with block sizes where the others count requests: its figures
        would depend on being first."""
        lazy_call = getattr(getattr(torch, "cuda", None), "_lazy_call", None)
        if lazy_call is None or not getattr(torch.version, "cuda", None):
            return

        def attach() -> None:
            # runs inside torch's CUDA initialisation: must never raise
            # (an exception there reaches the user as DeferredCudaCallError)
            try:
                if self.tracker is None:
                    self.attach_tracker()
            except Exception as exc:  # pragma: no cover - the C side returns errors, not raises
                self.tracker = f"{type(exc).__name__}: {exc}"
            for hook in CUDA_STARTED:   # the out-of-memory observer needs the device allocators, made just now
                try:
                    hook(torch)
                except Exception:
                    pass

        try:
            lazy_call(attach)
        except Exception:  # a torch without the queue: the next measured scope attaches it
            pass

    def cuda_totals(self, cuda, index: int) -> tuple[int, int]:
        """The allocated and reserved bytes of CUDA device index, as
        torch.cuda.memory_allocated and memory_reserved give them, read in
        C: those build and flatten the allocator's whole statistics
        dictionary, twice, for every measured test."""
        totals = _engine.bridge_cuda_totals(index)
        if totals is None:
            return cuda.memory_allocated(index), cuda.memory_reserved(index)
        return totals


def _wrap_profiler_hooks(bridge: Bridge):
    """Wraps torch's profiler start and stop hooks; returns what to restore
    (None where this torch has no such hooks)."""
    module = sys.modules.get("torch.autograd.profiler")
    start = getattr(module, "_run_on_profiler_start", None)
    stop = getattr(module, "_run_on_profiler_stop", None)
    if start is None or stop is None:
        return None

    def _run_on_profiler_start():
        bridge._profiler_starts()
        return start()

    def _run_on_profiler_stop():
        try:
            return stop()
        finally:
            bridge._profiler_stopped()

    module._run_on_profiler_start = _run_on_profiler_start
    module._run_on_profiler_stop = _run_on_profiler_stop
    return module, start, stop, _run_on_profiler_start, _run_on_profiler_stop


def _restore_profiler_hooks(saved) -> None:
    module, start, stop, ours_start, ours_stop = saved
    # Only what is still ours: another tool may have wrapped ours since.
    if module._run_on_profiler_start is ours_start:
        module._run_on_profiler_start = start
    if module._run_on_profiler_stop is ours_stop:
        module._run_on_profiler_stop = stop

