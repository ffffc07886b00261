"""Leaks: blocks a test allocated that are still allocated after its
teardown, the tensors living in them, and who holds each.

The protocol (run by the plugin after the function-scoped fixtures are torn
down): the engine says how many of the test's own bytes are still live; only
when that is more than allowed does memlab settle the process (a garbage
collection for reference cycles, cuBLAS's cached workspaces cleared, the
device synchronised) and ask again, so a test that leaves nothing pays no
collection.  What stays is a leak: its blocks are grouped by the user call
chain that allocated them, the Python tensors living in them are found
among the objects the garbage collector tracks, and for each a path of
references from a root (a module global, a class attribute, a closure, a
frame, a value that pytest's parametrize gave the tests) is searched
through the collector's referrers, within a time bound.
Blocks that no Python tensor owns are held by autograd (a retained graph's
saved tensors) or by C++.

Blocks of fixtures broader than the function, set up during the test, are
not the test's: the engine measured them in detached scopes.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import types
from collections import deque

from ..devices import CPU, cuda_index
from ..engine.attribution import chain_of
from ..engine.heap import ReferrerIndex, heap_objects, items_of_kinds, reach, storage_address, tensor_objects
from ..judging.findings import Leak, LeakedTensor, LeakSite
from ..sizes import format_size

# Per leaking test, for every holder search together.  Each level of the
# search walks the collector's whole heap once, so a large process (a
# suite's worth of modules, an in-process pytester) needs seconds for a
# path five levels deep; only a test that leaks pays it.
HOLDER_SECONDS = 3.0
HOLDER_DEPTH = 12         # references between a tensor and its root
# The end's search from the modules first (_held_from_modules): module
# globals and the built-in containers below them, this deep, at most this
# many objects looked at (a million-object heap's walk and index cost about
# 0.35 s; a suite's caches and true leaks sit a step or two below a global).
MODULE_DEPTH = 3
MODULE_VISITS = 300_000


def settle(core, devices) -> None:
    """Frees what is only waiting to be freed: reference cycles, and work
    still queued on the measured CUDA devices.  cuBLAS's cached workspaces
    stay (torch's own CudaMemoryLeakCheck clears them; memlab must not
    change the process: the next test would allocate them again, and its
    figures would depend on this one): no Python tensor owns them, so they
    are told apart as first use."""
    gc.collect()
    torch = core.torch
    if torch is None or not any(d != CPU for d in devices) or not torch.cuda.is_initialized():
        return
    for device in devices:
        if device != CPU and _used(core, torch, cuda_index(device)):
            torch.cuda.synchronize(cuda_index(device))


def _used(core, torch, index: int) -> bool:
    """Whether this process holds memory on CUDA device index (its caching
    allocator reserved some): synchronizing a device the process never
    used would make a CUDA context there (hundreds of MiB on a GPU another
    rank works on), and there is no queued work of its own to wait for."""
    bridge = getattr(core, "bridge", None)
    try:
        if bridge is not None:
            return bridge.cuda_totals(torch.cuda, index)[1] > 0
        return torch.cuda.memory_reserved(index) > 0
    except Exception:   # an allocator that keeps no statistics: wait, as before
        return True


def first_use_held(leak, torch=None) -> list[str]:
    """What a test kept that is no leak, named: blocks that no Python
    tensor owns or retains (a CUDA library's workspace or plan cache; on
    the CPU perhaps freed on a thread memlab does not hear), by the line
    that allocated them.  A block of exactly cuBLAS's (or cuBLASLt's)
    workspace size is named cuBLAS's."""
    if leak is None or not leak.outside_sites:
        return []
    sizes = {}
    if torch is not None and leak.device != CPU:
        for name, getter in (("cuBLAS", "_cuda_getCublasWorkspaceSize"), ("cuBLASLt", "_cuda_getCublasLtWorkspaceSize")):
            try:
                size = getattr(torch._C, getter)()
            except Exception:   # an older torch: no such getter
                continue
            if size:
                sizes.setdefault(size, name)
    out = []
    for site in leak.outside_sites:
        lib = sizes.get(site.outside) if site.blocks == 1 else None
        held = f"held by {lib} (its workspace)" if lib else (
            "held outside Python (a library's workspace or cache: no tensor owns it)" if leak.device != CPU else
            "held outside Python (no tensor owns it: a library's buffer, or freed on a thread memlab does not hear)")
        where = f", allocated at {site.chain[0]}" if site.chain else ""
        out.append(f"{format_size(site.outside)} {held}{where}")
    return out


def _live_tensors(torch, device: str, grads: dict, heap: list | None = None) -> list:
    """(storage address, tensor) of the tensors the garbage collector
    tracks on device (dense ones with storage; views count through their
    storage); fills grads with id(gradient) -> the tensor whose .grad it
    is."""
    want_cuda = device != CPU
    index = cuda_index(device) if want_cuda else None
    out = []
    for obj in tensor_objects(torch, heap):
        try:
            grad = obj._grad if obj.is_leaf else None   # _grad: no warning for non-leaves
            if grad is not None:
                grads[id(grad)] = obj
            dev = obj.device
            if (dev.type == "cuda") != want_cuda or (want_cuda and dev.index != index):
                continue
            ptr = storage_address(obj)
        except Exception:  # sparse, meta, fake or functional tensors: no storage of their own
            continue
        if ptr:
            out.append((ptr, obj))
    return out


_SCALARS = (str, bytes, int, float, complex, bool, type(None), type, types.ModuleType, types.FunctionType)


def parameter_roots(items) -> dict[int, str]:
    """id(value) -> "test TEST, parameter NAME" for each value that pytest's
    parametrize gave the collected tests (items), scalars aside.  pytest
    holds those values for the whole session (an object built in a
    parametrize list serves every test that names it, like a broader
    fixture's value), so what a test left on one is held, not garbage."""
    roots: dict[int, str] = {}
    for item in items or ():
        params = getattr(getattr(item, "callspec", None), "params", None)
        if not params:
            continue
        test = None
        for name, value in params.items():
            if isinstance(value, _SCALARS) or id(value) in roots:
                continue
            test = test or item.nodeid.partition("[")[0]
            roots[id(value)] = f"test {test}, parameter {name}"
    return roots


def find(core, device: str, blocks, allowed: int, top: int, started: float | None = None,
         excused: set[int] = frozenset(), ignore_ids: set[int] = frozenset(),
         params: dict[int, str] | None = None) -> Leak:
    """The leak report for blocks ((addr, size, scope, site), live after
    the protocol) on device.  excused: ids of objects that pytest releases
    right after teardown (a function fixture's value in item.funcargs),
    whose references ignore_ids lists: a tensor among them with no other
    holder is not a leak."""
    return find_many(core, device, [(blocks, allowed)], started, excused, ignore_ids, params=params)[0]


def find_many(core, device: str, groups: list, started: float | None = None,
              excused: set[int] = frozenset(), ignore_ids: set[int] = frozenset(),
              seconds: float = HOLDER_SECONDS, deferred: bool = False,
              params: dict[int, str] | None = None, alive: frozenset | None = None) -> list[Leak]:
    """A Leak per group (blocks, allowed) of device, from one scan of the
    live tensors and one holder search for all of them (a batch of suspects
    costs what one does).  deferred: the groups' tests ended a while ago,
    while memlab did not hear every free (between measurements): a block no
    Python tensor owns may have been freed unheard, so such bytes count
    only where a tensor of the same group retains an autograd graph (whose
    saved tensors they are), or where alive (:func:`allocated_blocks`)
    says the allocator still holds them allocated.  The process is settled
    beforehand (:func:`settle`).  params: :func:`parameter_roots`."""
    return _find_many(core, device, groups, started, excused, ignore_ids, seconds, deferred, params=params,
                      alive=alive)


def find_held(core, device: str, groups: list, started: float | None = None,
              excused: set[int] = frozenset(), ignore_ids: set[int] = frozenset(),
              seconds: float = HOLDER_SECONDS, params: dict[int, str] | None = None,
              alive: frozenset | None = None, walk: bool = True) -> list[Leak] | None:
    """find_many for deferred groups in a process not settled: the Leaks
    where every tensor found in the groups' blocks is proven held, by a
    path from a module's globals, or from a class or a function that its
    module names (modules are held by sys.modules, so what such a path
    reaches is no garbage a collection would free), or from a parameter's
    value (pytest holds those for the session), else None
    (the caller settles the process and asks find_many).  A suite's
    suspects at its end are mostly caches and true leaks in module
    globals: this spares the full collection, the largest part of the
    end's cost on a large heap.  walk=False: None as soon as a block has
    no tensor that modules' globals reach (the heap is not walked)."""
    return _find_many(core, device, groups, started, excused, ignore_ids, seconds, True, proof=True, params=params,
                      alive=alive, walk=walk)


def _find_many(core, device: str, groups: list, started: float | None, excused: set[int],
               ignore_ids: set[int], seconds: float, deferred: bool, proof: bool = False,
               params: dict[int, str] | None = None, alive: frozenset | None = None,
               walk: bool = True) -> list[Leak] | None:
    torch = core.torch
    leaks, by_site, starts = [], [], []
    for g, (blocks, allowed) in enumerate(groups):
        leaks.append(Leak(device, sum(size for _, size, _, _ in blocks), allowed))
        sites: dict[int, LeakSite] = {}
        for addr, size, _, site in blocks:
            entry = sites.get(site)
            if entry is None:
                entry = sites[site] = LeakSite(chain_of(site))
            entry.bytes += size
            entry.blocks += 1
            starts.append((addr, size, site, g))
        by_site.append(sites)
    starts.sort()
    # A block's own storage starts at the block's address (each block is one
    # allocation, one storage).  A storage that starts inside a block is a
    # later allocation in memory the block's owner freed unheard (between
    # tests) and the heap split: counting it would name another test's tensor
    # as this one's leak (the watch hears a reuse of the address itself).
    by_addr = {b[0]: b for b in starts}   # (of two at one address: the later suspect's, whose block is there now)
    owned: dict[int, int] = {}     # block addr -> bytes owned by tensors found
    # storage ptr -> (block, its tensors): a view holds its base from C++,
    # out of the collector's sight, so each tensor of a storage is searched
    # for, and the storage is held where any of them is
    found: dict[int, tuple] = {}
    grads: dict[int, object] = {}
    quick = _held_from_modules(torch, device, starts, by_addr, alive) if proof and torch is not None else None
    if quick is not None:
        # every block is held by a tensor a module's globals reach: proven
        # held, each named by that path, without a walk of the heap
        tensors, named = quick
        proven = {id(t) for _, t in tensors}
        heap = None
    elif not walk:
        return None
    else:
        # One snapshot of the heap for the tensors and the holder search (each
        # gc.get_objects() of a large heap costs about 60 ms)
        heap = heap_objects()
        tensors = _live_tensors(torch, device, grads, heap) if torch is not None else []
    for ptr, tensor in tensors:
        block = by_addr.get(ptr)
        if block is None:
            continue
        same = found.get(ptr)
        if same is not None:
            same[1].append(tensor)
            continue
        found[ptr] = (block, [tensor])
        size = block[1]
        try:   # (the storage's Python object made only for a tensor in a block)
            nbytes = tensor.untyped_storage().nbytes()
        except Exception:
            nbytes = size
        owned[ptr] = owned.get(ptr, 0) + min(nbytes, size)
    deadline = (started or time.perf_counter()) + seconds
    released: dict[int, int] = {}   # block addr -> bytes of excused tensors
    if heap is not None:
        proven: set[int] | None = set() if proof else None
        named = {}
        if found:   # (no tensor in the blocks: nothing to name, and no index of the heap to build)
            ignore = {id(tensors), id(found), id(starts), id(grads)} | {id(t) for t in tensors} \
                | {id(v) for v in found.values()} | {id(v[1]) for v in found.values()} | set(ignore_ids)
            # A batch names one holder per tensor: each further path costs the search
            # a walk of the whole heap per level, for every tensor at once.
            named = holders_of([t for _, same in found.values() for t in same], ignore, deadline, grads,
                               limit=1 if deferred else 2, proven=proven, params=params, heap=heap)
        del heap
    if proven is not None and any(all(id(t) not in proven and id(t) not in excused for t in same)
                                  for _, same in found.values()):
        return None   # a storage perhaps only garbage keeps: the process must be settled first
    if time.perf_counter() > deadline:
        for leak in leaks:
            leak.note = f"holders searched for {seconds:.0f} s; paths longer than that search are not named"
    graphs = set()                  # groups with a tensor that retains a graph
    for ptr, ((addr, size, site, g), same) in found.items():
        tensor = next((t for t in same if named.get(id(t))), same[0])   # one the search named, where any
        entry = LeakedTensor(tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""), device,
                             min(tensor.untyped_storage().nbytes(), size),
                             holders=named.get(id(tensor), []), requires_grad=bool(tensor.requires_grad))
        if not entry.holders and any(id(t) in excused for t in same):
            # pytest's own reference to a torn-down function fixture's value
            # or a failure's traceback, dropped soon: not the test's leak
            owned[addr] = owned.get(addr, 0) - entry.bytes
            released[addr] = released.get(addr, 0) + entry.bytes
            continue
        if tensor.grad_fn is not None:
            entry.graph = f"retains an autograd graph (grad_fn={type(tensor.grad_fn).__name__})"
            graphs.add(g)
        by_site[g][site].tensors.append(entry)
    for addr, size, site, g in starts:
        gone = released.get(addr, 0)
        unowned = max(0, size - gone - owned.get(addr, 0))
        if g not in graphs:
            # No tensor of the test retains a graph whose saved tensors
            # these could be: memory a library keeps for the process (a
            # cuBLAS workspace, a plan cache: first use, not a leak), or, at
            # the session's end, freed while memlab did not listen (between
            # tests: a function fixture's value that pytest dropped after
            # teardown, garbage the end's collection freed).  Not evidence
            # of a leak either way; first use only where memlab listened,
            # or where the allocator says the block is still allocated.
            if not deferred or (alive is not None and addr in alive):
                leaks[g].outside += unowned
                by_site[g][site].outside += unowned
            gone += unowned
            unowned = 0
        by_site[g][site].bytes -= gone
        leaks[g].bytes -= gone
        by_site[g][site].unowned += unowned
    del tensors, found, grads
    for leak, sites in zip(leaks, by_site):
        # Ties in the order of the chains and tensors, not of the blocks'
        # addresses or the heap's walk, which change from run to run: the
        # same leak reads the same in every run (and shows the same first few)
        for site in sites.values():
            site.tensors.sort(key=_tensor_order)
        leak.sites = sorted((s for s in sites.values() if s.bytes > 0), key=lambda s: (-s.bytes, _chain_order(s)))
        leak.outside_sites = sorted((s for s in sites.values() if s.outside > 0),
                                    key=lambda s: (-s.outside, _chain_order(s)))
    return leaks


def _chain_order(site) -> tuple:
    return tuple((f.file, f.line, f.function) for f in site.chain)


def _tensor_order(t) -> tuple:
    return (-t.bytes, t.shape, t.dtype, t.holders, t.graph)


def _held_from_modules(torch, device: str, starts: list, by_addr: dict,
                       alive: frozenset | None = None) -> tuple[list, dict] | None:
    """The tensors in the blocks starts (sorted (addr, size, ...), by_addr
    them by their addresses; a block's storage starts at it) that modules' globals reach through built-in
    containers (dict, list, tuple, deque, set, their exact types: no code
    of a subclass runs while they are read), breadth first, the smaller
    containers of a level first, MODULE_DEPTH deep and MODULE_VISITS
    objects at most: ([(storage address, tensor)], id(tensor) -> [its path]),
    where every block has such a tensor; else None (the heap is searched).
    A module is held by sys.modules, so what its globals reach is no
    garbage: each such block is proven held, and the path names it as
    holders_of would ("module m, global name[key]").  Objects are told
    by their type alone (no isinstance: a deprecated global warns when its
    class is read), and a path is written only for a tensor found.
    alive: the blocks the allocator still holds allocated
    (allocated_blocks), where it can say: no tensor lives in any other
    (freed while memlab did not listen), so only these need one, and with
    none the walk is not taken at all."""
    Tensor = torch.Tensor
    want_cuda = device != CPU
    index = cuda_index(device) if want_cuda else None
    left = {addr for addr, _, _, _ in starts if alive is None or addr in alive}
    if not left:
        return [], {}
    found: dict[int, tuple] = {}   # id(tensor) -> (ptr, tensor, link)
    containers = (dict, list, tuple, deque, set, frozenset)
    seen: set[int] = set()

    def path(link) -> str:
        steps = []
        while link[0] is not None:   # (parent link, how its container refers to this)
            link, step = link
            steps.append(step if isinstance(step, str) else f"[{step}]" if isinstance(step, int)
                         else f"[{_key_text(step[0])}]")
        module, key = link[1]
        return f"module {module}, global {_named(f'[{_key_text(key)}]' + ''.join(reversed(steps)))}"

    def take(obj, link) -> bool:
        """A tensor met: kept where it is one of the blocks; whether none is left."""
        if id(obj) in found:
            return False
        try:
            dev = obj.device
            if (dev.type == "cuda") != want_cuda or (want_cuda and dev.index != index):
                return False
            ptr = storage_address(obj)
        except Exception:   # no storage of its own
            return False
        if ptr not in by_addr:
            return False
        found[id(obj)] = (ptr, obj, link)
        left.discard(ptr)
        return not left

    def done() -> tuple:
        return [(p, t) for p, t, _ in found.values()], {k: [path(v[2])] for k, v in found.items()}

    def descend(obj, link) -> None:
        """A container met, not seen before: read at the next level."""
        if id(obj) not in seen:
            seen.add(id(obj))
            size = len(obj)
            if size <= MODULE_VISITS:   # (a larger one would end the walk before its end)
                below.append((size, obj, link))

    def module_globals():
        """Level 0: each module's globals once, in sys.modules's order (a
        module's dict that a global below reached first is read there)."""
        for name, module in list(sys.modules.items()):
            values = _module_dict(module)
            if values is not None and id(values) not in seen:
                seen.add(id(values))
                yield values, name

    # Level 0, modules' globals; then each level's containers, the smaller
    # first (a cache, a list of leaks).  Read in C: most of what is read is
    # functions, classes, modules and strings, passed over without an
    # object made for them.  A link is made only for a tensor or a
    # container: (None, (module name, global's name)) at level 0 (where a
    # module's globals come with its name in place of a link), below it
    # (parent link, step), a step an int index, (key,) of a dict, or
    # " (member)" of a set.
    below: list = []
    visits = 0
    level = module_globals()
    for depth in range(MODULE_DEPTH):
        for container, link in level:
            room = MODULE_VISITS - visits   # the walk ends at its limit: these are read up to it
            try:
                picked = items_of_kinds(container, Tensor, containers, room)
            except Exception:   # a set or a deque changed while read (or no memory): passed over, not counted
                continue
            visits += len(container)
            kind = type(container)
            for key, obj, is_tensor in picked:
                if depth == 0:
                    at = (None, (link, key))
                else:
                    at = (link, (key,) if kind is dict else " (member)" if kind is set or kind is frozenset else key)
                if is_tensor:
                    if take(obj, at):
                        return done()
                elif depth + 1 < MODULE_DEPTH:
                    descend(obj, at)
            if visits > MODULE_VISITS:
                return None
        level, below = [(obj, link) for _, obj, link in sorted(below, key=lambda entry: entry[0])], []
    return None


def allocated_blocks(torch, device: str) -> frozenset | None:
    """The start addresses of the blocks that CUDA's caching allocator
    holds allocated on device now, from its snapshot (read only: nothing
    is freed, emptied or recorded), or None where it cannot say (the CPU,
    CUDA not started, another allocator backend).  At the session's end it
    tells a library's workspace, still allocated, from a block freed while
    memlab did not listen."""
    if torch is None or device == CPU:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        index = cuda_index(device)
        out = set()
        for seg in torch.cuda.memory_snapshot():
            if seg.get("device") != index:
                continue
            addr = seg["address"]   # blocks follow each other in the segment, in address order
            for block in seg.get("blocks", ()):
                start = block.get("address", addr)
                if block.get("state") == "active_allocated":
                    out.add(start)
                addr = start + block["size"]
        return frozenset(out)
    except Exception:   # an allocator backend without a snapshot: not known
        return None


def released_by_pytest(item, failure=None, limit: int = 20000) -> tuple[set[int], set[int]]:
    """What pytest drops right after a test's teardown report (the values
    of its function-scoped fixtures, which item.funcargs still holds while
    teardown is judged) or at the next test's call (a failed call's
    traceback and the locals of its frames: sys.last_traceback for an
    exception, failure for what pytest.fail, a signal handler or a timeout
    raised, which pytest keeps in the call's excinfo).  Returns (ids of the
    objects reachable from them, within limit; ids of pytest's containers
    to look past)."""
    roots, look_past = _held_by_pytest(item, failure)
    return {id(obj) for obj in _reach(roots, limit)}, look_past


def storages_held_by_pytest(item, failure, torch, limit: int = 20000) -> set[int]:
    """The storage addresses of the tensors released_by_pytest's objects
    reach: a suspect's blocks that pytest alone holds for a while, told at
    its teardown, while its own frames still say so, without a heap walk."""
    roots, _ = _held_by_pytest(item, failure)
    out = set()
    for obj in tensor_objects(torch, _reach(roots, limit)):
        try:
            out.add(storage_address(obj))
        except Exception:   # sparse, meta or fake tensors: no storage of their own
            pass
    return out


def _held_by_pytest(item, failure) -> tuple[list, set[int]]:
    roots, look_past = [], set()
    funcargs = getattr(item, "funcargs", None)
    if isinstance(funcargs, dict) and funcargs:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}) or {}
        roots += [v for name, v in funcargs.items()
                  if not defs.get(name) or getattr(defs[name][-1], "scope", "function") == "function"]
        look_past.add(id(funcargs))
    # A failed call's traceback (sys.last_traceback, which pytest keeps
    # until the next test runs, or the call's excinfo) holds the failed
    # frames' locals.
    for tb in (getattr(sys, "last_traceback", None), failure):
        while tb is not None:
            frame = tb.tb_frame
            if id(frame) not in look_past and not _machinery_file(frame.f_code.co_filename):
                roots += list(frame.f_locals.values())
                look_past.add(id(frame))
            tb = tb.tb_next
    return roots, look_past


# pytest's and memlab's own code: a failure's traceback runs through their
# frames, whose locals (the item, the session, the request) reach the whole
# session; what the test's frames or fixtures hold is reached from those.
_MACHINERY = tuple(os.path.dirname(os.path.abspath(sys.modules[name].__file__)) + os.sep
                   for name in ("_pytest", "pluggy", __package__.partition(".")[0])
                   if getattr(sys.modules.get(name), "__file__", None))
_MACHINERY_MODULES = ("_pytest.", "pluggy.", "pytest_memlab.")


def _machinery_file(filename: str) -> bool:
    return filename.startswith(_MACHINERY) or filename == __file__


def _reach(roots: list, limit: int) -> list:
    """What roots reach through containers and attributes (not through
    modules, classes or functions, nor into pytest's objects: a request
    reaches the session and every test), within limit, depth first."""
    return reach(roots, limit, _MACHINERY_MODULES)


# -- who holds an object -------------------------------------------------------

def _module_dict(module) -> dict | None:
    """A module's globals, read past its class: a lazy module
    (importlib.util.LazyLoader) runs its code when an attribute is read
    through it, and looking must not import anything."""
    if types.ModuleType not in type(module).__mro__:   # (by its type: isinstance reads __class__)
        return None
    try:
        values = object.__getattribute__(module, "__dict__")
    except AttributeError:
        return None
    return values if type(values) is dict else None


def _module_dicts() -> dict[int, str]:
    out = {}
    for name, module in list(sys.modules.items()):
        values = _module_dict(module)
        if values is not None:
            out[id(values)] = name
    return out


def _key_text(key) -> str:
    if isinstance(key, (str, int, float, bool)) or key is None:
        return repr(key)
    return f"<{type(key).__name__}>"


def _edge(ref, child, dicts: list | None = None) -> str | None:
    """How ref refers to child, as a step of a path ('[0]', "['w']",
    '.attr'); None if ref is something to look through.  dicts, where
    given, receives the instance dicts read (reading one makes it, on
    Pythons that keep attributes without a dict object: an object on the
    heap that a snapshot of it lacks)."""
    if isinstance(ref, dict):
        for k, v in ref.items():
            if v is child:
                return f"[{_key_text(k)}]"
        for k in ref:
            if k is child:
                return f" key {_key_text(k)}"
        return None
    if isinstance(ref, (list, tuple, deque)):
        for i, v in enumerate(ref):
            if v is child:
                return f"[{i}]"
        return None
    if isinstance(ref, (set, frozenset)):
        return " (member)"
    if isinstance(ref, types.CellType):
        return ""
    try:  # an instance's attributes (3.11+ may keep them without a dict object)
        attrs = object.__getattribute__(ref, "__dict__")
    except Exception:
        attrs = None
    if dicts is not None and type(attrs) is dict:
        dicts.append(attrs)
    if attrs is child:
        return ".__dict__"
    if isinstance(attrs, dict):
        for k, v in attrs.items():
            if v is child:
                return f".{k}"
    slots = getattr(type(ref), "__slots__", ())
    for name in (slots,) if isinstance(slots, str) else slots:
        if getattr(ref, name, None) is child:
            return f".{name}"
    return f" ({type(ref).__name__})"


def holders_of(targets: list, ignore: set[int], deadline: float, grads: dict | None = None,
               limit: int = 2, proven: set[int] | None = None,
               params: dict[int, str] | None = None, heap: list | None = None) -> dict[int, list[str]]:
    """id(target) -> paths of references from roots to it (at most limit
    each, nearest first).  Breadth-first over all targets at once, a level
    of referrers at a time, until HOLDER_DEPTH levels or the deadline (the
    heap is taken once and indexed in C in one walk: each level then costs
    lookups, not a walk of the whole heap).  A root is a module's globals,
    a class, a function's closure, a frame's locals, a parameter's value
    (params: id -> its name, from
    :func:`parameter_roots`).  grads maps id(gradient) -> its tensor (a
    .grad is held in C++, out of the collector's sight).  proven, where
    given, receives the ids of the targets with a path from a module's
    globals (directly, or through a class or a function that its module
    names) or from a parameter's value.  heap: a snapshot the caller took
    (heap_objects()); the search appends to it."""
    modules = _module_dicts()
    params = params or {}
    grads = grads or {}
    own_frames = set()
    f = sys._getframe()
    while f is not None:
        own_frames.add(id(f))
        f = f.f_back
    found: dict[int, list[str]] = {id(t): [] for t in targets}
    # (id(node), target) -> (child toward the target, edge from node to child)
    parent: dict[tuple[int, int], tuple[object, str]] = {}
    frontier: dict[int, tuple[object, set]] = {id(t): (t, {id(t)}) for t in targets}
    seen = {(id(t), id(t)) for t in targets}
    heap = heap_objects() if heap is None else heap
    index = ReferrerIndex(heap)
    made: list = []   # instance dicts the search read: on the heap from then on
    in_heap: set[int] = set()
    ignore = ignore | {id(found), id(parent), id(frontier), id(seen), id(modules), id(heap), id(targets), id(made)}

    def path_from(node, target: int) -> str:
        steps = []
        while (id(node), target) in parent:
            node, edge = parent[(id(node), target)]
            steps.append(edge)
        return _tidy("".join(steps))

    def add_root(target: int, text: str) -> None:
        if len(found[target]) < limit:
            found[target].append(text)

    def step(nxt, ref, child, edge, wanted) -> None:
        rid = id(ref)
        for t in wanted:
            if (rid, t) in seen:
                continue
            seen.add((rid, t))
            parent[(rid, t)] = (child, edge)
            nxt.setdefault(rid, (ref, set()))[1].add(t)

    for _ in range(HOLDER_DEPTH):
        if params:   # a parameter's value is a root, and costs no heap walk to see
            for cid, (child, tset) in list(frontier.items()):
                label = params.get(cid)
                if label is None:
                    continue
                wanted = {t for t in tset if len(found[t]) < limit}
                for t in wanted:
                    add_root(t, label + path_from(child, t))
                if proven is not None:
                    proven.update(wanted)
                del frontier[cid]
        if not frontier or time.perf_counter() > deadline:
            break
        if all(len(paths) >= limit for paths in found.values()):
            break   # each level walks the whole heap: none for nothing
        nxt: dict[int, tuple[object, set]] = {}
        for cid, (child, tset) in frontier.items():   # gradients: their tensor holds them
            owner = grads.get(cid)
            if owner is not None:
                step(nxt, owner, child, ".grad", tset)
        asked = [obj for obj, _ in frontier.values()]
        positions, refs = index.referrers(asked)
        ignore.add(id(refs))
        ignore.add(id(asked))
        for position, ref in zip(positions, refs):
            rid = id(ref)
            if rid in ignore or rid in own_frames:
                continue
            is_frame = isinstance(ref, types.FrameType)
            if is_frame and ref.f_code.co_filename == __file__:
                continue
            for child in (obj for obj, _ in frontier.values()) if is_frame else gc.get_referents(ref):
                entry = frontier.get(id(child))
                if entry is None or entry[0] is not child:
                    continue
                wanted = {t for t in entry[1] if len(found[t]) < limit}
                if not wanted:
                    continue
                if is_frame:
                    name = next((k for k, v in ref.f_locals.items() if v is child), None)
                    if name is None:
                        continue
                    code = ref.f_code
                    where = (f"local {name} of {getattr(code, 'co_qualname', code.co_name)} "
                             f"({code.co_filename.rsplit('/', 1)[-1]}:{ref.f_lineno})")
                    for t in wanted:
                        add_root(t, where + path_from(child, t))
                    continue
                if isinstance(ref, types.FunctionType) and ref.__closure__ is child:
                    names = ref.__code__.co_freevars
                    if proven is not None and _module_holds(ref):
                        proven.update(wanted)
                    for t in wanted:
                        below = path_from(child, t)   # "[i]...": the cell's index
                        i = int(below[1:below.index("]")]) if below.startswith("[") else -1
                        var = names[i] if 0 <= i < len(names) else "?"
                        rest = below[below.index("]") + 1:] if i >= 0 else below
                        add_root(t, f"closure of {ref.__module__}.{ref.__qualname__} (variable {var}){rest}")
                    continue
                if isinstance(ref, type):
                    if proven is not None and _module_holds(ref):
                        proven.update(wanted)
                    for t in wanted:
                        below = path_from(child, t) if isinstance(child, dict) \
                            else (_edge(ref, child) or "") + path_from(child, t)
                        add_root(t, f"class {ref.__module__}.{ref.__qualname__}, attribute {_named(below)}")
                    continue
                before = len(made)
                edge = _edge(ref, child, made)
                for d in made[before:]:
                    index.made(d, position)
                if edge is None:
                    continue
                if isinstance(ref, dict) and rid in modules:
                    for t in wanted:
                        add_root(t, f"module {modules[rid]}, global {_named(edge + path_from(child, t))}")
                    if proven is not None:
                        proven.update(wanted)
                    continue
                step(nxt, ref, child, edge, wanted)
        del refs, asked, positions
        for d in made:   # a referrer from now on, where the snapshot has its owner
            if id(d) not in in_heap:
                in_heap.add(id(d))
                heap.append(d)
        made.clear()
        frontier = nxt
    del heap, index
    return found


def _module_holds(obj) -> bool:
    """Whether obj (a class or a function) is held by its module: named by
    its qualified name there, or (a function a factory made) one of the
    module's globals.  Held by sys.modules, so no garbage."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    if module is None or not hasattr(module, "__dict__"):
        return False
    found = module
    for part in (getattr(obj, "__qualname__", "") or "<locals>").split("."):
        found = vars(found).get(part) if part != "<locals>" and hasattr(found, "__dict__") else None
        if found is None:
            break
    return found is obj or any(value is obj for value in list(vars(module).values()))


def _tidy(path: str) -> str:
    """obj.__dict__['x'] reads as obj.x."""
    out, i = [], 0
    key = ".__dict__['"
    while True:
        j = path.find(key, i)
        if j < 0:
            out.append(path[i:])
            return "".join(out)
        end = path.find("']", j)
        out.append(path[i:j] + "." + path[j + len(key):end])
        i = end + 2


def _named(path: str) -> str:
    """"['x'][0]" reads as "x[0]"."""
    if path.startswith("['"):
        end = path.find("']")
        return path[2:end] + path[end + 2:]
    return path
