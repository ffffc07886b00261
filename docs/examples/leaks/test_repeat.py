import pytest
import torch

_HISTORY = []


@pytest.mark.cpu_memory(leaks="64K")   # one call keeps 4 KiB: within its allowance
def test_keeps_a_little_every_call():
    _HISTORY.append(torch.ones(1024))
