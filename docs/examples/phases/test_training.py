import pytest
import torch

MiB = 2**20


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))


@pytest.mark.cpu_memory(max="20M")
def test_step(memlab):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(1024, 512)
    out = model(x)
    memlab.mark("after forward")
    loss = out.square().mean()
    loss.backward()
    opt.step()


class Heavy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        scratch = torch.empty(5 * MiB, dtype=torch.uint8)   # the backward's temporary
        scratch.fill_(1)
        return grad * 1


@pytest.mark.cpu_memory(backward="4M")
def test_backward_budget():
    x = torch.ones(MiB // 4, requires_grad=True)    # 1 MiB
    y = Heavy.apply(x * 2)
    y.sum().backward()


@pytest.mark.cpu_memory(activations="4M")
def test_activations_budget():
    model = mlp()
    x = torch.randn(1024, 512)
    model(x).square().mean().backward()
