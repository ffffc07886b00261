"""Budgets per phase of a training step (forward=, backward=, step= on a
marker), on CPU tensors through pytester: each phase's own peak in the JSON
report and the baseline, a phase over its budget failing at the call with
the phase and the line, the peaks the same whatever ran before (what a test
keeps is left out, as from its own peak), and bad keys as usage errors."""

import json

import pytest

from conftest import requires_cuda, requires_torch

pytestmark = requires_torch

MiB = 2**20

SUITE = """
import pytest, torch
MiB = 2**20
_CACHE = {}

class Doubling(torch.nn.Module):
    def forward(self, x):
        scratch = torch.empty(3 * MiB, dtype=torch.uint8)   # the forward's temporary
        scratch.fill_(1)
        return x * 2

class Caching(torch.nn.Module):
    def forward(self, x):
        if "table" not in _CACHE:                             # filled by the first test to get here
            _CACHE["table"] = torch.ones(2 * MiB, dtype=torch.uint8)
        return x * 2

class Heavy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        scratch = torch.empty(5 * MiB, dtype=torch.uint8)   # the backward's temporary
        scratch.fill_(1)
        return grad * 1

@pytest.mark.cpu_memory(forward="{forward}", backward="{backward}", step="1M")
def test_train():
    x = torch.ones(MiB // 4, requires_grad=True)    # 1 MiB
    y = Doubling()(x)
    z = Heavy.apply(y)
    z.sum().backward()

@pytest.mark.cpu_memory
def test_forward_only():
    x = torch.ones(MiB // 4)
    y = Doubling()(x)

@pytest.mark.cpu_memory(leaks=None)
def test_fills_the_cache():
    x = torch.ones(MiB // 4)
    y = Caching()(x)

@pytest.mark.cpu_memory(leaks=None)
def test_finds_the_cache():
    x = torch.ones(MiB // 4)
    y = Caching()(x)
"""


def _run(inner, *args, forward="6M", backward="4M"):
    inner.makepyfile(test_suite=SUITE.replace("{forward}", forward).replace("{backward}", backward))
    result = inner.runpytest_inprocess("--memlab-json=r.json", "-p", "no:randomly", *args)
    report = json.loads((inner.path / "r.json").read_text())
    return result, {t["nodeid"].split("::")[1]: t["devices"]["cpu"] for t in report["tests"]}


def test_a_backward_over_its_budget_fails_at_the_call_naming_the_phase_and_line(inner):
    result, cpu = _run(inner)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_train _*",
        "cpu backward peak 9.0 MiB exceeds backward=4.0 MiB by 5.0 MiB",
        "  allocated at test_suite.py:* Heavy.backward: return grad * 1",
        "            <- test_suite.py:* test_train: z.sum().backward()",
        "  the phases' peaks: forward 5.0 MiB, backward 9.0 MiB; the test's own peak 9.0 MiB",
    ])
    out = result.stdout.str()
    assert "forward peak" not in out and "step peak" not in out   # within budget, or never ran
    train = cpu["test_train"]
    assert train["phase_max"] == {"forward": 6 * MiB, "backward": 4 * MiB, "step": MiB}
    assert set(train["phases"]) == {"forward", "backward"}    # no optimizer step ran
    # the backward held x, y, z (1 MiB each), its 5 MiB temporary and the
    # 1 MiB gradient it returned at once: the test's own peak, reached there
    assert train["phases"]["backward"] == train["peak"]
    assert 9 * MiB <= train["phases"]["backward"] < 9 * MiB + 1024
    # the forward: x, its 3 MiB temporary and its 1 MiB output, at most
    assert 5 * MiB <= train["phases"]["forward"] < 5 * MiB + 1024
    # a test that only runs the forward: its own peak is the forward's
    only = cpu["test_forward_only"]
    assert only["phases"] == {"forward": only["peak"]}
    assert only["peak"] == train["phases"]["forward"]


NESTED = """
import sys
import pytest, torch
MiB = 2**20

class Inner(torch.nn.Module):
    def forward(self, x):
        scratch = torch.empty(3 * MiB, dtype=torch.uint8)   # freed at its return
        scratch.fill_(1)
        sys.setprofile(None)    # (on 3.11: turns the tracing mode on in this frame, which its callers inherit)
        return x * 2

class Middle(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x)

class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.middle = Middle()

    def forward(self, x):
        y = self.middle(x)                                   # two modules deep, ended before the next line
        scratch = torch.empty(4 * MiB, dtype=torch.uint8)   # still the forward's
        scratch.fill_(1)
        return y + 1

@pytest.mark.cpu_memory
def test_nested():
    x = torch.ones(MiB // 4)                                 # 1 MiB
    out = Outer()(x)
    after = torch.empty(8 * MiB, dtype=torch.uint8)          # after the forward
    after.fill_(1)
"""


def test_a_forward_through_nested_modules_is_one_phase_from_its_outermost_call_to_its_end(inner):
    """A module's forward calls its children's: only the outermost call
    starts and ends the forward phase (3.11's frame hook keeps the nested
    calls' depth without their events, csrc/tracer_settrace.c, even where
    a callee turns the tracing mode back on and the nested call's return is
    heard after all).  The phase goes on after the nested calls end (the
    outer forward's 4 MiB scratch, allocated after them, is its peak) and
    ends with the outermost (the 8 MiB allocated after it is the test's,
    not the forward's)."""
    inner.makepyfile(test_nested=NESTED)
    result = inner.runpytest_inprocess("--memlab-json=r.json", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    cpu = json.loads((inner.path / "r.json").read_text())["tests"][0]["devices"]["cpu"]
    # x, y, the scratch and the output: 7 MiB (the inner forward's moment held 5)
    assert 7 * MiB <= cpu["phases"]["forward"] < 7 * MiB + 1024
    assert set(cpu["phases"]) == {"forward"}
    # x, the output and what came after the forward
    assert 10 * MiB <= cpu["peak"] < 10 * MiB + 1024


RAISING_AND_PROFILED = """
import sys, pytest, torch
MiB = 2**20

class Failing(torch.nn.Module):
    def forward(self, x):
        scratch = torch.empty(3 * MiB, dtype=torch.uint8)
        scratch.fill_(1)
        raise ValueError("the forward fails")

class Profiled(torch.nn.Module):
    def forward(self, x):
        sys.setprofile(None)      # the tracing mode back on here and in its callers (3.11)
        scratch = torch.empty(2 * MiB, dtype=torch.uint8)
        scratch.fill_(1)
        return x * 2

@pytest.mark.cpu_memory
def test_raising():
    x = torch.ones(MiB // 4)                                 # 1 MiB
    try:
        Failing()(x)
    except ValueError:
        pass
    after = torch.empty(6 * MiB, dtype=torch.uint8)          # after the forward
    after.fill_(1)

@pytest.mark.cpu_memory
def test_profiled():
    x = torch.ones(MiB // 4)
    y = Profiled()(x)
    after = torch.empty(6 * MiB, dtype=torch.uint8)          # after the forward
    after.fill_(1)
"""


def test_a_forward_ends_its_phase_where_it_raises_and_once_where_it_turns_the_tracing_mode_on(inner):
    """3.11's frame hook hears a phase function's start and end around its
    evaluation, the body run without the tracing mode
    (csrc/tracer_settrace.c, eval_hook): a forward that raises ends its
    phase as it leaves (the 6 MiB allocated after it is the test's), and
    one that turns the tracing mode back on (a profile function set, even
    to None) has its end heard by the trace function first, and ended
    once."""
    inner.makepyfile(test_raising=RAISING_AND_PROFILED)
    result = inner.runpytest_inprocess("--memlab-json=r.json", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    tests = {t["nodeid"].split("::")[1]: t["devices"]["cpu"]
             for t in json.loads((inner.path / "r.json").read_text())["tests"]}
    # x and the failing forward's scratch
    assert 4 * MiB <= tests["test_raising"]["phases"]["forward"] < 4 * MiB + 1024
    assert 7 * MiB <= tests["test_raising"]["peak"] < 7 * MiB + 1024
    # x, the scratch and the output
    assert 4 * MiB <= tests["test_profiled"]["phases"]["forward"] < 4 * MiB + 1024
    assert 8 * MiB <= tests["test_profiled"]["peak"] < 8 * MiB + 1024


def test_a_phase_within_its_budget_passes(inner):
    result, cpu = _run(inner, backward="10M")
    result.assert_outcomes(passed=4)


def test_a_phases_peak_leaves_out_what_the_test_kept_whatever_ran_before(inner):
    """The cache that the first forward fills is kept: the phase's peak
    leaves it out, as the own peak does, so that both tests show the same
    forward peak in either order."""
    _, first = _run(inner, "-k", "cache")
    inner.makepyfile(test_suite=SUITE.replace("{forward}", "6M").replace("{backward}", "4M")
                     .replace("def test_fills_the_cache", "def test_zz_fills").replace("def test_finds_the_cache",
                                                                                      "def test_aa_finds"))
    inner.runpytest_inprocess("--memlab-json=r2.json", "-p", "no:randomly", "-k", "fills or finds")
    other = {t["nodeid"].split("::")[1]: t["devices"]["cpu"]
             for t in json.loads((inner.path / "r2.json").read_text())["tests"]}
    peaks = {first["test_fills_the_cache"]["phases"]["forward"], first["test_finds_the_cache"]["phases"]["forward"],
             other["test_zz_fills"]["phases"]["forward"], other["test_aa_finds"]["phases"]["forward"]}
    assert len(peaks) == 1, peaks
    assert 2 * MiB <= peaks.pop() < 2 * MiB + 1024     # x and its output; never the 2 MiB table


def test_the_baseline_keeps_each_phases_peak(inner):
    inner.makepyfile(test_suite=SUITE.replace("{forward}", "6M").replace("{backward}", "10M"))
    inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-update-baseline", "-p", "no:randomly",
                              "-k", "train").assert_outcomes(passed=1)
    data = json.loads((inner.path / "bl.json").read_text())
    tests = data["tests"] if "tests" in data else next(iter(data["environments"].values()))["tests"]
    entry = tests["test_suite.py::test_train"]["cpu"]
    assert set(entry["phases"]) == {"forward", "backward"}
    assert 9 * MiB <= entry["phases"]["backward"] < 9 * MiB + 1024
    # read back and compared: nothing changed
    inner.runpytest_inprocess("--memlab-baseline=bl.json", "-p", "no:randomly", "-k", "train").assert_outcomes(
        passed=1)


@pytest.mark.parametrize("marker, message", [
    ('cpu_memory(backward="1X")', "cpu_memory(backward='1X'): *"),
    ("cuda_memory(step=-5)", "cuda_memory(step=-5): -5 is negative; a size must be >= 0"),
    ('cpu_memory(optimizer="1G")', "*cpu_memory got unknown keyword 'optimizer' (known: *forward, backward, step)"),
])
def test_a_bad_phase_budget_is_a_usage_error(inner, marker, message):
    inner.makepyfile(test_bad=f"import pytest\n\n@pytest.mark.{marker}\ndef test_x():\n    pass\n")
    result = inner.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()   # as any bad marker: at collection
    result.stdout.fnmatch_lines(["pytest-memlab: bad memory marker", "  test_bad.py::test_x: " + message])


@requires_cuda
def test_phase_budgets_on_cuda_count_autograds_threads(inner):
    """On CUDA the backward allocates on autograd's device thread: its
    blocks count for the backward that the test's thread runs."""
    suite = (SUITE.replace("{forward}", "6M").replace("{backward}", "4M")
             .replace("cpu_memory", "cuda_memory")
             .replace("torch.ones(MiB // 4", 'torch.ones(MiB // 4, device="cuda"')
             .replace("torch.empty(3 * MiB, dtype=torch.uint8)", 'torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")')
             .replace("torch.empty(5 * MiB, dtype=torch.uint8)", 'torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")')
             .replace("torch.ones(2 * MiB, dtype=torch.uint8)", 'torch.ones(2 * MiB, dtype=torch.uint8, device="cuda")'))
    inner.makepyfile(test_suite=suite)
    result = inner.runpytest_inprocess("--memlab-json=r.json", "-p", "no:randomly", "-k", "train or forward_only")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["cuda:0 backward peak 9.0 MiB exceeds backward=4.0 MiB by 5.0 MiB",
                                 "  allocated at test_suite.py:* Heavy.backward: return grad * 1"])
    report = json.loads((inner.path / "r.json").read_text())
    cuda = {t["nodeid"].split("::")[1]: t["devices"]["cuda:0"] for t in report["tests"]}
    train = cuda["test_train"]
    assert train["phases"]["backward"] == train["peak"]
    assert 9 * MiB <= train["phases"]["backward"] < 9 * MiB + 4096
    assert 5 * MiB <= train["phases"]["forward"] < 5 * MiB + 4096
    assert cuda["test_forward_only"]["phases"] == {"forward": cuda["test_forward_only"]["peak"]}


def test_a_phase_budget_the_tracer_cannot_hear_is_said_not_judged(inner):
    """With line attribution off (another trace function on 3.11, both of
    memlab's sys.monitoring ids taken on 3.12+), no phase is heard: the
    test says its phase budgets were not judged, and passes on its own."""
    inner.makeconftest("""
import sys

def pytest_configure(config):
    if sys.version_info >= (3, 12):
        for tool in (3, 4):
            sys.monitoring.use_tool_id(tool, f"other-{tool}")
    else:
        sys.settrace(lambda *a: None)

def pytest_unconfigure(config):
    if sys.version_info >= (3, 12):
        for tool in (3, 4):
            sys.monitoring.free_tool_id(tool)
    else:
        sys.settrace(None)
""")
    inner.makepyfile(test_suite=SUITE.replace("{forward}", "1K").replace("{backward}", "1K"))
    # a fresh process: this one's memlab holds its sys.monitoring id already
    result = inner.runpytest_subprocess("-p", "no:randomly", "-k", "train", "-rA")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["cpu phase budgets not judged: the phases are heard by the tracer, which was off (*"])
