"""The garbage collector's heap, for the leak check and the laboratory's
storage report: its tensors, picked by type in C, and who refers to what,
in C too, since a large process's heap holds a million objects."""

from __future__ import annotations

import gc

from .. import _engine


def _tensor_types(torch) -> set:
    """torch.Tensor and every subclass of it alive now (Parameter, a
    project's own tensor subclasses)."""
    out, stack = set(), [torch.Tensor]
    while stack:
        kind = stack.pop()
        if kind not in out:
            out.add(kind)
            stack.extend(type.__subclasses__(kind))
    return out


def tensor_objects(torch, objects: list | None = None) -> list:
    """The tensors among objects, by default every object the garbage
    collector tracks.  A large process's heap holds a million objects: they
    are picked by exact type in C (the engine's of_types), not by a Python
    loop over each (0.3 s a walk there).  By type, not isinstance():
    isinstance asks __class__, which some module-level objects answer with
    a deprecation warning.  objects: a heap snapshot already taken
    (heap_objects()), or what a walk reached."""
    return _engine.of_types(gc.get_objects() if objects is None else objects, _tensor_types(torch))


def storage_address(tensor) -> int:
    """The address of tensor's storage, as ``untyped_storage().data_ptr()``
    says, without making the storage's Python object: torch keeps that
    object for as long as the storage lives, so reading it for every live
    tensor left thousands in the process (kornia's suite: 2,656).  Raises
    for a tensor without storage of its own (sparse, fake, functional)."""
    return tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()


def reach(roots, limit: int, prefixes: tuple) -> list:
    """What roots reach through their references (as gc.get_referents),
    depth first, each once, at most limit: not modules, classes or
    functions, nor objects of classes from modules named with one of
    prefixes, nor through them.  In C: a parametrized module reaches twenty
    thousand objects, 1.6 ms a test in a Python loop."""
    return _engine.reach(list(roots), limit, prefixes)


def items_of_kinds(container, tensor: type, containers: tuple, limit: int) -> list:
    """[(key, value, is_tensor)] of container's items, among its first
    limit, whose value is a tensor (of a subclass of tensor) or exactly of
    a type in containers, told by the objects' own types (no __class__
    read, no code run); key: a dict's key, a set's None, else the item's
    index.  In C: a large heap's 2,300 modules hold about 200,000 globals,
    30 ms in a Python loop.  A set or a deque changed while read raises
    RuntimeError."""
    return _engine.items_of_kinds(container, tensor, containers, limit)


# untrack(objects) -> int: the collector stops tracking each of objects (how
# many it did): for records kept to the session's end that can never be in
# a reference cycle (one that is would never be freed).  Each tracked one
# would be promoted to the oldest generation, bring its next full
# collection nearer (0.3 s on a heap of a million objects) and be walked by
# it.  The engine's own function, with no Python frame between: every
# measured test's result is untracked.
untrack = _engine.untrack


def heap_objects() -> list:
    """Every object the garbage collector tracks (a snapshot: the holder
    search walks it once a level)."""
    return gc.get_objects()


class ReferrerIndex:
    """Who refers to what over one heap snapshot, built in one walk (the
    engine's referrer_index): the holder search asks it once a level
    instead of walking the whole heap each level (about 70 ms a level over
    700 thousand objects).  Items appended to the heap list later are
    indexed when next asked.  An instance dict the search made (reading an
    instance's attributes makes one on 3.11+) is referred to by its owner
    only since then: :meth:`made` says whose it is."""

    def __init__(self, heap: list) -> None:
        self.heap = heap
        self._index = _engine.referrer_index(heap)
        self._owners: dict[int, int] = {}   # id(made dict) -> its owner's position in heap

    def made(self, made_dict, owner_position: int) -> None:
        self._owners[id(made_dict)] = owner_position

    def referrers(self, targets: list) -> tuple[list, list]:
        """(positions, objects) in the heap of what refers to any of
        targets, in heap order: the engine's referrers(heap, targets) for
        targets the collector tracks, which are all the holder search asks
        about (tensors and their holders).  The index keeps no reference to
        an untracked object or a class."""
        positions = _engine.index_referrers(self._index, self.heap, targets)
        owners = self._owners
        if owners:
            extra = [owners[id(t)] for t in targets if id(t) in owners]
            if extra:
                positions = sorted(set(positions).union(extra))
        heap = self.heap
        return positions, [heap[i] for i in positions]
