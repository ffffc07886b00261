"""A pytest plugin for bench/bench_baseline_order.py: runs the collected
tests in reverse order (``-p memlab_reverse_order``, with bench/ on the
path)."""


def pytest_collection_modifyitems(items):
    items.reverse()
