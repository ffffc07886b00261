"""The parent's side: arms a measured test's run so that the processes it
starts measure themselves (:mod:`.startup`), and gathers their figures
after its teardown.

Per test this costs an environment variable set and restored, and one
look for a folder that exists only when a child wrote into it.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

from .. import __version__
from ..engine import environment
from ..engine.meters import DeviceFigures
from ..figures import phase_bytes
from . import startup, startup_hook
from .startup import ENV, FORMAT


class StartupHookMissing(Exception):
    """The start-up hook is not installed, and cannot be: no child is measured."""


@dataclass
class ChildFigures:
    """One child process of a test, as it reported itself."""

    pid: int
    label: str                      # "rank 1", "DataLoader worker 0", "SpawnProcess-1", "python -c ..."
    rank: int | None = None
    state: str = "done"             # "done", or "missing": it never wrote its figures
    why: str = ""                   # what is missing, and why
    devices: dict = field(default_factory=dict)   # device -> DeviceFigures
    top: dict = field(default_factory=dict)       # device -> heaviest lines [{file, line, function, bytes, peak_total}]
    at_peak: dict = field(default_factory=dict)   # device -> live at its peak by site [{bytes, chain: [frame]}]
    own: bool = False               # the test's own process (rank 0 under torchrun), listed among the ranks
    out_of_memory: list = field(default_factory=list)   # each request it could not get, explained (CUDA)
    gpu_names: dict = field(default_factory=dict)   # cuda:N -> the GPU's model, as the process saw it

    def as_dict(self) -> dict:
        """What the reports keep of it."""
        out = {"pid": self.pid, "label": self.label, "rank": self.rank, "state": self.state, "devices": {}}
        if self.why:
            out["why"] = self.why
        if self.own:
            out["own"] = True
        if self.out_of_memory:
            out["out_of_memory"] = self.out_of_memory
        for device, f in self.devices.items():
            if not f.measured:
                out["devices"][device] = {"measured": False, "reason": f.reason}
                continue
            out["devices"][device] = {"peak": f.peak, "peak_total": f.peak_total, "live": f.live,
                                      "top": self.top.get(device, [])}
            if f.phase_peaks:
                out["devices"][device]["phases"] = phase_bytes(f.phase_peaks)
            if f.kinds:
                out["devices"][device]["kinds"] = dict(f.kinds)
        return out


_root: str | None = None     # the process's children folder (one for every session it runs)
_count = itertools.count(1)  # the tests' folders in it
# The root, open: its link count is read through it after each measured test
# (fstat: no path to look up, half a stat's time); -1 until opened
_root_fd = -1


def _process_root() -> str:
    """Made on first use and removed at exit: one per process, not per
    session, because a forkserver outlives the session that started it
    (pytester's in-process sessions share a process)."""
    global _root
    if _root is None:
        _root = tempfile.mkdtemp(prefix="memlab-children-")
        atexit.register(shutil.rmtree, _root, True)
    return _root


def _open_root(path: str) -> int:
    """Opens path as the process's root (where it exists: else the root
    held stays, and disarm keeps looking for each test's folder); returns
    its link count (-1: not opened)."""
    global _root_fd
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return -1
    if _root_fd >= 0:
        os.close(_root_fd)
    else:
        atexit.register(_close_root)
    _root_fd = fd
    try:
        return os.fstat(fd).st_nlink
    except OSError:
        return -1


def _close_root() -> None:
    global _root_fd
    if _root_fd >= 0:
        os.close(_root_fd)
        _root_fd = -1


class ChildWatch:
    """Each measured test's place in the process's children folder."""

    def __init__(self, rootdir, include, top: int):
        self.root: str | None = None
        self.rootdir = str(rootdir)
        self.include = list(include or ())
        self.top = top
        self._prefix: dict[tuple, str] = {}   # (devices, RANK) -> the variable's value up to the folder
        self._before = os.environ.get(ENV)    # a session inside a measured child keeps its own
        self._sep = ""                         # the root's and the separator's JSON text, made once
        # Whether the root's link count tells its folders (2 and one more
        # for each: ext4, xfs, tmpfs; btrfs says 1 for every folder)
        self._links_count_folders = False

    def arm(self, devices: list[str]) -> tuple | None:
        """Arms the processes that the test about to run starts; returns
        what disarm needs.  The first time, installs the start-up hook
        (StartupHookMissing says why it could not)."""
        if self.root is None:
            why = startup_hook.ensure()
            if why:
                raise StartupHookMissing(why)
            self.root = _process_root()
            plain = json.dumps(self.root) == f'"{self.root}"' and json.dumps(os.sep) == f'"{os.sep}"'
            self._sep = self.root + os.sep if plain else ""
            self._links_count_folders = _open_root(self.root) >= 2
            startup.measure_forks()   # (once: the handler stays registered for the process)
        # RANK as the test's process has it now: an earlier test may have
        # set it and left it, and a child that inherits it is no rank (read
        # from os.environ's own table: decoded only for a new prefix)
        environ = os.environ
        rank = environ._data.get(_RANK_KEY) if environ.__class__ is _ENVIRON else environ.get("RANK")
        key = (tuple(devices), rank)
        prefix = self._prefix.get(key)
        if prefix is None:
            parent_rank = rank.decode(_FS_ENCODING, "surrogateescape") if rank.__class__ is bytes else rank
            text = json.dumps({"devices": list(devices), "rootdir": self.rootdir, "include": self.include,
                               "version": __version__, "top": self.top, "parent_rank": parent_rank,
                               "dir": ""})
            prefix = self._prefix[key] = text[:-3]   # ...'"dir": ' + the folder + '}'
        # Per measured test: a few microseconds, spent where nothing else
        # is (no json, no os.path, one assignment to the environment).
        if self._sep:
            folder = self._sep + str(next(_count))
            _put(f'{prefix}"{folder}"}}')
        else:
            folder = os.path.join(self.root, str(next(_count)))
            _put(prefix + json.dumps(folder) + "}")
        if _FORKSERVER in sys.modules and _forkserver_lives():
            self._tell_forkserver(folder)
        return folder, self._before

    def _tell_forkserver(self, folder: str) -> None:
        """See startup.current_folder."""
        path = os.path.join(self.root, startup.CURRENT)
        try:
            f = open(path + ".tmp", "w")
        except FileNotFoundError:   # a test removed the root: made again (a child makes its folder there)
            os.makedirs(self.root, exist_ok=True)
            f = open(path + ".tmp", "w")
        with f:
            f.write(folder)
        os.replace(path + ".tmp", path)

    def disarm(self, armed: tuple) -> list[ChildFigures]:
        """After the test's teardown: the variable as it was, and what its
        children reported (none, the common case, costs one failed look)."""
        folder, before = armed
        _put(before)   # (None: taken out, also where the test took it out itself)
        if _FORKSERVER in sys.modules and _forkserver_lives():
            self._tell_forkserver("")
        # No child wrote (the common case): one system call, no exception.
        # The root's link count first: a look for the test's folder, a name
        # never asked for before, costs a fresh directory lookup (8 us a
        # test on this project's VM against 1.5 for the root's, which the
        # kernel keeps at hand)
        if self._links_count_folders:
            try:
                links = environment.links(_root_fd)
            except OSError:
                links = -1
            if links == 2:
                return []
            if links == 0:   # the root itself was removed (a test emptied the temp folder): looked for below
                _open_root(self.root)   # the path's folder from now on, where a child made it again
        if not os.access(folder, os.F_OK):
            return []
        children = ChildWatch.peek(armed, done_only=False)
        shutil.rmtree(folder, ignore_errors=True)
        return children

    @staticmethod
    def peek(armed: tuple, done_only: bool = True) -> list[ChildFigures]:
        """What the test's children reported so far (those that ended, with
        done_only: the call's verdict judges them), ranks first."""
        if not os.access(armed[0], os.F_OK):
            return []
        try:
            names = os.listdir(armed[0])
        except FileNotFoundError:
            return []
        children = [read(os.path.join(armed[0], n)) for n in names if n.endswith(".json")]
        children.sort(key=lambda c: (c.rank is None, c.rank if c.rank is not None else 0, c.pid))
        # multiprocessing's own names count every process the test's
        # process ever started ("ForkProcess-7" after six earlier ones):
        # within the test, in the order they started, they are process 0, 1, ...
        unnamed = [c for c in children if _MP_DEFAULT_NAME.match(c.label)]
        for i, c in enumerate(unnamed):
            c.label = f"process {i}"
        if done_only:
            children = [c for c in children if c.state == "done"]
        return children

    def close(self) -> None:
        """The session ends: nothing of a later test's goes to a forkserver's children."""
        if self.root is not None and _forkserver_lives():
            self._tell_forkserver("")


_MP_DEFAULT_NAME = re.compile(r"(?:[A-Z][A-Za-z]*)?Process-\d+(?::\d+)*\Z")


def read(path: str) -> ChildFigures:
    """One child's file; a child that never finished writing is missing,
    and one of another plugin version is refused by name."""
    name = os.path.basename(path).split(".")[0]
    pid = int(name) if name.isdigit() else 0
    try:
        with open(path) as f:
            record = json.load(f)
        pid = int(record.get("pid") or pid)
    except (OSError, ValueError, AttributeError) as exc:
        return ChildFigures(pid, f"pid {pid}" if pid else name, state="missing",
                            why=f"its figures are unreadable: {exc}")
    label = str(record.get("label") or f"pid {pid}")
    rank = record.get("rank")
    child = ChildFigures(pid, label, rank if isinstance(rank, int) else None)
    if record.get("format") != FORMAT or record.get("version") != __version__:
        child.state = "missing"
        child.why = (f"it ran pytest-memlab {record.get('version')} (figures format {record.get('format')}), "
                     f"this test pytest-memlab {__version__}: install one version for every process")
        return child
    if record.get("state") == "unmeasured":
        child.state = "missing"
        child.why = f"it could not be measured: {record.get('error', '')}"
        return child
    if record.get("state") != "done":
        child.state = "missing"
        child.why = ("still running after the test's teardown: its figures are not counted"
                     if _alive(pid) else "it ended without reporting its figures (killed, or crashed)")
        return child
    if record.get("error"):
        child.why = f"part of its measurement was lost: {record['error']}"
    read_devices(child, record.get("devices") or {})
    child.out_of_memory = [o for o in record.get("out_of_memory") or () if isinstance(o, dict)]
    return child


def read_devices(child: ChildFigures, devices: dict) -> None:
    """A figures file's devices into child."""
    for device, d in devices.items():
        if not d.get("measured", True):
            child.devices[device] = DeviceFigures(device, False, reason=str(d.get("reason", "")))
            continue
        child.devices[device] = DeviceFigures(
            device, True, backend="bridge", peak=d.get("peak"), peak_total=d.get("peak_total"),
            reserved_peak=d.get("reserved_peak"), live=d.get("live"), allocs=d.get("allocs"), frees=d.get("frees"))
        phases = d.get("phases")
        if isinstance(phases, dict):
            child.devices[device].phase_peaks = {str(name): (int(peak), 0) for name, peak in phases.items()
                                                 if isinstance(peak, int)}
        kinds = d.get("kinds")
        if isinstance(kinds, dict):
            child.devices[device].kinds = {str(k): int(v) for k, v in kinds.items() if isinstance(v, int)}
        if isinstance(d.get("gpu_name"), str):
            child.gpu_names[device] = d["gpu_name"]
        child.top[device] = list(d.get("top") or [])
        child.at_peak[device] = list(d.get("at_peak") or [])


_ENVIRON = type(os.environ)           # os's own mapping (a test may put another in its place)
_ENV_KEY = ENV.encode()               # the variable's name in os.environ's table
_RANK_KEY = b"RANK"
_FS_ENCODING = sys.getfilesystemencoding()
_FORKSERVER = "multiprocessing.forkserver"


def _put(value: str | None) -> None:
    """The children's variable set to value (None: taken out) in the
    process's environment and in os.environ's table (names and values
    encoded), as os.environ's own __setitem__ and __delitem__ keep them,
    without their four Python calls: each measured test sets it and
    restores it.  The environment is written through the engine's own
    buffers (engine.environment): os.environ's putenv is glibc's setenv, which
    keeps each distinct value it was given for the life of the process,
    about 220 bytes a measured test.  Through os.environ itself where a
    test put another mapping in its place."""
    environ = os.environ
    if environ.__class__ is not _ENVIRON:
        if value is None:
            environ.pop(ENV, None)
        else:
            environ[ENV] = value
    elif value is None:
        os.unsetenv(_ENV_KEY)
        environ._data.pop(_ENV_KEY, None)
    else:
        encoded = value.encode(_FS_ENCODING, "surrogateescape")
        environment.put(_ENV_KEY, encoded)
        environ._data[_ENV_KEY] = encoded


def _forkserver_lives() -> bool:
    forkserver = sys.modules.get("multiprocessing.forkserver")
    server = getattr(forkserver, "_forkserver", None)
    return getattr(server, "_forkserver_pid", None) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    # A child not yet reaped is a zombie: it has ended.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True
