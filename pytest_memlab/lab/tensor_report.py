"""The storage report: which tensors occupy memory, by device, named where
a model or optimizer says who they are, and memory by kind (parameters,
gradients, optimizer state, buffers, other tensors, and what no Python
object reaches).  ``MemReporter`` keeps pytorch_memlab's interface;
``memlab.tensors()`` gives the same report for the running test.

Sizes are storages' real byte counts (``untyped_storage().nbytes()``),
each storage counted once: a tensor that shares another's storage is shown
as ``name(->other)`` with 0 bytes.
"""

from __future__ import annotations

import gc
import sys
import weakref
from dataclasses import dataclass, field

from ..engine.heap import tensor_objects
from ..sizes import format_size

KINDS = ("parameters", "gradients", "optimizer state", "buffers", "other tensors")
UNREACHABLE = "not reachable from Python"
WIDTH = 79


@dataclass
class TensorRow:
    name: str
    shape: tuple
    dtype: str
    bytes: int           # 0 when its storage was counted under another name
    kind: str
    shares: str = ""     # the name its storage was first counted under
    ptr: int = 0         # its storage's address


@dataclass
class DeviceStorage:
    device: str
    rows: list[TensorRow] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    allocated: int | None = None     # the allocator's (or engine's) total, where known
    unreachable_blocks: list = field(default_factory=list)   # (bytes, chain) from the engine's ledger

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    @property
    def unreachable(self) -> int | None:
        return None if self.allocated is None else max(0, self.allocated - self.total)


@dataclass
class StorageReport:
    devices: dict[str, DeviceStorage] = field(default_factory=dict)

    def text(self, verbose: bool = False, device: str | None = None) -> str:
        out = []
        row = "{:<44s}{:>22s}{:>12s}"
        out.append(row.format("Element type", "Size", "Used MEM"))
        for name, dev in self.devices.items():
            if device is not None and name != device:
                continue
            out.append("-" * WIDTH)
            out.append(f"Storage on {name}")
            for r in dev.rows:
                label = r.name + (f"(->{r.shares})" if verbose and r.shares else "")
                if r.shares and not verbose:
                    continue
                out.append(row.format(label[:43], str(r.shape)[:21], format_size(r.bytes)))
            out.append("-" * WIDTH)
            out.append(f"Total Tensors: {sum(1 for r in dev.rows if not r.shares)}\tUsed Memory: "
                       f"{format_size(dev.total)}")
            out.append(f"Memory by kind on {name}:")
            for kind in KINDS:
                out.append(f"  {kind:<28s}{format_size(dev.by_kind[kind]):>12s}")
            if dev.allocated is not None:
                out.append(f"  {UNREACHABLE:<28s}{format_size(dev.unreachable):>12s}  "
                           f"(allocated on {name}: {format_size(dev.allocated)})")
                if dev.unreachable:
                    out.append("  (bytes no Python tensor reaches: autograd's saved tensors, C++ caches "
                               "such as cuBLAS workspaces, allocation rounding)")
            if dev.unreachable_blocks:
                out.append(f"  blocks allocated in this test that no Python tensor reaches: "
                           f"{format_size(sum(b for b, _ in dev.unreachable_blocks))}, by site:")
                for size, chain in dev.unreachable_blocks[:5]:
                    where = f"allocated at {chain[0]}" if chain else "allocated outside user code"
                    out.append(f"    {format_size(size):>10s}  {where}")
            out.append("-" * WIDTH)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.text()


def unreachable_blocks(report: StorageReport, device: str, blocks) -> None:
    """Adds to report's device the blocks ((addr, size, scope, site) from
    the engine's ledger) that no row's storage lies in, by site."""
    import bisect

    from ..engine.attribution import bytes_by_site

    d = report.devices.get(device)
    if d is None:
        d = report.devices[device] = DeviceStorage(device)
    ptrs = sorted(r.ptr for r in d.rows if r.ptr)

    def unreachable(block) -> bool:
        i = bisect.bisect_left(ptrs, block[0])
        return not (i < len(ptrs) and ptrs[i] < block[0] + block[1])

    d.unreachable_blocks = bytes_by_site(filter(unreachable, blocks))


def _device_name(device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else 0}"
    return str(device)


class MemReporter:
    """pytorch_memlab's MemReporter: ``MemReporter(model=None)``,
    ``add_optimizer(opt)``, ``report(verbose=False, device=None)``."""

    def __init__(self, model=None, pre_collect: bool = False):
        self.pre_collect = pre_collect
        # id -> (weak reference, name, kind): names hold nothing alive, and
        # an id reused by a new tensor is not taken for the old one's
        self._named: dict[int, tuple] = {}
        self._optimizers: list = []
        self._unnamed = 0
        if model is not None:
            self.add_model(model)

    def add_model(self, model) -> None:
        names: dict[int, list[str]] = {}
        objs = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
            objs[id(param)] = param
        for key, names_of in names.items():
            self._name(objs[key], "+".join(names_of), "parameters")
        for name, buf in model.named_buffers():
            self._name(buf, name, "buffers")

    def add_optimizer(self, optimizer) -> None:
        kind = type(optimizer).__name__
        if not any(ref() is optimizer for ref in self._optimizers):
            self._optimizers.append(weakref.ref(optimizer))
        for param, states in optimizer.state.items():
            pname = self._lookup(param)[0]
            if pname is None:
                pname = self._name(param, f"Parameter{self._next()}", "parameters")
            for key, value in states.items():
                if _is_tensor(value):
                    self._name(value, f"{kind}.{pname}.{key}", "optimizer state")

    def _next(self) -> int:
        self._unnamed += 1
        return self._unnamed - 1

    def _name(self, tensor, name: str, kind: str) -> str:
        self._named[id(tensor)] = (weakref.ref(tensor), name, kind)
        return name

    def _lookup(self, tensor) -> tuple[str | None, str | None]:
        entry = self._named.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return None, None
        return entry[1], entry[2]

    def collect(self, device: str | None = None, engine_blocks=None) -> StorageReport:
        """The report now; device limits it to one ("cpu", "cuda:0")."""
        import torch

        if self.pre_collect:
            gc.collect()
        for ref in self._optimizers:   # state made since add_optimizer
            opt = ref()
            if opt is not None:
                self.add_optimizer_states(opt)
        report = StorageReport()
        seen: dict[tuple[str, int], str] = {}
        tensors = tensor_objects(torch)
        grads = []
        for t in tensors:
            g = t._grad if t.is_leaf else None
            if g is not None:
                grads.append((t, g))
        local_unnamed: dict[int, str] = {}

        def name_of(t) -> str:
            name = self._lookup(t)[0] or local_unnamed.get(id(t))
            if name is None:
                name = local_unnamed[id(t)] = f"{type(t).__name__}{self._next()}"
            return name

        def add(t, name: str, kind: str) -> None:
            if t.is_sparse:
                add(t._indices(), name + ".indices", kind)
                add(t._values(), name + ".values", kind)
                return
            try:
                storage = t.untyped_storage()
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
            except Exception:   # meta, fake or functional tensors: nothing allocated
                return
            dev = _device_name(t.device)
            if device is not None and dev != device:
                return
            if t.device.type == "meta":
                return
            d = report.devices.get(dev)
            if d is None:
                d = report.devices[dev] = DeviceStorage(dev)
            shape = tuple(str(s) if not isinstance(s, int) else s for s in t.shape) or (1,)
            key = (dev, ptr)
            shares = seen.get(key, "") if ptr else ""
            if not shares and ptr:
                seen[key] = name
            size = 0 if shares else nbytes
            d.rows.append(TensorRow(name, shape, str(t.dtype).replace("torch.", ""), size, kind, shares, ptr))
            d.by_kind[kind] += size

        grad_ids = {id(g) for _, g in grads}
        for t in tensors:
            if id(t) in grad_ids:
                continue
            kind = self._lookup(t)[1] or ("parameters" if isinstance(t, torch.nn.Parameter) else "other tensors")
            add(t, name_of(t), kind)
        for owner, g in grads:
            add(g, f"{name_of(owner)}.grad", "gradients")
        del tensors, grads
        for dev, d in report.devices.items():
            d.rows.sort(key=lambda r: (-r.bytes, r.name))
            if dev.startswith("cuda") and torch.cuda.is_initialized():
                d.allocated = torch.cuda.memory_allocated(int(dev.split(":")[1]))
        if engine_blocks is not None:
            engine_blocks(report)
        return report

    def add_optimizer_states(self, optimizer) -> None:
        kind = type(optimizer).__name__
        for param, states in optimizer.state.items():
            pname = self._lookup(param)[0]
            if pname is None:
                continue
            for key, value in states.items():
                if _is_tensor(value) and self._lookup(value)[0] is None:
                    self._name(value, f"{kind}.{pname}.{key}", "optimizer state")

    def report(self, verbose: bool = False, device=None) -> StorageReport:
        """Prints the storage report (all devices, or one) and returns it."""
        dev = None if device is None else _device_name(device) if hasattr(device, "type") else str(device)
        if dev == "cuda":
            dev = "cuda:0"
        report = self.collect(dev)
        print(report.text(verbose=verbose, device=dev), file=sys.stdout)
        return report


def _is_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and issubclass(type(value), torch.Tensor)
