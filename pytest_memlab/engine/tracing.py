"""Which code is the user's, and the tracer's lifetime.

The C tracer (csrc/tracer.c) asks :class:`Scope` once per code object
whether it is user code; user frames get line events, the rest none.  The
one :data:`tracing` object shares the tracer between the plugin (the path
rule, for a measured test) and the laboratory API (the functions it was
given).

Windows: before Python 3.12 the tracer is a trace function, which CPython
calls for every call and return of every frame while it is set, pytest's own
included.  A measured test therefore traces only in windows around the code
that can be the user's (fixture setup, the test call, teardown), which keeps
pytest's machinery between them at full speed.  From 3.12 on, sys.monitoring
disables out-of-scope code for good after its first call, while turning the
events on and off makes CPython re-instrument every code object it runs
next: one window spans the whole measurement there.
"""

from __future__ import annotations

import fnmatch
import os
import sys
import sysconfig

from .. import _engine as engine

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINDOWED = sys.version_info < (3, 12)

# Phase functions: the scope decision returns 1 + the kind for them (the
# kinds are csrc/phases.h's, exported by the engine), and the tracer marks
# their outermost call on the test's timeline.  No hook is registered with
# torch: its state stays as it is.  Their names: figures.PHASE_NAMES.
PHASE_FORWARD, PHASE_BACKWARD, PHASE_STEP = engine.PHASE_FORWARD, engine.PHASE_BACKWARD, engine.PHASE_STEP
# The path rule's verdict for user code: in scope, with no line events; each
# frame's line is found when something is allocated under it (Python 3.12+,
# csrc/shadow_stack.h; before, such code is traced line by line).  The
# laboratory's profilers get True: every line, with its hits.
LOCATED = engine.SCOPE_LOCATED


def _phase_codes() -> dict:
    """code object -> decision for torch's phase functions, where torch is
    imported (never importing it) and has them."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    found = {}
    try:
        found[torch.nn.Module.__call__.__code__] = 1 + PHASE_FORWARD
    except AttributeError:
        pass
    for name in ("backward", "grad"):
        fn = getattr(getattr(torch, "autograd", None), name, None)
        if hasattr(fn, "__code__"):
            found[fn.__code__] = 1 + PHASE_BACKWARD
    try:
        # Every optimizer's step runs through this wrapper once the
        # optimizer exists (Optimizer.profile_hook_step): one code object.
        wrapper = torch.optim.Optimizer.profile_hook_step(lambda *a, **k: None)
        found[wrapper.__code__] = 1 + PHASE_STEP
    except Exception:
        pass
    return found


def untraced_imports(original):
    """A replacement for builtins.__import__ that imports with the trace
    function off (before 3.12; original itself from 3.12 on)."""
    return engine.untraced_imports(original)


def _library_roots() -> tuple[str, ...]:
    roots = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            roots.add(os.path.realpath(sysconfig.get_path(name)))
        except KeyError:
            pass
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        roots.add(os.path.realpath(os.path.join(prefix, "lib")))
    return tuple(sorted(roots))


class Scope:
    """Decides whether a code object is user code, once per file, plus the
    functions that the laboratory API was given explicitly."""

    def __init__(self) -> None:
        self.rootdir: str | None = None
        self.include: tuple[str, ...] = ()
        self.codes: dict[object, int] = {}   # code -> how many profilers hold it
        self.paths_on = False                # the plugin's path rule is in force
        self.phases: dict = {}               # torch's phase functions -> decision
        self._by_file: dict[str, bool] = {}
        self._real_dirs: dict[str, str] = {}   # a directory -> its real path
        self._libs = _library_roots()

    def configure(self, rootdir: str | os.PathLike, include: tuple[str, ...] = ()) -> None:
        self.rootdir = os.path.realpath(str(rootdir))
        self.include = tuple(include)
        self._by_file.clear()

    def file_in_scope(self, filename: str) -> bool:
        if filename.startswith("<") and filename.endswith(">"):
            return False  # <string>, <frozen ...>: no source to show
        path = self._real_path(filename)
        if path.startswith(_PACKAGE_DIR + os.sep):
            return False
        if self.include:
            rel = os.path.relpath(path, self.rootdir) if self.rootdir else path
            return any(fnmatch.fnmatch(path, g) or fnmatch.fnmatch(rel, g) for g in self.include)
        if self.rootdir is None or not (path + os.sep).startswith(self.rootdir + os.sep):
            return False
        if any(f"{os.sep}{part}{os.sep}" in path for part in ("site-packages", "dist-packages")):
            return False
        return not any(path.startswith(lib + os.sep) for lib in self._libs if lib != self.rootdir
                       and not self.rootdir.startswith(lib + os.sep))

    def _real_path(self, filename: str) -> str:
        """os.path.realpath of a file, its directory's resolved once: a
        package's hundreds of files cost one resolution of their folder's
        path and one lstat each (realpath's lstat of every part of the
        path, per file, was most of a child's added import time)."""
        head, tail = os.path.split(os.path.abspath(filename))
        real = self._real_dirs.get(head)
        if real is None:
            real = self._real_dirs[head] = os.path.realpath(head)
        path = os.path.join(real, tail)
        return os.path.realpath(path) if os.path.islink(path) else path

    def __call__(self, code) -> bool | int:
        if code in self.codes:
            return True
        if not self.paths_on:
            return False
        phase = self.phases.get(code)
        if phase is not None:
            return phase
        filename = code.co_filename
        verdict = self._by_file.get(filename)
        if verdict is None:
            verdict = self._by_file[filename] = LOCATED if self.file_in_scope(filename) else False
        return verdict


class Tracing:
    """The one tracer of the process, shared: the plugin turns the path rule
    on for a measured test, profilers add their functions; the C tracer runs
    while anyone holds it."""

    def __init__(self) -> None:
        self.scope = Scope()
        self.users = 0
        self.off_reason = ""
        # Functions were given or taken back since the tracer last decided:
        # code decided before (located for the path rule, traced line by
        # line for a profiler) is asked again at the next start.
        self._codes_changed = False

    def conflict(self) -> str:
        """Why the tracer cannot run now ("" if it can)."""
        if sys.version_info < (3, 12):
            other = sys.gettrace()
            if other is not None and self.users == 0:
                name = type(other).__module__ + "." + type(other).__qualname__
                return (f"another trace function is active ({name}; coverage or a debugger?): on Python "
                        f"{sys.version_info.major}.{sys.version_info.minor} memlab would replace it, so line "
                        "attribution is off (on Python 3.12+ both work)")
        else:
            # memlab takes sys.monitoring's tool id 4, else 3 (never the
            # profiler's or the debugger's): both taken by other tools
            if sys.monitoring.get_tool(4) == "pytest-memlab":   # (every measured test, once it has run)
                return ""
            taken = [sys.monitoring.get_tool(i) for i in (4, 3)]
            if all(name is not None and name != "pytest-memlab" for name in taken):
                return (f"sys.monitoring's tool ids 4 and 3 are taken by other tools ({taken[0]}, {taken[1]}): "
                        "line attribution is off")
        return ""

    def _remember(self, paths: bool, codes) -> bool:
        """Adds to the scope; True if that changed what is in it."""
        changed = False
        if paths and not self.scope.paths_on:
            self.scope.paths_on = changed = True
        for code in codes:
            count = self.scope.codes.get(code, 0)
            self.scope.codes[code] = count + 1
            if count == 0:
                changed = self._codes_changed = True
        return changed

    def extend(self, codes) -> None:
        """A holder adds functions while the tracer runs (released with it)."""
        if self._remember(False, codes) and self.users > 0:
            engine.tracer_redecide()
            self._codes_changed = False

    def acquire(self, *, paths: bool = False, codes=()) -> bool:
        """Starts or joins the tracer; False (with off_reason) if it cannot run."""
        # (every measured test: its path rule, already on where the tracer
        # was parked, and no functions; no call where nothing is added)
        changed = self._remember(paths, codes) if codes or (paths and not self.scope.paths_on) else False
        if self.users == 0:
            # (conflict's first question, asked here: from the second measured test on, its answer)
            if WINDOWED:
                reason = "" if sys.gettrace() is None else self.conflict()
            else:
                reason = "" if sys.monitoring.get_tool(4) == "pytest-memlab" else self.conflict()
            if reason:
                self.off_reason = reason
                self._forget(paths, codes)
                return False
            if not self.scope.phases and "torch" in sys.modules:
                self.scope.phases = _phase_codes()
            engine.tracer_start(self.scope)
            if self._codes_changed:
                engine.tracer_redecide()
        elif changed:
            engine.tracer_redecide()
        self._codes_changed = False
        self.users += 1
        return True

    def _forget(self, paths: bool, codes) -> None:
        if paths:
            self.scope.paths_on = False
        for code in codes:
            count = self.scope.codes.get(code, 0) - 1
            if count <= 0:
                self.scope.codes.pop(code, None)
                self._codes_changed = True
            else:
                self.scope.codes[code] = count

    def release(self, *, paths: bool = False, codes=(), park: bool = False) -> None:
        """Leaves the tracer; the last holder stops it.  With park, on
        sys.monitoring, its events stay on (and cost nothing) until
        :meth:`unpark`: the next measured test then finds every out-of-scope
        code object still disabled instead of re-instrumenting it."""
        self.users -= 1
        parking = park and self.users == 0 and not WINDOWED
        # A parked tracer still decides the code that first runs between
        # two measured tests (and disables what is out of scope): the path
        # rule stays in force for it until unpark.
        if codes or (paths and not parking):
            self._forget(paths and not parking, codes)
        if self.users == 0:
            engine.tracer_stop(park=park)
        elif paths or codes:
            engine.tracer_redecide()
            self._codes_changed = False

    # Starts the per-line figures afresh (a new measured test): the engine's
    # own function, with no Python frame between.
    reset_lines = staticmethod(engine.tracer_reset_lines)

    @staticmethod
    def phase_hook(hook) -> None:
        """hook(kind, subject, inputs) at each phase's start (kind) and end
        (-kind) on the measuring thread, subject its module or optimizer
        (or None), inputs a forward's positional arguments (or None); None:
        no hook."""
        engine.tracer_phase_hook(hook)

    @staticmethod
    def phases() -> list:
        """(kind, slot, event number, label) of each phase start (kind > 0)
        and end (-kind) heard since the lines were reset."""
        return engine.tracer_phases()[0]

    def unpark(self) -> None:
        """Turns off the events a parked tracer left on (before a test that
        is not measured, and at the end of the session)."""
        if self.users == 0:
            engine.tracer_unpark()
            self.scope.paths_on = False


tracing = Tracing()
