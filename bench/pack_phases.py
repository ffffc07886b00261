"""A pytest plugin for the packing bench (``-p pack_phases``, with bench/
on the path): on the controller, when each phase of an -n session came,
written as JSON to $PACK_PHASES at the end.  It tells a packed run's extra
time apart from the tests: the workers' start and collection, the tests
from the first report to the last, the workers' end, the controller's
end."""

import json
import os
import time

import pytest

_marks: dict[str, float] = {}


def _controller(config) -> bool:
    return not hasattr(config, "workerinput") and bool(os.environ.get("PACK_PHASES"))


def pytest_configure(config):
    if _controller(config):
        _marks["configure"] = time.time()


def pytest_runtest_logreport(report):
    if _marks:
        now = time.time()
        _marks.setdefault("first report", now)
        _marks["last report"] = now


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    if _marks:
        _marks["last worker down"] = time.time()


def pytest_sessionfinish(session):
    if _marks:
        _marks["session finish"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _marks:
        _marks["unconfigure"] = time.time()
        with open(os.environ["PACK_PHASES"], "w") as f:
            json.dump(_marks, f)
