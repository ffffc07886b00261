"""What a verdict finds: each kind of finding is a type here, and each
carries its own key (``"cuda:0 max"``, ``"cpu leaks"``, ``"cuda:0 baseline"``
...), the name under which a test's result lists what memlab failed it for
or warned of (``failed_by_memlab``, ``warned`` in the JSON report).  Facts
only: the words for them are in :mod:`.messages`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.attribution import Frame


# -- budgets ------------------------------------------------------------------
@dataclass(frozen=True)
class Exceeded:
    """One figure over one budget."""

    device: str
    what: str          # "peak", "total peak", "reserved peak"
    value: int
    budget_name: str   # "max", "max_total", "max_reserved", "limit"
    budget: int
    process: str = ""  # a child process of the test ("rank 1"); "" the test's own

    @property
    def key(self) -> str:
        own = f"{self.device} {self.budget_name}"
        return f"{own} [{self.process}]" if self.process else own



# -- leaks --------------------------------------------------------------------
@dataclass
class LeakedTensor:
    """A Python tensor living in a leaked block."""

    shape: tuple
    dtype: str
    device: str
    bytes: int                 # its storage's bytes in the leaked blocks
    holders: list[str] = field(default_factory=list)   # reference paths from roots
    graph: str = ""            # "retains an autograd graph (grad_fn=...)"
    requires_grad: bool = False

    @property
    def name(self) -> str:
        """The last step of its first holder's path, where there is one."""
        return self.holders[0] if self.holders else ""

    def describe(self) -> str:
        # a tuple as Python writes it: (8388608,) is a shape, (8388608) reads as a number
        return f"tensor {tuple(int(s) for s in self.shape)} {self.dtype}"


@dataclass
class LeakSite:
    """Leaked blocks that one user call chain allocated."""

    chain: list[Frame]
    bytes: int = 0
    blocks: int = 0
    tensors: list[LeakedTensor] = field(default_factory=list)
    unowned: int = 0           # bytes no Python tensor owns, held by a leaked tensor's autograd graph
    outside: int = 0           # bytes no Python tensor owns or retains: a library's (first use)


@dataclass
class Leak:
    """One device's leak after one test's teardown."""

    device: str
    bytes: int
    allowed: int
    sites: list[LeakSite] = field(default_factory=list)
    note: str = ""             # e.g. why holders are incomplete
    outside: int = 0           # bytes left out as a library's (LeakSite.outside)
    outside_sites: list[LeakSite] = field(default_factory=list)   # where those were allocated

    @property
    def key(self) -> str:
        return f"{self.device} leaks"



@dataclass(frozen=True)
class Growth:
    """--memlab-leak-repeat: what each repetition of the test's call kept
    on one device, that every repetition kept more."""

    device: str
    kept: tuple    # bytes kept by each repetition

    @property
    def key(self) -> str:
        return f"{self.device} leak growth"


@dataclass
class Cache:
    """Tensors that suspects left in one holder whose entries are keyed (a
    dict filled on first use, an attribute, a closure's variable): memory
    kept once, not grown by each test that runs, reported once."""

    device: str
    holder: str                  # the holder's root: "module m, global _CACHE"
    bytes: int = 0
    tests: list = field(default_factory=list)    # node ids, the one that filled it first

    @property
    def key(self) -> str:
        return f"{self.device} cache"


# -- the baseline -------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """One device's own peak against its baseline entry."""

    device: str
    old: int
    new: int
    allowed: int
    tolerance: str
    path: str
    process: str = ""  # a rank of the test ("rank 1"); "" the test's own
    phase: str = ""    # a phase's own peak ("backward"); "" the test's own peak

    @property
    def kind(self) -> str:
        if self.new - self.old > self.allowed:
            return "regressed"
        if self.old - self.new > self.allowed:
            return "improved"
        return "same"

    @property
    def key(self) -> str:
        what = f"{self.device} {self.phase}" if self.phase else self.device
        own = f"{what} baseline" if self.kind == "regressed" else f"{what} improvement"
        return f"{own} [{self.process}]" if self.process else own


def compare(device: str, old: int, new: int, tolerance, path) -> Change:
    return Change(device, old, new, tolerance.allowed(old), tolerance.text, str(path))


