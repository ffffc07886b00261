import pytest
import torch

GiB = 2**30
_KEEP = []


def test_b_leaves_a_tensor():                       # unmarked: measured under --memlab
    _KEEP.append(torch.ones(GiB // 16, dtype=torch.uint8))


@pytest.mark.cpu_memory
def test_c_asks_too_much():
    mine = torch.ones(GiB // 32, dtype=torch.uint8)
    more = torch.empty(2**50, dtype=torch.uint8)     # a petabyte: no machine serves it
