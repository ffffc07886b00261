"""pytorch_memlab's README example for its LineProfiler, on the CPU:
python line_profile.py"""

import torch

from pytest_memlab import LineProfiler


def inner():
    torch.nn.Linear(100, 100)


def outer():
    linear = torch.nn.Linear(100, 100)
    linear2 = torch.nn.Linear(100, 100)
    inner()


if __name__ == "__main__":
    with LineProfiler(outer, inner, target_gpu="cpu") as prof:
        outer()
    prof.print_stats()
