"""Exports for the dashboards that teams keep benchmark history in, read as
they are (``--memlab-report=bmf:PATH``, ``--memlab-report=gab:PATH``):

- ``bmf``: Bencher's Metric Format (https://bencher.dev/docs/reference/
  bencher-metric-format): one benchmark per test (its node id), with a
  measure per device and quantity, ``memlab peak cpu`` and ``memlab leaked
  cpu`` (bytes); ``bencher run --adapter json --file PATH`` reads it.
- ``gab``: github-action-benchmark's ``customSmallerIsBetter`` input: a
  list of ``{name, unit, value, extra}``, one entry per test, device and
  quantity (``tool: customSmallerIsBetter`` in the action).

The quantities are the ones memlab judges: a device's own peak (what the
budget and the baseline hold) and what the test leaked after its teardown.
Only measured devices are exported; tests in node id order.  Where a test
ran child processes, the test's own figures are exported (each process's
are in the JSON report).
"""

from __future__ import annotations

from ..sizes import format_size
from .json_report import write_json


def _figures(results: dict):
    """(nodeid, device, figures) for every measured device, in order."""
    for nodeid in sorted(results):
        for device, fig in sorted(results[nodeid].devices.items()):
            if fig.measured and fig.peak is not None:
                yield nodeid, device, fig


def bmf(results: dict) -> dict:
    out: dict = {}
    for nodeid, device, fig in _figures(results):
        measures = out.setdefault(nodeid, {})
        measures[f"memlab peak {device}"] = {"value": int(fig.peak)}
        measures[f"memlab leaked {device}"] = {"value": int(fig.leaked or 0)}
    return out


def gab(results: dict) -> list:
    out = []
    for nodeid, device, fig in _figures(results):
        budget = f"; max {format_size(fig.max)}" if fig.max is not None else ""
        out.append({"name": f"{nodeid} [{device}] peak", "unit": "bytes", "value": int(fig.peak),
                    "extra": f"own peak {format_size(fig.peak)}{budget}"})
        out.append({"name": f"{nodeid} [{device}] leaked", "unit": "bytes", "value": int(fig.leaked or 0),
                    "extra": f"left after teardown {format_size(fig.leaked or 0)}"})
    return out


def write_bmf(path, results: dict, *_context) -> None:
    write_json(path, bmf(results))


def write_gab(path, results: dict, *_context) -> None:
    write_json(path, gab(results))
