"""The child's side: a Python process started by a measured test (spawned,
forked, a subprocess running Python, a DataLoader's worker) measures
itself and leaves its figures in the test's folder.

Armed by the environment variable :data:`ENV` (a JSON object the parent
writes: the folder, the devices, the rootdir for line attribution, the
plugin's version).  A process that has not imported torch allocates no
tensors: the measurement starts when torch's import finishes (or at once,
when torch is already imported: a fork), so a child that never imports
torch costs only this module's import.  The figures are written when the
process ends: at interpreter exit (atexit), or, in a fork, when it calls
``os._exit`` (multiprocessing's fork and forkserver children end so).  A
file saying "running" is written when the measurement starts, so a child
that crashes or is killed is known to the parent as missing.
"""

from __future__ import annotations

import json
import os
import sys

from ..figures import phase_bytes

ENV = "MEMLAB_CHILD"
FORMAT = 1   # the figures file's format

_child = None         # this process's ChildMeasurement, once started
_forks_measured = False


def process_startup() -> None:
    """The start-up hook's entry point: arms this process when the
    variable is set.  Never raises: a child that cannot be measured runs
    as it would have, and says so on stderr."""
    try:
        text = os.environ.get(ENV)
        if text:
            _arm(json.loads(text))
    except Exception as exc:
        _say(f"this child process is not measured: {type(exc).__name__}: {exc}")


def _say(text: str) -> None:
    try:
        sys.stderr.write(f"pytest-memlab (pid {os.getpid()}): {text}\n")
    except Exception:
        pass


def measure_forks() -> None:
    """Forks of this process measure themselves while the variable is set
    (once per process: a handler cannot be taken back)."""
    global _forks_measured
    if not _forks_measured:
        os.register_at_fork(after_in_child=after_fork_in_child)
        _forks_measured = True


def _arm(config: dict) -> None:
    measure_forks()
    if "torch" in sys.modules:
        _start(config)
    else:
        sys.meta_path.insert(0, _TorchImportHook(config))


def after_fork_in_child() -> None:
    """A fork of a process whose measured test is running (the pytest
    process, registered by the plugin) or of a measured child: the fork
    measures itself from here.  What the parent was measuring is the
    parent's: this process's figures start at zero."""
    global _child
    try:
        text = os.environ.get(ENV)
        if not text:
            return
        _child = None   # a measured child's fork: its own figures, in a file of its own
        if "torch" in sys.modules:
            _start(json.loads(text), forked=True)
    except Exception as exc:
        _say(f"this forked process is not measured: {type(exc).__name__}: {exc}")


class _TorchImportHook:
    """Starts the measurement when torch's import finishes (a meta path
    finder that steps aside after torch is found)."""

    def __init__(self, config: dict):
        self.config = config

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        config = self.config

        def exec_module_then_measure(module):
            exec_module(module)
            try:
                _start(config)
            except Exception as exc:
                _say(f"this child process is not measured: {type(exc).__name__}: {exc}")

        spec.loader.exec_module = exec_module_then_measure
        return spec

    def invalidate_caches(self) -> None:
        pass


def _start(config: dict, forked: bool = False) -> None:
    global _child
    if _child is not None:
        return
    folder = current_folder(config["dir"])
    if not folder:
        return   # a forkserver's child while no test is measured
    _child = ChildMeasurement(dict(config, dir=folder), forked)
    try:
        _child.begin()
    except Exception as exc:
        # The parent hears why this child has no figures (and the child
        # runs on, unmeasured).
        _child.error = f"{type(exc).__name__}: {exc}"
        try:
            os.makedirs(folder, exist_ok=True)
            _child._write("unmeasured", {})
        except OSError:
            pass
        raise


CURRENT = "current"   # in the session's folder: the measured test's folder, while a forkserver lives


def current_folder(folder: str) -> str:
    """The folder of the test running now.  A forkserver lives across
    tests, and its children inherit its environment, from the test that
    started it: the parent keeps the current test's folder in a file
    beside the tests' folders while a forkserver lives ("" between
    measured tests)."""
    try:
        with open(os.path.join(os.path.dirname(folder), CURRENT)) as f:
            return f.read()
    except OSError:
        return folder


class ChildMeasurement:
    """This process's measurement, from start to exit."""

    def __init__(self, config: dict, forked: bool):
        self.config = config
        self.forked = forked
        self.pid = os.getpid()
        self.path = os.path.join(config["dir"], f"{self.pid}.json")
        self.measurement = None
        self.error = ""
        self.done = False
        self.out_of_memory: list = []   # out_of_memory.Moment of each request it could not get (CUDA)
        self.cpu_failed = 0             # the CPU's failed requests when it began
        self.walk = None                # memory_kinds.KindWalk: the phase hook, where phases may run

    def begin(self) -> None:
        from ..engine.backend import core
        from ..engine.tracing import tracing
        from ..measuring.measurement import Measurement

        if not self.forked:   # a fork keeps its parent's path rule
            tracing.scope.configure(self.config.get("rootdir"), self.config.get("include") or ())
        # timeline: the engine follows the scope, so each phase's own peak
        # (a rank's forward, backward and step) is told at the end
        self.measurement = Measurement(core(), self._devices(), trace=True, timeline=True)
        from ..measuring.out_of_memory import Observer, cpu_failure_count

        Observer.run = self   # the whole process is the child's measurement
        os.makedirs(self.config["dir"], exist_ok=True)
        self._write("running", {})
        self.measurement.begin()
        self.cpu_failed = cpu_failure_count(self.measurement)
        # memory by kind at the process's peak (a rank's parameters,
        # activations, optimizer state...): the phase hook, as a test's
        followed = {d: m for d, m in self.measurement.meters.items() if getattr(m, "timeline", False)}
        if self.measurement.trace and followed:
            from ..measuring.memory_kinds import KindWalk

            self.walk = KindWalk(followed)
            tracing.phase_hook(self.walk)
        from ..engine.tracing import WINDOWED

        if WINDOWED and not self.forked:
            # The whole process is user code: one window, open to the end
            # (a fork runs inside its parent's window).  Its imports run
            # untraced: a rank imports its harness after torch, and a trace
            # function costs every frame of that on these Pythons.
            self.measurement.window().__enter__()
            import builtins

            from ..engine.tracing import untraced_imports

            builtins.__import__ = untraced_imports(builtins.__import__)
        import atexit

        atexit.register(self.finish)
        # Forks (multiprocessing's fork and forkserver children) end with
        # os._exit, which runs no atexit handler.
        _finish_before_exit(self)

    def _devices(self) -> list[str]:
        """The test's devices; for CUDA, every CUDA device this process
        sees (a rank picks its own GPU after start-up: its budget is judged
        where its own peak was highest)."""
        devices = [d for d in self.config["devices"] if not d.startswith("cuda")]
        if len(devices) < len(self.config["devices"]):
            import torch

            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            devices += [f"cuda:{i}" for i in range(count)] or ["cuda:0"]
        return devices

    def finish(self) -> None:
        """The figures, once, into the folder (atomically: the parent never
        reads half a file)."""
        if self.done or self.pid != os.getpid():
            return
        self.done = True
        devices, explained = {}, []
        top = int(self.config.get("top", 5))
        try:
            from ..engine.backend import core
            from ..measuring.out_of_memory import cpu_moment, explain

            moment = cpu_moment(self.measurement, self.cpu_failed)   # the CPU: heard by memlab's allocator
            if moment is not None:
                moment.when = "when the process ended"
                self.out_of_memory.append(moment)

            # before the measurement ends: the explanation names what was
            # live at the error, taken then
            explained = [explain(self, None, None, None, core(), top, moment=m, whose="this process").as_dict()
                         for m in self.out_of_memory]
        except Exception as exc:
            self.error = f"its out-of-memory was not explained: {type(exc).__name__}: {exc}"
        try:
            kept = self._kept()
            figures = self.measurement.end()
            for device, k in kept.items():
                if device in figures and figures[device].measured:
                    figures[device].phase_peaks = dict(k.phases)
            self._kinds(figures, kept)
            for device, f in figures.items():
                # The process's own peak on a GPU is its caching allocator's
                # highest total where nothing predates the measurement (it
                # began with the process): what torch.cuda.max_memory_allocated
                # reads in the rank.  The scope's own count can fall short of
                # it by blocks that only the trace tracker heard, on a thread
                # without the reporter, whose sizes it estimates (an FSDP2
                # rank: 2.0 MiB of 178 MiB).
                if (device.startswith("cuda") and f.measured and f.start_total == 0
                        and f.peak_total is not None and f.peak is not None and f.peak_total > f.peak):
                    f.peak = f.peak_total
            devices = devices_record(figures, top)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        self._write("done", devices, explained)

    def _kept(self) -> dict:
        """device -> meters.Kept of this process's scope, before it closes:
        each phase's own peak ({name: (bytes, site)}), and what the kinds
        are told against."""
        out = {}
        for device, meter in self.measurement.meters.items():
            kept = meter.kept() if getattr(meter, "timeline", False) else None
            if kept is not None:
                out[device] = kept
        return out

    def _kinds(self, figures: dict, kept: dict) -> None:
        """Each device's bytes by kind at the process's own peak, where a
        phase ran (as a test's: measuring/memory_kinds.py)."""
        walk, self.walk = self.walk, None
        if walk is None:
            return
        from ..engine.tracing import tracing
        from ..measuring.memory_kinds import defer, resolve

        tracing.phase_hook(None)
        if not walk.started:
            return
        phases = tracing.phases()
        for device, meter in self.measurement.meters.items():
            f = figures.get(device)
            if meter.slot in walk.started and f is not None and f.measured and device in kept:
                defer(f, walk, meter.slot, kept[device], *meter.take_alloc_log(), phases)
                resolve(f)

    def _write(self, state: str, devices: dict, out_of_memory: list = ()) -> None:
        inherited = self.config.get("parent_rank")
        write_record(self.path, state, devices, self.error, _label(inherited), _rank(inherited),
                     out_of_memory=list(out_of_memory))


def devices_record(figures: dict, top: int) -> dict:
    """A process's figures (device -> DeviceFigures) as its file keeps them."""
    devices = {}
    for device, f in figures.items():
        if not f.measured:
            devices[device] = {"measured": False, "reason": f.reason}
            continue
        if not f.allocs and not f.frees and device.startswith("cuda"):
            # a GPU this process never used (a rank sees every GPU and
            # works on one): not listed, so no rank reads 0 B on another's
            continue
        lines = sorted((ln for ln in f.lines if ln.allocated > 0), key=lambda ln: -ln.allocated)
        # what was live at its peak, by site: a failure over a budget
        # reads like the test's own
        at_peak = [{"bytes": e.bytes, "chain": [{**fr.as_dict(), "path": fr.path} for fr in e.chain]}
                   for e in (f.attribution.at_peak[:top] if f.attribution is not None and f.peak else ())]
        devices[device] = {
            "peak": f.peak, "peak_total": f.peak_total, "reserved_peak": f.reserved_peak,
            "live": f.live, "allocs": f.allocs, "frees": f.frees,
            "top": [{**ln.frame.as_dict(), "bytes": ln.allocated, "peak_total": ln.peak_total}
                    for ln in lines[:top]],
            "at_peak": at_peak,
        }
        if f.phase_peaks:   # each phase's own peak: a rank's forward, backward and step
            devices[device]["phases"] = phase_bytes(f.phase_peaks)
        if f.kinds:         # by kind at its own peak, where a phase ran
            devices[device]["kinds"] = dict(f.kinds)
        if device.startswith("cuda"):   # its model: a baseline of another GPU kind is not compared
            name = _gpu_name(device)
            if name:
                devices[device]["gpu_name"] = name
    return devices


def _gpu_name(device: str) -> str:
    """The model of a GPU this process used (CUDA is initialised there: it
    allocated on it); "" where it cannot be read."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.get_device_name(int(device.split(":")[1]))
    except Exception:
        pass
    return ""


def write_record(path: str, state: str, devices: dict, error: str, label: str, rank,
                 out_of_memory: list = ()) -> None:
    """A process's figures file, written atomically (its reader never sees
    half of one): a measured child's, or a rank's per test."""
    from .. import __version__   # this process's own, which the reader checks against its own

    record = {"format": FORMAT, "version": __version__, "pid": os.getpid(),
              "ppid": os.getppid(), "state": state, "label": label, "rank": rank,
              "argv": " ".join(sys.argv)[:200], "devices": devices, "error": error}
    if out_of_memory:
        record["out_of_memory"] = list(out_of_memory)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _finish_before_exit(child: ChildMeasurement) -> None:
    """This process's os._exit writes the figures first."""
    real_exit = os._exit

    def _exit(code):
        try:
            child.finish()
        except Exception:
            pass
        real_exit(code)

    os._exit = _exit


def _rank(inherited: str | None = None) -> int | None:
    """The process's rank, where it has one: RANK (torchrun, env://; not
    the one inherited from a parent that is itself a rank, which a
    DataLoader worker of a rank has), the process group's,
    torch.multiprocessing.spawn's process index, or the argument named rank
    that its multiprocessing target was started with."""
    value = os.environ.get("RANK")
    if value is not None and value != inherited and value.strip().lstrip("-").isdigit():
        return int(value)
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    process = _current_process()
    target = getattr(process, "_target", None)
    if target is not None and getattr(target, "__module__", "") == "torch.multiprocessing.spawn":
        args = getattr(process, "_args", ())
        if len(args) > 1 and isinstance(args[1], int):
            return args[1]
    if target is not None:
        return _rank_argument(target, getattr(process, "_args", ()), getattr(process, "_kwargs", None) or {})
    return None


def _rank_argument(target, args: tuple, kwargs: dict) -> int | None:
    """The int its launcher passed as the target's parameter named rank
    (torch's MultiProcessTestCase._run(rank, ...), a worker(rank, world_size)),
    read from the process's own start: its process group, if it had one,
    is gone by the time it reports."""
    import inspect

    try:
        value = inspect.signature(target).bind_partial(*args, **kwargs).arguments.get("rank")
    except (TypeError, ValueError):   # no signature (a builtin), or arguments that do not bind
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _current_process():
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return None
    try:
        process = mp.current_process()
    except Exception:
        return None
    return None if process.name == "MainProcess" else process


def _label(inherited: str | None = None) -> str:
    """What the reports call this process: its rank, its DataLoader worker
    id, its multiprocessing name, or its command line."""
    rank = _rank(inherited)
    if rank is not None:
        return f"rank {rank}"
    data = sys.modules.get("torch.utils.data")
    if data is not None:
        try:
            info = data.get_worker_info()
        except Exception:
            info = None
        if info is not None:
            return f"DataLoader worker {info.id}"
    process = _current_process()
    if process is not None:
        return process.name
    argv = [a for a in sys.argv if a]
    return "python " + " ".join(argv)[:60] if argv else "python"
