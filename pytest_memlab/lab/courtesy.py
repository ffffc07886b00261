"""Courtesy: give the GPU back for a while (to a colleague's job, to an
evaluation that needs the room) and take it again.

``yield_memory()`` moves every CUDA tensor that Python reaches (parameters,
their gradients, optimizer state, plain tensors) to the CPU in place
(``tensor.data = ...``: the same Python objects, so modules and optimizers
keep working) and empties the caching allocator; ``restore()`` moves each
back to the device it came from.  pytorch_memlab's interface, and a context
manager.
"""

from __future__ import annotations

from ..engine.heap import tensor_objects


class Courtesy:
    def __init__(self):
        self.moved: list = []       # (tensor, device): the tensors yielded, in order

    def yield_memory(self) -> None:
        """Moves every CUDA tensor Python reaches to the CPU, then frees the
        CUDA cache."""
        import torch

        seen = {id(t) for t, _ in self.moved}
        for t in tensor_objects(torch):
            for tensor in (t, t._grad if t.is_leaf else None):
                if tensor is None or id(tensor) in seen or tensor.device.type != "cuda" or tensor.is_sparse:
                    continue
                seen.add(id(tensor))
                self.moved.append((tensor, tensor.device))
                with torch.no_grad():
                    tensor.data = tensor.data.to("cpu")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def restore(self) -> None:
        """Moves what yield_memory moved back to its device."""
        import torch

        with torch.no_grad():
            for tensor, device in self.moved:
                tensor.data = tensor.data.to(device)
        self.moved.clear()

    def __enter__(self) -> "Courtesy":
        self.yield_memory()
        return self

    def __exit__(self, *exc) -> bool:
        self.restore()
        return False
