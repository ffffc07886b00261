"""The reporter lives in torch's thread-local profiler slot.  Torch reads that
slot as a ProfilerStateBase (profilerEnabled, getProfilerConfig, called by
every autograd.Function.apply); a reporter that is anything else is read
past its end.  These tests pin what torch must see there: no profiler while
memlab measures, torch.profiler still usable on top, and the slot empty again
once the measurement ends."""


import pytest

from conftest import MiB, requires_torch

pytestmark = requires_torch


@pytest.fixture(autouse=True)
def _profiler_hooks_balanced(core):
    """Each test leaves torch's profiler hooks as it found them: these call
    the engine's open and close directly (the bridge's own wrapping is not
    asked for), and a count of the hooks' users left off by one made a
    later measurement leave torch's start hook unwrapped ("Profiler is
    already enabled on this thread" under another order)."""
    before = core.bridge._hook_users
    yield
    assert core.bridge._hook_users == before


def _measure(core):
    from pytest_memlab.measuring.measurement import Measurement

    m = Measurement(core, ["cpu"], trace=False)
    m.begin()
    return m


def test_torch_sees_no_profiler_while_memlab_measures(core):
    import torch

    assert not core.bridge.installed()
    m = _measure(core)
    try:
        assert core.bridge.installed()
        assert torch.autograd._profiler_enabled() is False
        assert str(torch._C._autograd._profiler_type()).endswith("NONE")
        # Function.apply reads the profiler config on every call.
        x = torch.ones(4, requires_grad=True)
        y = torch.utils.checkpoint.checkpoint(torch.sin, x, use_reentrant=False)
        y.sum().backward()
        assert torch.equal(x.grad, torch.cos(torch.ones(4)))
    finally:
        m.end()
    assert not core.bridge.installed()


def test_the_slot_is_torchs_again_after_a_measurement(core):
    import torch

    m = _measure(core)
    m.end()
    assert not core.bridge.installed()
    assert torch.autograd._profiler_enabled() is False


def test_torch_profiler_runs_on_top_and_memlab_hears_again_after(core):
    import torch

    m = _measure(core)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            assert torch.autograd._profiler_enabled() is True
            torch.ones(8).sum()
        assert any("aten::ones" in e.name for e in prof.events())
        assert core.bridge.installed()  # ours again, under where the profiler was
        a = torch.empty(4 * MiB, dtype=torch.uint8)
        del a
        fig = m.figures("cpu")
        assert fig.peak >= 4 * MiB
    finally:
        m.end()
    assert not core.bridge.installed()


def test_nested_measurements_keep_the_reporter_until_the_outer_one_ends(core):
    outer = _measure(core)
    inner = _measure(core)
    inner.end()
    assert core.bridge.installed()
    outer.end()
    assert not core.bridge.installed()


def test_a_scope_closed_out_of_order_still_gives_the_slot_back(core):
    """engine.close undoes engine.open whole, the install and the device's
    reporting included, even when the scope is not the innermost: the
    ValueError names the scope and the slot is torch's again."""
    import pytest

    from pytest_memlab import _engine as engine

    outer, first = engine.open(0, False, -1, -1, False, 0)
    assert first
    inner, first = engine.open(0, False, -1, -1, False, 0)
    assert not first
    assert engine.bridge_depth() == 2
    with pytest.raises(ValueError, match=f"scope {outer} is not the innermost"):
        engine.close(0, outer)
    assert engine.bridge_depth() == 1 and core.bridge.installed()
    figures, last = engine.close(0, inner)
    assert last and figures["id"] == inner
    assert engine.bridge_depth() == 0 and not core.bridge.installed()
    engine.end(0, outer)   # the engine's own scope, left open above


def test_opening_a_scope_that_fails_undoes_the_install(core):
    import pytest

    from pytest_memlab import _engine as engine

    with pytest.raises(ValueError, match="out of range"):
        engine.open(99, False, -1, -1, False, 0)
    assert engine.bridge_depth() == 0 and not core.bridge.installed()
    opened = []
    try:
        with pytest.raises(RuntimeError, match="nested scopes"):
            for _ in range(engine.MAX_DEPTH + 1):
                opened.append(engine.open(0, False, -1, -1, False, 0)[0])
        assert engine.bridge_depth() == len(opened)
    finally:
        for scope in reversed(opened):
            engine.close(0, scope)
    assert engine.bridge_depth() == 0 and not core.bridge.installed()
