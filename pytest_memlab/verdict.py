"""Verdicts: which budgets a test's figures exceed.  Facts only; the words
for them are in :mod:`pytest_memlab.text`."""

from __future__ import annotations

from dataclasses import dataclass

# (what the figure is called, DeviceFigures field, budget name)
BUDGETS = (
    ("peak", "peak", "max"),
    ("total peak", "peak_total", "max_total"),
    ("reserved peak", "reserved_peak", "max_reserved"),
)


@dataclass(frozen=True)
class Exceeded:
    """One figure over one budget."""

    device: str
    what: str          # "peak", "total peak", "reserved peak"
    value: int
    budget_name: str   # "max", "max_total", "max_reserved", "limit"
    budget: int

    @property
    def key(self) -> str:
        return f"{self.device} {self.budget_name}"


def exceeded(device: str, figures, spec) -> list[Exceeded]:
    """The budgets of spec that figures exceed (a budget holds at <=)."""
    out = []
    if not figures.measured:
        return out
    for what, field, name in BUDGETS:
        budget = getattr(spec, name, None)
        value = getattr(figures, field)
        if budget is not None and value is not None and value > budget:
            out.append(Exceeded(device, what, value, name, budget))
    return out


def has_budget(spec) -> bool:
    return any(getattr(spec, name, None) is not None for _, _, name in BUDGETS)
