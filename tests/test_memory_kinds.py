"""Memory by kind (issue 34), on CPU tensors through pytester: the bytes
live at a test's own peak as parameters, buffers, gradients, optimizer
state, inputs, activations, temporaries and other, each checked against
the tensors' sizes by hand; they add up to the own peak; the JSON report
keeps them and a budget failure says them; a test without phases has
none."""

import json

import pytest

from conftest import requires_torch

pytestmark = requires_torch

MiB = 2**20

SUITE = """
import pytest, torch
MiB = 2**20

class Keeps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(MiB // 4))                      # 1 MiB parameter
        self.register_buffer("scale", torch.full((MiB // 8,), 2.0))           # 0.5 MiB buffer

    def forward(self, x):
        scratch = torch.empty(3 * MiB, dtype=torch.uint8)   # made and freed in the forward
        scratch.fill_(1)
        h = x * self.w                                      # freed in the forward: exp keeps its result
        e = torch.exp(h)                                    # kept for the backward: an activation
        return e.sum()

@pytest.mark.cpu_memory(max="{max}")
def test_train():
    torch.manual_seed(0)
    model = Keeps()
    opt = torch.optim.Adam(model.parameters())
    x = torch.ones(MiB // 4)                                # 1 MiB input
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        loss = model(x)
        loss.backward()
        opt.step()

@pytest.mark.cpu_memory
def test_no_phases():
    a = torch.ones(MiB // 4)
    b = a * 2
"""


def run_suite(pytester, max_="100M"):
    pytester.makepyfile(test_kinds=SUITE.replace("{max}", max_))
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider",
                                           "--memlab-report=json:r.json")
    report = json.loads((pytester.path / "r.json").read_text())
    devices = {t["nodeid"].split("::")[-1]: t["devices"]["cpu"] for t in report["tests"]}
    return result, devices


def test_kinds_at_the_peak_are_the_tensors_sizes_and_add_up_to_the_peak(pytester):
    result, devices = run_suite(pytester)
    result.assert_outcomes(passed=2)
    train = devices["test_train"]
    kinds = train["kinds"]
    assert sum(kinds.values()) == train["peak"]
    # The peak is the second forward's: the scratch, h and e live together,
    # with the model, Adam's state and the input (nothing keeps a gradient:
    # zero_grad(set_to_none=True) came before it).
    assert train["phases"]["forward"] == train["peak"]
    assert kinds["parameter"] == 1 * MiB
    assert kinds["buffer"] == MiB // 2
    assert kinds["gradient"] == 0
    # exp_avg and exp_avg_sq, 1 MiB each, and the step count (a float32 scalar)
    assert kinds["optimizer_state"] == 2 * MiB + 4
    assert kinds["input"] == 1 * MiB
    # scratch and h (and torch's scalar wrappers, a few bytes)
    assert 4 * MiB <= kinds["temporary"] <= 4 * MiB + 16
    # e, and the forward's 4-byte outputs (this one's, the first step's loss still held)
    assert 1 * MiB <= kinds["activation"] <= 1 * MiB + 16
    assert kinds["other"] <= 16
    assert devices["test_no_phases"]["kinds"] is None


def test_a_budget_failure_says_the_kinds_at_the_peak(pytester):
    result, devices = run_suite(pytester, max_="4M")
    result.assert_outcomes(passed=1, failed=1)
    from pytest_memlab.measuring.memory_kinds import KIND_WORDS
    from pytest_memlab.sizes import format_size

    kinds = devices["test_train"]["kinds"]
    assert sum(kinds.values()) == devices["test_train"]["peak"]
    ranked = sorted(((size, kind) for kind, size in kinds.items() if size), key=lambda sk: (-sk[0], sk[1]))
    first_size, first = ranked[0]
    assert first == "temporary"
    text = result.stdout.str()
    section = text[text.index("cpu peak"):text.index("exactly")]
    assert (f"at the peak, by kind: {KIND_WORDS[first]} {format_size(first_size)} "
            f"({100 * first_size / sum(kinds.values()):.0f}%), ") in section
    for size, kind in ranked[1:]:
        assert f"{KIND_WORDS[kind]} {format_size(size)}" in section
