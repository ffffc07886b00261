"""Leak suspects: tests whose own bytes were still allocated after their
teardown (and a young-generation collection), under the warn policy, kept
for one batch at the session's end instead of a full collection each.

A test's bytes that only wait for the cyclic collector (autograd graphs in
reference cycles, gradchecks) would cost a full collection over a large
heap per test, 0.1 to 0.5 s each.  Kept as suspects, they cost a copy of
their block list; at the end one scan of the live tensors and one holder
search confirm them all.  A tensor whose storage is a suspect's block then is
a leak (or a cache: :mod:`pytest_memlab.judging` tells which) where a path
from a module's globals holds it; where any is held otherwise, or by
nothing found, the process is settled (a full collection) and they are
searched again, so that what only waits for the collector is not a leak.

memlab hears frees only while it measures, so a suspect's block may have
been freed unheard between tests, and its address reused.  Two guards: the
engine watches the suspects' addresses, and a block at whose address an
allocation or a free was heard since is dropped; at the end, bytes no
Python tensor owns count as a leak only where a tensor of the same test
retains an autograd graph, and as first use where CUDA's caching allocator
still holds the block allocated (its snapshot: a library's workspace).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..engine.backend import BRIDGE
from ..engine.meters import EngineMeter, Watch
from ..judging.findings import Leak

# Suspects past which the end settles the process before its one holder
# search: the search without a collection proves a suspect held only where
# every tensor of it is reached from a module or a parameter, and one
# garbage or unprovable tensor among hundreds sends the end to the
# collection and a second search anyway (kornia's 11507 tests: 432
# tensors, 126 of them garbage; a search and an index of a million-object
# heap cost about 0.5 s).  Either way the verdicts are the same.
SETTLE_FIRST = 32


@dataclass
class Suspect:
    nodeid: str
    device: str
    blocks: list            # (addr, size, scope, site) after its teardown
    allowed: int
    location: tuple = ()    # (file, line) of the test function: where its warning points
    seq: int = 0            # order of the tests that left them


@dataclass
class LeakSuspects:
    pending: list[Suspect] = field(default_factory=list)
    left: list[Suspect] = field(default_factory=list)   # leaks confirmed at their teardown, still watched
    _watches: dict = field(default_factory=dict)   # device -> Watch
    # (device, addr) -> the latest suspect with a block there: a later
    # suspect's block at an earlier one's address was allocated after that
    # one's block went (the watch, armed again by the later one, cannot say)
    _owners: dict = field(default_factory=dict)
    _gone: set = field(default_factory=set)       # (id(suspect), addr) of blocks gone so

    def __bool__(self) -> bool:
        return bool(self.pending)

    def add_left(self, nodeid: str, device: str, blocks: list) -> None:
        """A leak its test's teardown confirmed (it failed the test): not
        judged again, watched so that a later out-of-memory can name it."""
        suspect = Suspect(nodeid, device, list(blocks), 0)
        self.left.append(suspect)
        self._track(suspect)

    def add(self, nodeid: str, device: str, blocks: list, allowed: int, location: tuple = ()) -> None:
        suspect = Suspect(nodeid, device, list(blocks), allowed, location, len(self.pending))
        self.pending.append(suspect)
        self._track(suspect)

    def _track(self, suspect: Suspect) -> None:
        """Watches a suspect's addresses; an earlier one's block at the
        same address is gone."""
        device = suspect.device
        watch = self._watches.get(device)
        if watch is None:
            watch = self._watches[device] = Watch(device)
        owners = self._owners
        for addr, _, _, _ in suspect.blocks:
            earlier = owners.get((device, addr))
            if earlier is not None:
                self._gone.add((id(earlier), addr))
            owners[(device, addr)] = suspect
        watch.add([b[0] for b in suspect.blocks])

    def forget(self) -> None:
        """Stops watching every address (the session's end)."""
        for watch in self._watches.values():
            watch.clear()
        self.pending, self.left, self._watches, self._owners, self._gone = [], [], {}, {}, set()

    def _held_blocks(self, suspect: Suspect) -> list:
        """A suspect's blocks whose address is still watched and that no
        later suspect's block took."""
        still = self._watches[suspect.device].still([b[0] for b in suspect.blocks])
        gone = self._gone
        return [b for b, kept in zip(suspect.blocks, still) if kept and (id(suspect), b[0]) not in gone]

    def _drop_gone(self) -> None:
        """Each suspect keeps only its blocks still held (_held_blocks)."""
        for suspect in self.pending:
            suspect.blocks = self._held_blocks(suspect)

    def still_held(self, device: str) -> list:
        """[(suspect, blocks)] of the suspects on device whose blocks are
        still allocated, as far as the engine heard (an out-of-memory's
        explanation: which earlier test left what), without taking them."""
        out = []
        for suspect in self.left + self.pending:
            if suspect.device == device and suspect.blocks:
                blocks = self._held_blocks(suspect)
                if blocks:
                    out.append((suspect, blocks))
        return out

    def confirm(self, core, seconds: float, params: dict[int, str] | None = None) -> list:
        """[(suspect, Leak)] for every suspect: the Leak's bytes are what
        is still held (0: nothing was).  params: the session's parameter
        values (leak_search.parameter_roots), roots of the holder search."""
        try:
            return self._confirm(core, seconds, params)
        finally:
            self.forget()

    def _confirm(self, core, seconds: float, params: dict[int, str] | None) -> list:
        from .leak_search import allocated_blocks, find_held, find_many, released_by_pytest

        started = time.perf_counter()
        self._drop_gone()
        suspects = [s for s in self.pending if s.blocks]
        # every block gone (heard freed since): nothing is held, and the
        # figure says so like any other suspect's
        out = [(s, Leak(s.device, 0, s.allowed)) for s in self.pending if not s.blocks]
        if not suspects:
            return out
        by_device = {d: [s for s in suspects if s.device == d] for d in sorted({s.device for s in suspects})}
        excused, look_past = released_by_pytest(None)   # the last failure's traceback: pytest's
        # Which blocks no tensor owns are still allocated (a library's
        # workspace: first use), where the allocator can say.
        alive = {d: allocated_blocks(core.torch, d) for d in by_device}
        # First without a collection: held from a module's globals is held.
        # Half the holder search's time for it, so that a search it cannot
        # finish leaves the settled one the rest.
        unsettled = []
        for device, group in by_device.items():
            if len(group) > SETTLE_FIRST:
                unsettled.append(device)
                continue
            leaks = find_held(core, device, [(s.blocks, s.allowed) for s in group], started,
                              excused, look_past, seconds=seconds / 2, params=params, alive=alive[device])
            if leaks is None:
                unsettled.append(device)
            else:
                out += zip(group, leaks)
        if unsettled:
            self._settle(core, unsettled)
            excused, look_past = released_by_pytest(None)
            for device in unsettled:
                # The blocks the collection freed were heard going (the
                # watch let go of them): those suspects held nothing.  What
                # is left is mostly what modules hold, proven without a
                # second walk of the heap where it is all so.
                group = []
                for s in by_device[device]:
                    s.blocks = self._held_blocks(s)
                    if s.blocks:
                        group.append(s)
                    else:
                        out.append((s, Leak(s.device, 0, s.allowed)))
                if not group:
                    continue
                alive[device] = allocated_blocks(core.torch, device)   # the collection freed some
                groups = [(s.blocks, s.allowed) for s in group]
                leaks = find_held(core, device, groups, started, excused, look_past, params=params,
                                  alive=alive[device], walk=False)
                if leaks is None:
                    leaks = find_many(core, device, groups, started, excused, look_past, seconds=seconds,
                                      deferred=True, params=params, alive=alive[device])
                out += zip(group, leaks)
        return sorted(out, key=lambda pair: pair[0].seq)

    def _settle(self, core, devices: list) -> None:
        """leak_search.settle with the engine listening on devices (a
        scope open on each), so that the watch hears each suspect's block
        that the collection frees: no sign of a leak, and no holder to
        search for."""
        from .leak_search import settle

        listening = []
        try:
            if core.name == BRIDGE:
                for device in devices:
                    meter = EngineMeter(core, device, detached=True)
                    meter.begin()
                    listening.append(meter)
            settle(core, devices)
        finally:
            for meter in reversed(listening):
                meter.end()
