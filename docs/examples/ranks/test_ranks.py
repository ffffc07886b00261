import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MiB = 2**20
WIDE = int(os.environ.get("WIDE", "0"))   # the change under review: WIDE=2 makes rank 1 keep 2 MiB more


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x, extra):
        h = self.fc(x)
        if extra:
            keep = torch.ones(extra * MiB // 4, requires_grad=True)
            h = h * (keep.sum() / keep.numel())   # kept for the backward
        return h


def rank_main(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(512, 256)
    loss = model(x, WIDE if rank == 1 else 0).square().mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.cpu_memory(spread="1M")     # the ranks' own peaks at most 1 MiB apart
def test_train():
    mp.spawn(rank_main, args=(free_port(),), nprocs=2)
