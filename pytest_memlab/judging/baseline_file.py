"""The baseline file: what each test's memory was when the file was last
written, per environment, and how a run compares with it.

The format is the README's ("Baselines"), so that it diffs well in review: JSON, sorted
keys, two-space indent, a trailing newline.  A file with one environment
reads exactly as the README shows it (``environment`` and ``tests`` at the
top, the environment naming itself in ``name``); a file that serves several
lanes (a CPU lane and a GPU lane) keeps each under ``environments``, by name.

Writes are atomic (a temporary file in the same folder, fsync, rename) and
happen under a lock file beside the baseline, re-reading it inside the lock,
so that two processes updating one file never lose an entry.  A broken file
or a format version this code does not know is a :class:`BaselineError`
naming the file and what is wrong; nothing writes over such a file.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic_files import lock, write_atomic

FORMAT = "pytest-memlab-baseline"
VERSION = 1
FIGURES = ("peak", "peak_total", "reserved_peak", "leaked")


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and
    what is wrong with it."""


@dataclass
class Environment:
    """One lane's entries: the environment they were measured in, and per
    test and device the figures."""

    info: dict = field(default_factory=dict)     # torch, cuda, device, python
    tests: dict = field(default_factory=dict)    # nodeid -> device -> {figure: int|None}


@dataclass
class Baseline:
    path: Path
    environments: dict[str, Environment] = field(default_factory=dict)

    # -- reading --------------------------------------------------------------
    @classmethod
    def load(cls, path: Path) -> "Baseline":
        """Raises FileNotFoundError when there is no file, BaselineError
        when there is one that cannot be used."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise
        except (OSError, UnicodeDecodeError) as exc:
            raise BaselineError(f"baseline {path}: cannot be read: {exc}") from None
        return cls.parse(path, text)

    @classmethod
    def load_or_new(cls, path: Path) -> "Baseline":
        try:
            return cls.load(path)
        except FileNotFoundError:
            return cls(Path(path))

    @classmethod
    def parse(cls, path: Path, text: str) -> "Baseline":
        def bad(what: str) -> BaselineError:
            return BaselineError(f"baseline {path}: {what}; the file was left as it is "
                                 "(fix it, or delete it and write a new one with --memlab-update-baseline)")

        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise bad(f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
        except RecursionError:
            raise bad("nested too deeply to be read (not a baseline: a baseline is three objects deep)") from None
        if not isinstance(data, dict):
            raise bad(f"expected a JSON object at the top, found {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise bad(f"'format' is {data.get('format')!r}, expected {FORMAT!r}: not a pytest-memlab baseline")
        version = data.get("version")
        if version != VERSION:
            raise BaselineError(
                f"baseline {path}: format version {version!r} is not known to this pytest-memlab, which reads "
                f"version {VERSION}; the file was left as it is (use the pytest-memlab that wrote it, or "
                "delete it and write a new one with --memlab-update-baseline)")
        baseline = cls(Path(path))
        if "environments" in data:
            envs = data["environments"]
            if not isinstance(envs, dict):
                raise bad("'environments' is not an object")
            for name, env in envs.items():
                if not isinstance(env, dict):
                    raise bad(f"environment {name!r} is not an object")
                baseline.environments[name] = _environment(bad, name, env)
        elif "tests" in data:
            info = data.get("environment", {})
            name = info.get("name") if isinstance(info, dict) else None
            if not isinstance(name, str) or not name:
                raise bad("'environment' has no 'name' (the lane its figures were measured in)")
            baseline.environments[name] = _environment(bad, name, data)
        else:
            raise bad("it has neither 'tests' nor 'environments'")
        return baseline

    # -- writing --------------------------------------------------------------
    def to_json(self) -> str:
        data: dict = {"format": FORMAT, "version": VERSION}
        envs = {name: env for name, env in self.environments.items() if env.tests or env.info}
        if len(envs) == 1:
            (name, env), = envs.items()
            data["environment"] = {**env.info, "name": name}
            data["tests"] = env.tests
        else:
            data["environments"] = {name: {"environment": env.info, "tests": env.tests}
                                    for name, env in envs.items()}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def write(self) -> None:
        """Atomically: the old file stays whole until the new one replaces it."""
        write_atomic(self.path, self.to_json())

    # -- entries --------------------------------------------------------------
    def entry(self, env: str, nodeid: str, device: str) -> dict | None:
        e = self.environments.get(env)
        return None if e is None else e.tests.get(nodeid, {}).get(device)

    def count(self) -> int:
        return sum(len(devices) for env in self.environments.values() for devices in env.tests.values())


def _check_sites(bad, nodeid: str, device: str, sites) -> None:
    """A test's heaviest sites at its peak (judging.site_changes): a list
    of {bytes, file, function, text, callers: [{file, function, text}]}
    (callers missing from files written before they were kept)."""
    where = f"test {nodeid!r}, device {device!r}: sites"
    if not isinstance(sites, list):
        raise bad(f"{where} is {sites!r}, expected a list of lines")
    for site in sites:
        if (not isinstance(site, dict) or not isinstance(site.get("bytes"), int) or isinstance(site["bytes"], bool)
                or site["bytes"] < 0 or not all(isinstance(site.get(k), str) for k in ("file", "function", "text"))):
            raise bad(f"{where}: {site!r} is not a line (expected bytes, file, function and text)")
        callers = site.get("callers", [])
        if not isinstance(callers, list) or not all(
                isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("file", "function", "text"))
                for c in callers):
            raise bad(f"{where}: {site!r} has callers that are not lines (expected a list of "
                      "file, function and text)")


def _check_named_bytes(bad, nodeid: str, device: str, key: str, value) -> None:
    """Each phase's peak (phases), the bytes at the peak by kind (kinds) at
    the last update: shown, never compared; the broader fixtures the test
    needs, each with what its setup held (fixtures): what --memlab-pack
    counts per worker."""
    if not isinstance(value, dict) or any(
            not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in value.values()):
        what = {"phases": "phase", "kinds": "kind", "fixtures": "fixture"}[key]
        raise bad(f"test {nodeid!r}, device {device!r}: {key} is {value!r}, expected an object of "
                  f"{what} -> bytes")


def _environment(bad, name: str, data: dict) -> Environment:
    info = data.get("environment", {})
    if not isinstance(info, dict):
        raise bad(f"environment {name!r}: 'environment' is not an object")
    tests = data.get("tests", {})
    if not isinstance(tests, dict):
        raise bad(f"environment {name!r}: 'tests' is not an object")
    for nodeid, devices in tests.items():
        if not isinstance(devices, dict) or not devices:
            raise bad(f"test {nodeid!r}: expected an object of devices, found {devices!r}")
        for device, figures in devices.items():
            if not isinstance(figures, dict):
                raise bad(f"test {nodeid!r}, device {device!r}: expected an object of figures, found {figures!r}")
            for key, value in figures.items():
                if key == "sites":
                    _check_sites(bad, nodeid, device, value)
                    continue
                if key in ("phases", "kinds", "fixtures"):
                    _check_named_bytes(bad, nodeid, device, key, value)
                    continue
                if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                    raise bad(f"test {nodeid!r}, device {device!r}: {key} is {value!r}, expected bytes "
                              "(a whole number >= 0) or null")
            if not isinstance(figures.get("peak"), int):
                raise bad(f"test {nodeid!r}, device {device!r}: no 'peak'")
    info = {k: v for k, v in info.items() if k != "name"}
    return Environment(info, tests)


def update(path: Path, env_name: str, info: dict, written: dict, stale: set | None = None) -> tuple[Baseline, dict]:
    """Merges this run's entries into the file under its lock and writes it.

    ``written``: nodeid -> device -> figures; ``stale``: nodeids to drop
    (pruning).  Returns the file as written and what changed:
    ``{"new": [...], "changed": [...], "pruned": [...]}``.  Raises
    BaselineError, leaving the file as it is, when the file on disk cannot
    be used.
    """
    with lock(path):
        baseline = Baseline.load_or_new(path)
        env = baseline.environments.setdefault(env_name, Environment())
        if info and written:
            # a run in which no test started CUDA cannot name the GPU: the
            # lane keeps the name it had
            keep = info.get("device") in (None, "cpu") and env.info.get("device") not in (None, "cpu")
            env.info = {**info, "device": env.info["device"]} if keep else dict(info)
        changes: dict[str, list] = {"new": [], "changed": [], "pruned": []}
        for nodeid, devices in sorted(written.items()):
            old = env.tests.get(nodeid)
            if old is None:
                changes["new"].append(nodeid)
            elif any(old.get(d) != f for d, f in devices.items()):
                changes["changed"].append(nodeid)
            env.tests[nodeid] = {**(old or {}), **devices}
        for nodeid in sorted(stale or ()):
            if nodeid in env.tests and nodeid not in written:
                del env.tests[nodeid]
                changes["pruned"].append(nodeid)
        if written or changes["pruned"] or not Path(path).exists():
            baseline.write()   # (nothing to write: the file stays byte for byte)
    return baseline, changes


def merge(out: Path, inputs: list[Path]) -> tuple[Baseline, list[str]]:
    """``python -m pytest_memlab merge OUT IN...``: the entries of every
    input over OUT's (OUT need not exist); returns the result and the
    conflicts (one test measured by two inputs, the later kept)."""
    loaded = [Baseline.load(p) for p in inputs]   # every input checked before anything is written
    conflicts: list[str] = []
    with lock(out):
        result = Baseline.load_or_new(out)
        seen: dict[tuple, Path] = {}
        for source in loaded:
            for name, env in source.environments.items():
                target = result.environments.setdefault(name, Environment())
                if env.info:
                    target.info = dict(env.info)
                for nodeid, devices in env.tests.items():
                    entry = target.tests.setdefault(nodeid, {})
                    for device, figures in devices.items():
                        key = (name, nodeid, device)
                        if key in seen and entry.get(device) != figures:
                            conflicts.append(f"{nodeid} [{name} {device}] in {seen[key]} and {source.path}: "
                                             f"kept {source.path}'s")
                        seen[key] = source.path
                        entry[device] = dict(figures)
        result.write()
    return result, conflicts


# -- environments ---------------------------------------------------------------
def environment_info(torch) -> dict:
    """The facts that decide the figures: torch, CUDA, the device, Python.
    The device's name is read only where CUDA is initialised already
    (measuring never initialises CUDA)."""
    info: dict = {"python": platform.python_version()}
    if torch is None:
        return info
    info["torch"] = torch.__version__.split("+")[0]
    info["cuda"] = getattr(torch.version, "cuda", None)
    device = None
    try:
        if torch.cuda.is_initialized():
            device = torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception:
        device = None
    # "cpu" where no GPU figured: which CPU runs a test does not move its
    # tensor memory, so a CPU lane reads the same on every machine
    info["device"] = device or "cpu"
    return info


def _minor(version: object) -> str | None:
    if not isinstance(version, str):
        return None
    return ".".join(version.split(".")[:2])


def environment_differences(old: dict, new: dict) -> list[str]:
    """What differs between the baseline's environment and this run's, as
    far as it moves memory figures: the device, torch's minor version,
    CUDA's version."""
    out = []
    if old.get("device") not in (None, "cpu") and new.get("device") not in (None, "cpu") \
            and old["device"] != new["device"]:
        out.append(f"device {old['device']} -> {new['device']}")
    if _minor(old.get("torch")) and _minor(new.get("torch")) and _minor(old["torch"]) != _minor(new["torch"]):
        out.append(f"torch {old['torch']} -> {new['torch']}")
    if "cuda" in old and "cuda" in new and old["cuda"] != new["cuda"]:
        out.append(f"CUDA {old['cuda'] or 'none'} -> {new['cuda'] or 'none'}")
    return out


def stale_entries(baseline: Baseline, env: str, collected: set[str], rootdir: Path) -> list[str]:
    """Entries of tests that no longer exist: their file is gone, or their
    file was collected in this run and they were not among its tests.
    (Entries of files this run did not collect are left alone: a run of one
    file says nothing of the others.)"""
    e = baseline.environments.get(env)
    if e is None:
        return []
    files = {nodeid.split("::", 1)[0] for nodeid in collected}
    stale = []
    for nodeid in e.tests:
        if nodeid in collected:
            continue
        file = nodeid.split("::", 1)[0]
        if file in files or not (rootdir / file).exists():
            stale.append(nodeid)
    return sorted(stale)
