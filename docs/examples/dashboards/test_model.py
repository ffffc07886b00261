import pytest
import torch


@pytest.mark.cpu_memory(max="8M")
def test_forward():
    x = torch.empty(3 * 2**20, dtype=torch.uint8)
    x.fill_(1)
