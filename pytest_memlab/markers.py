"""The markers ``cuda_memory`` and ``cpu_memory``: registration and parsing.

Every marker is parsed once, at collection, into a :class:`MemorySpec`; a bad
one is a usage error that names the test and the value, never a traceback
from inside the plugin.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from .devices import DeviceError, parse_device
from .figures import KIND_BUDGETS   # a kind's budget: its bytes at the own peak
from .figures import PHASE_NAMES   # a phase's budget: the own peak while it ran
from .sizes import SizeError, Tolerance, parse_size, parse_tolerance

MARKERS = {
    "cuda_memory": (
        "cuda_memory(max=None, *, max_total=None, max_reserved=None, leaks=0, tolerance=None, device=None, "
        "include_first_use=False, spread=None, forward=None, backward=None, step=None, activations=None, ...): "
        "CUDA memory budget of this test (sizes as bytes or strings like '2GiB'); see pytest-memlab"
    ),
    "cpu_memory": (
        "cpu_memory(max=None, *, max_total=None, leaks=0, tolerance=None, include_first_use=False, "
        "spread=None, forward=None, backward=None, step=None, activations=None, ...): "
        "CPU tensor memory budget of this test; see pytest-memlab"
    ),
}

_KEYWORDS = {
    "cuda_memory": ("max", "max_total", "max_reserved", "leaks", "tolerance", "device", "include_first_use",
                    "spread", *KIND_BUDGETS, *PHASE_NAMES),
    "cpu_memory": ("max", "max_total", "leaks", "tolerance", "include_first_use", "spread", *KIND_BUDGETS,
                   *PHASE_NAMES),
}


class MarkerError(ValueError):
    """A marker that cannot be used; the message names the test and value."""


@dataclass(frozen=True)
class MemorySpec:
    """What a test asks to be measured and held to, on one kind of device."""

    kind: str                       # "cuda" or "cpu"
    max: int | None = None          # own peak budget
    max_total: int | None = None    # device total at the peak moment
    max_reserved: int | None = None
    leaks: int | None = 0           # bytes allowed after teardown; None: off
    tolerance: Tolerance | None = None
    device: str | None = None       # "cpu", "cuda" (current at start), "cuda:N"
    include_first_use: bool = False  # max judges the own peak with what the test kept past its teardown
    marked: bool = True             # False: measured because of --memlab
    forward: int | None = None      # the own peak while a forward ran
    backward: int | None = None     # while a backward ran
    step: int | None = None         # while an optimizer step ran
    kind_max: tuple = ()            # ((marker key, bytes), ...): a kind's bytes at the own peak (activations=)
    spread: int | None = None       # the ranks' own peaks (each on its own device) at most this far apart


# What an unmarked test is measured with (--memlab, the memlab fixture), and
# any other GPU a test uses besides the devices it asked for: no budget, the
# session's leak policy.
UNMARKED = MemorySpec(kind="auto", device=None, leaks=None, marked=False)
UNMARKED_SPECS = (UNMARKED,)


def _parse_device(value: object) -> str | None:
    if value is None:
        return None
    try:
        return parse_device(value, allow_cpu=False)
    except DeviceError:
        raise MarkerError(
            f"device={value!r} is not a CUDA device (expected 'cuda', 'cuda:N', an int or a torch.device)"
        ) from None


def parse_marker(name: str, args: tuple, kwargs: dict) -> MemorySpec:
    """Parses one marker's arguments; raises MarkerError naming the value."""
    allowed = _KEYWORDS[name]
    if len(args) > 1:
        raise MarkerError(f"{name} takes at most one positional argument (max), got {len(args)}: {args!r}")
    values = dict(kwargs)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise MarkerError(f"{name} got unknown keyword {', '.join(map(repr, unknown))} (known: {', '.join(allowed)})")
    if args:
        if "max" in values:
            raise MarkerError(f"{name} got max both as a positional and as a keyword argument")
        values["max"] = args[0]
    spec = {"kind": "cuda" if name == "cuda_memory" else "cpu"}
    for key in ("max", "max_total", "max_reserved", "spread", *PHASE_NAMES):
        if values.get(key) is not None:
            try:
                spec[key] = parse_size(values[key])
            except SizeError as exc:
                raise MarkerError(f"{name}({key}={values[key]!r}): {exc}") from None
    kind_max = []
    for key in KIND_BUDGETS:
        if values.get(key) is not None:
            try:
                kind_max.append((key, parse_size(values[key])))
            except SizeError as exc:
                raise MarkerError(f"{name}({key}={values[key]!r}): {exc}") from None
    spec["kind_max"] = tuple(kind_max)
    if "leaks" in values:
        if values["leaks"] is None:
            spec["leaks"] = None
        else:
            try:
                spec["leaks"] = parse_size(values["leaks"])
            except SizeError as exc:
                raise MarkerError(f"{name}(leaks={values['leaks']!r}): {exc}") from None
    if values.get("tolerance") is not None:
        try:
            spec["tolerance"] = parse_tolerance(values["tolerance"])
        except SizeError as exc:
            raise MarkerError(f"{name}(tolerance={values['tolerance']!r}): {exc}") from None
    first_use = values.get("include_first_use", False)
    if not isinstance(first_use, bool):
        raise MarkerError(f"{name}(include_first_use={first_use!r}): expected True or False")
    spec["include_first_use"] = first_use
    if name == "cuda_memory":
        spec["device"] = _parse_device(values.get("device")) or "cuda"
    else:
        spec["device"] = "cpu"
    return MemorySpec(**spec)


# The marks of which only the closest counts (skipif: every one)
_CLOSEST = frozenset(("cuda_memory", "cpu_memory", "skip"))


def _read_marks(item) -> tuple[dict, list]:
    """item's marks in one walk of its chain, the test's own first (the
    order get_closest_marker reads them in): the closest mark of each memory
    marker and of ``skip``, by name, and every ``skipif``.  Each
    get_closest_marker or iter_markers(name) walks the chain again: four
    walks a test where this makes one (about 5 us a test on this project's
    VM, 2,000 tests 10 ms of the collection)."""
    closest: dict = {}
    skipifs: list = []
    for mark in item.iter_markers():
        name = mark.name
        if name == "skipif":
            skipifs.append(mark)
        elif name in _CLOSEST and name not in closest:
            closest[name] = mark
    return closest, skipifs


def specs_for(item, closest: dict | None = None) -> tuple[MemorySpec, ...]:
    """The closest marker of each kind on item, parsed; where the closest
    cuda_memory marker is the test's own, every cuda_memory marker of the
    test's own that names another device too (one budget per GPU).
    closest: _read_marks's, where the caller has read them."""
    if closest is None:
        closest = _read_marks(item)[0]
    specs = []
    for name in ("cuda_memory", "cpu_memory"):
        marker = closest.get(name)
        if marker is None:
            continue
        spec = parse_marker(name, marker.args, marker.kwargs)
        specs.append(spec)
        if name != "cuda_memory" or not any(m is marker for m in getattr(item, "own_markers", ())):
            continue
        devices = {spec.device or "cuda"}
        for other in item.own_markers:
            if other.name != name or other is marker:
                continue
            more = parse_marker(name, other.args, other.kwargs)
            if (more.device or "cuda") not in devices:   # the same device twice: the closest wins
                devices.add(more.device or "cuda")
                specs.append(more)
    return tuple(specs)


# Each collected test's specs: set after collection (markers that hooks add
# count), read by every hook of its run.  A tuple: an unmarked test's is the
# one shared (UNMARKED,) or the empty tuple, so that a suite of many tests
# keeps no object per test for them (each would be one more object the
# collector promotes and walks on a large heap).
SPECS = pytest.StashKey[tuple]()
# A marker that a hook added after collection and that does not parse: on a
# pytest-xdist worker, where a usage error would crash the controller, the
# test fails its setup with this text instead.
BAD_MARKER = pytest.StashKey[str]()
# A test that pytest's skipping plugin skips at the start of its setup,
# before any fixture, by its marks alone: nothing of it runs, so nothing is
# measured (a suite's skipped tests: kornia's 3,495 of 11,506 carry a skip
# mark), and memlab's parked tracer stays parked through it.
SKIPPED_BY_MARK = pytest.StashKey[bool]()


def bad_markers(nodes) -> list[str]:
    """"nodeid: what is wrong" for each item among nodes whose marker does
    not parse."""
    errors = []
    for node in nodes:
        if isinstance(node, pytest.Item):
            try:
                specs_for(node)
            except MarkerError as exc:
                errors.append(f"{node.nodeid}: {exc}")
    return errors


def stash_specs(items, measure_all: bool, skipping: bool = True) -> list[str]:
    """Parses each item's markers into its SPECS (an unmarked test gets an
    unbudgeted spec when --memlab measures every test, or when it asks for
    the memlab fixture); returns the errors, as bad_markers.  skipping:
    pytest's skipping plugin is in (a test it will skip by its marks gets no
    specs, and SKIPPED_BY_MARK)."""
    errors = []
    for item in items:
        closest, skipifs = _read_marks(item)
        try:
            specs = specs_for(item, closest)
        except MarkerError as exc:
            errors.append(f"{item.nodeid}: {exc}")
            item.stash[BAD_MARKER] = f"pytest-memlab: bad memory marker\n  {item.nodeid}: {exc}"
            continue
        if not specs and (measure_all or "memlab" in getattr(item, "fixturenames", ())):
            specs = UNMARKED_SPECS
        if specs and skipping and skipped_by_mark(closest, skipifs):
            specs = ()
            item.stash[SKIPPED_BY_MARK] = True
        item.stash[SPECS] = specs
    return errors


def skipped_by_mark(closest: dict, skipifs: list) -> bool:
    """Whether pytest's skipping plugin skips the test at the start of its
    setup by its marks alone (read as it reads them; _read_marks's closest
    and skipifs), nothing evaluated: a skip mark (or one it rejects: an
    error at the same point), or a skipif without a condition or with a
    condition that is True itself.  A string condition is pytest's to
    evaluate (once): such a test is measured as any other, as is one that
    skips from its own code or a fixture."""
    if "skip" in closest:
        return True
    for mark in skipifs:
        conditions = mark.args if "condition" not in mark.kwargs else (mark.kwargs["condition"],)
        if not conditions or any(c is True for c in conditions):
            return True
    return False
