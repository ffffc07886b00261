"""One region measured as pytest-memlab measures a test, for the benches
that time it in-process (bench_overhead.py, bench_kinds.py): the
measurement opened as the plugin opens it, the tracer's window, and with
kinds the walk at each phase boundary (TestRun.begin) and the
classification a report reads (TestRun.end, memory_kinds.resolve)."""

from pytest_memlab.engine.meters import EngineMeter, leave_out_kept
from pytest_memlab.engine.tracing import tracing
from pytest_memlab.measuring.measurement import Measurement
from pytest_memlab.measuring.memory_kinds import KindWalk, defer, resolve


def measure(core, device: str, region, lines: bool = True, kinds: bool = False) -> dict:
    """Runs region() measured on device; returns the figures by device
    (with their kinds where kinds)."""
    m = Measurement(core, [device], trace=lines, timeline=True)
    m.begin()
    walk = None
    if kinds:
        walk = KindWalk({d: mt for d, mt in m.meters.items() if mt.__class__ is EngineMeter})
        tracing.phase_hook(walk)
    try:
        with m.window():   # before 3.12, the tracer runs only in such windows
            region()
    finally:
        if walk is not None:
            tracing.phase_hook(None)
            kept = {d: mt.kept() for d, mt in m.meters.items()}
        figures = m.end()
    if walk is not None:
        for d, mt in m.meters.items():
            leave_out_kept(figures[d], kept[d])
            defer(figures[d], walk, mt.slot, kept[d], *mt.take_alloc_log(), tracing.phases())
            assert resolve(figures[d]) is not None, figures[d].kinds_note
    return figures
