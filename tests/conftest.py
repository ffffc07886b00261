import os

import pytest

pytest_plugins = ["pytester"]

MiB = 2**20


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def has_cuda() -> bool:
    if not has_torch():
        return False
    import torch

    return torch.cuda.is_available()


requires_torch = pytest.mark.skipif(not has_torch(), reason="needs torch")

if has_torch():
    # pytester's in-process runs put sys.modules back as they found it; a
    # module torch imports lazily the first time inside one (dynamo, which
    # optimizers and checkpoint reach) would be imported again by the next
    # and register its operator library twice.  Imported once, here.
    import torch._dynamo  # noqa: F401
requires_cuda = pytest.mark.skipif(not has_cuda(), reason="needs CUDA")


@pytest.fixture
def inner(pytester):
    """A pytester whose runs see this checkout's environment (MEMLAB_CORE)."""
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\n")
    os.environ.setdefault("MEMLAB_CORE", os.environ.get("MEMLAB_CORE", "auto"))
    return pytester


def line_no(path, text: str) -> int:
    """The number of the first line of a written file that contains text."""
    for i, line in enumerate(open(path).read().splitlines(), 1):
        if text in line:
            return i
    raise AssertionError(f"{text!r} not in {path}")


@pytest.fixture
def core():
    """The chosen backend, which must be the torch bridge."""
    from pytest_memlab.engine.backend import BRIDGE, core

    c = core()
    if c.name != BRIDGE:
        pytest.fail(f"the torch bridge is not in use: {c.reason}")
    return c
