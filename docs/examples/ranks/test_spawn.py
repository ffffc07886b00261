import pytest
import torch
import torch.multiprocessing as mp


def work(rank):
    x = torch.ones((rank + 1) << 18, dtype=torch.float32)   # rank 0: 1 MiB, rank 1: 2 MiB


@pytest.mark.cpu_memory(max="1.5M")
def test_spawn():
    mp.spawn(work, nprocs=2)
