"""Records the allocator event stream of a small transformer training loop
into fixtures/events/, for the engine replay benchmark and the C tests.

    python bench/record_events.py [cpu|cuda] [OUT]
"""

import sys
from pathlib import Path

import torch

from pytest_memlab import _engine as engine
from pytest_memlab.engine.backend import core
from pytest_memlab.measuring.measurement import Measurement


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    out = Path(sys.argv[2] if len(sys.argv) > 2 else f"fixtures/events/{device}_transformer.bin")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2).to(device)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 32, 128, device=device)
    m = Measurement(core(), ["cuda:0" if device == "cuda" else "cpu"])
    m.begin()
    engine.record_start(2_000_000)
    for _ in range(20):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    data = engine.record_stop()
    m.end()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    print(f"{len(data) // engine.EVENT_SIZE} events -> {out}")


if __name__ == "__main__":
    main()
