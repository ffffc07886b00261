"""MemReporter on a small model and its optimizer: python reporter.py"""

import torch

from pytest_memlab import MemReporter

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = torch.optim.Adam(model.parameters())
model(torch.randn(64, 256)).sum().backward()
optimizer.step()

reporter = MemReporter(model)          # names from parameters and buffers
reporter.add_optimizer(optimizer)      # ... and optimizer state
reporter.report(device="cpu")
