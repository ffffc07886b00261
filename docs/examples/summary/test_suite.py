import os

import pytest
import torch

MiB = 2**20
GROW = MiB if os.environ.get("GROW") == "1" else 0    # the change under review: GROW=1 pytest ...
_TABLE = {}
_GROWS = []


def constant(dtype):
    if dtype not in _TABLE:
        _TABLE[dtype] = torch.ones(1024, dtype=dtype)
    return _TABLE[dtype]


@pytest.mark.cpu_memory
def test_model():
    weights = torch.empty(2 * MiB + GROW, dtype=torch.uint8)
    weights.fill_(1)


@pytest.mark.cpu_memory(max="1M")
def test_over():
    x = torch.empty(3 * MiB, dtype=torch.uint8)
    x.fill_(1)


@pytest.mark.cpu_memory
def test_keeps():
    _GROWS.append(torch.empty(MiB // 2, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float32, torch.float64])
def test_uses_the_cache(dtype):
    constant(dtype).sum()
