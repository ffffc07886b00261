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
colons and the fixture's name, with ``[i]`` for the i-th of its params:
the test it serves lies under that node (``encloses``).
"""

from __future__ import annotations

import re

_KEY = re.compile(r"^(.*?)::([A-Za-z_]\w*(?:\[\d+\])?)$")


def instance_key(fixturedef, request) -> str | None:
    """The key of the instance request is setting up; None where pytest
    does not say its scope's node."""
    try:
        node = request.node
        key = f"{node.nodeid if node is not request.session else ''}::{fixturedef.argname}"
        if fixturedef.params is not None:
            key += f"[{request.param_index}]"
        return key
    except Exception:   # (pytest's internals moved: the fixture is not counted)
        return None


def encloses(key: str, nodeid: str) -> bool:
    """Whether the instance key names is one the test nodeid runs under
    (the worker keeps it while its tests lie there; leaving, pytest tears
    it down)."""
    match = _KEY.match(key)
    if match is None:
        return False
    scope = match.group(1)
    return scope == "" or nodeid.startswith(scope + "::") or nodeid.startswith(scope + "/")


class BroadFixtures:
    """Per process: the instance each broader fixture definition holds now,
    and what its setup held on each device (where memlab measured it)."""

    def __init__(self):
        self._now: dict = {}   # FixtureDef -> (key, {device: bytes})

    def set_up(self, fixturedef, request, held: dict[str, int]) -> None:
        """An instance of fixturedef was set up; held: the most its setup
        held on each measured device (its own peak)."""
        key = instance_key(fixturedef, request)
        if key is not None:
            self._now[fixturedef] = (key, held)

    @property
    def known(self) -> bool:
        return bool(self._now)

    def forget(self, fixturedef) -> None:
        """An instance set up where memlab did not measure: not known."""
        self._now.pop(fixturedef, None)

    def of_test(self, item, device: str) -> dict[str, int] | None:
        """The broader fixture instances item needs that hold bytes on
        device, as set up in this process; None where there is none."""
        if not self._now:
            return None
        try:
            defs = item._fixtureinfo.name2fixturedefs
            names = item.fixturenames
        except AttributeError:   # (not a pytest Function)
            return None
        out = None
        for name in names:
            chain = defs.get(name)
            if not chain:
                continue
            known = self._now.get(chain[-1])
            if known is None:
                continue
            key, held = known
            n = held.get(device, 0)
            if n > 0:
                if out is None:
                    out = {}
                out[key] = n
        return out
