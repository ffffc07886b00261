"""A pytest plugin for bench/bench_baseline_order.py: keeps the I-th of N
consecutive parts of the selected tests (``-p memlab_shard`` with
``MEMLAB_SHARD=I/N``, bench/ on the path), so that N serial processes run a
selection side by side; ``MEMLAB_SHARD_REVERSE=1`` runs its part in reverse
order.  A part is taken after every other plugin has selected (``-k``), in
collection order, so a part holds the same tests written and compared."""

import os

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    result = yield
    shard = os.environ.get("MEMLAB_SHARD")
    if shard:
        i, n = (int(x) for x in shard.split("/"))
        size = -(-len(items) // n)
        keep = items[i * size:(i + 1) * size]
        dropped = items[:i * size] + items[(i + 1) * size:]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    if os.environ.get("MEMLAB_SHARD_REVERSE") == "1":
        items.reverse()
    return result
