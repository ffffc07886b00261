"""Fixtures broader than the function (class, module, package, session):
what each instance holds, and which instances a test needs.

Such a fixture is measured apart from the test whose setup builds it (a
detached scope: what it keeps alive is no test's figure).  Yet a process
holds it for as long as the tests of its scope run there, and under
pytest-xdist each worker builds its own copy: --memlab-pack counts it on
every worker that runs a test needing it.  So a test's baseline entry
names the broader fixture instances it needs, each with the most its setup
held (``"fixtures": {"tests/test_model.py::model": bytes}``), and the
scheduler counts an instance once per worker, from the first test there
that needs it until that worker leaves its scope.

An instance's key is its scope's node id (the session's is empty), two
colons and the fixture's name; then ``[i]`` for the i-th of its params
(one such instance replaces another: pytest tears the old one down first),
and ``@`` and where the fixture is defined where that is not the scope's
node (two conftests' session fixtures of one name are two instances).  The
test an instance serves lies under its scope's node (``encloses``).
"""

from __future__ import annotations

import re

# Instances whose setup held less are not listed: packing counts in MiB,
# and every test of a session would repeat each small one.
LISTED_BYTES = 2**20

_KEY = re.compile(r"^(.*?)::([A-Za-z_]\w*)(\[\d+\])?(@.*)?$")
_parsed: dict[str, tuple[str, str] | None] = {}


def instance_key(fixturedef, request) -> str | None:
    """The key of the instance request is setting up; None where pytest
    does not say its scope's node."""
    try:
        node = request.node
        scope = node.nodeid if node is not request.session else ""
        key = f"{scope}::{fixturedef.argname}"
        if fixturedef.params is not None:
            key += f"[{request.param_index}]"
        defined = fixturedef.baseid or ""
        if defined and defined != scope:
            key += f"@{defined}"
        return key
    except Exception:   # (pytest's internals moved: the fixture is not counted)
        return None


def parse(key: str) -> tuple[str, str] | None:
    """(its scope's node id, its slot: the key without its param), or None
    for a key this code did not write."""
    try:
        return _parsed[key]
    except KeyError:
        pass
    match = _KEY.match(key)
    parsed = None if match is None else (match.group(1), f"{match.group(1)}::{match.group(2)}{match.group(4) or ''}")
    _parsed[key] = parsed
    return parsed


def slot_of(key: str) -> str:
    """The key without its param: the one instance of that fixture a
    process holds at a time (a key this code did not write: itself)."""
    parsed = parse(key)
    return key if parsed is None else parsed[1]


def encloses(key: str, nodeid: str) -> bool:
    """Whether the instance key names is one the test nodeid runs under
    (the worker keeps it while its tests lie there; leaving, pytest tears
    it down)."""
    parsed = parse(key)
    if parsed is None:
        return False
    scope = parsed[0]
    return scope == "" or nodeid == scope or nodeid.startswith(scope + "::") or nodeid.startswith(scope + "/")


class BroadFixtures:
    """Per process: the instance each broader fixture definition holds now,
    and what its setup held on each device (where memlab measured it)."""

    def __init__(self):
        self._now: dict = {}   # FixtureDef -> (key, {device: bytes})

    @property
    def known(self) -> bool:
        return bool(self._now)

    def set_up(self, fixturedef, request, held: dict[str, int]) -> None:
        """An instance of fixturedef was set up; held: the most its setup
        held on each measured device (its own peak)."""
        key = instance_key(fixturedef, request)
        if key is not None:
            self._now[fixturedef] = (key, held)

    def forget(self, fixturedef) -> None:
        """An instance set up where memlab did not measure: not known."""
        self._now.pop(fixturedef, None)

    def of_test(self, item, device: str) -> dict[str, int] | None:
        """The broader fixture instances item used that held at least
        LISTED_BYTES on device, as set up in this process; None where there
        is none.  Each definition of a name it requests counts (a fixture
        that overrides another and requests it uses both), and those it
        asked for by request.getfixturevalue."""
        if not self._now:
            return None
        try:
            defs = item._fixtureinfo.name2fixturedefs
            names = item.fixturenames
        except AttributeError:   # (not a pytest Function)
            return None
        used = [d for name in names for d in defs.get(name, ())]
        asked = getattr(getattr(item, "_request", None), "_fixture_defs", None)
        if isinstance(asked, dict):
            used += asked.values()
        out = None
        for fixturedef in used:
            known = self._now.get(fixturedef)
            if known is None:
                continue
            key, held = known
            n = held.get(device, 0)
            # (an instance of another module or class: an overridden
            # definition's, set up for other tests, not this one's)
            if n >= LISTED_BYTES and encloses(key, item.nodeid):
                if out is None:
                    out = {}
                out[key] = n
        return out
