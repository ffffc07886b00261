import os

import pytest
import torch

MiB = 2**20
GROW = os.environ.get("GROW") == "1"      # the change under review: GROW=1 pytest ...
EXTRA = (12 if GROW else 4) * MiB


@pytest.mark.cpu_memory
def test_grows():
    a = torch.empty(16 * MiB, dtype=torch.uint8)
    b = torch.empty(EXTRA, dtype=torch.uint8)


class Keeps(torch.nn.Module):
    def forward(self, x):
        e = torch.exp(x)              # kept for the backward: an activation
        if GROW:
            e = torch.exp(e)
        return e


@pytest.mark.cpu_memory
def test_step():
    x = torch.randn(MiB // 4, requires_grad=True)       # 1 MiB
    Keeps()(x).sum().backward()


@pytest.mark.cpu_memory
def test_stays():
    x = torch.ones(2 * MiB, dtype=torch.uint8)
    x.add_(1)


@pytest.mark.cpu_memory
def test_tokenize():
    ids = torch.arange(MiB // 8)
    ids.mul_(2)
