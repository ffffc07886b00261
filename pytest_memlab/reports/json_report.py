"""The JSON report (``--memlab-json=PATH``, ``--memlab-report=json:PATH``):
every measured test's figures, budgets, baseline comparison and heaviest
lines, for dashboards.  Versioned; its schema ships beside this module
(``report.schema.json``) and the tests validate against it.  Stable: keys
sorted, tests in node id order, written atomically like the baseline.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic_files import write_atomic
from ..figures import across

FORMAT = "pytest-memlab-report"
VERSION = 2   # 2: a device's own peak budget is "max", as in the marker (1 said "budget")
SCHEMA = Path(__file__).with_name("report.schema.json")


def _device(d) -> dict:
    return {
        "device": d.device,
        "name": d.name or d.device,
        "gpu": d.gpu or None,
        "measured": d.measured,
        "reason": d.reason or None,
        "peak": d.peak,
        "peak_total": d.peak_total,
        "reserved_peak": d.reserved_peak,
        "leaked": d.leaked,
        "kept": d.kept,
        "first_use": d.first_use,
        "first_use_held": list(d.first_use_held),
        "peak_with_kept": d.peak_with_kept,
        "sites": list(d.sites),
        "site_changes": list(d.site_changes),
        "max": d.max,
        "max_total": d.max_total,
        "max_reserved": d.max_reserved,
        "phases": dict(d.phases),
        "phase_max": dict(d.phase_max),
        "kinds": dict(d.kinds) if d.kinds is not None else None,
        "kinds_note": d.kinds_note or None,
        "kind_max": dict(d.kind_max),
        "phase_kinds": dict(d.phase_kinds),
        "baseline_peak": d.baseline_peak,
        "baseline": d.baseline or None,
        "top": [{"file": t.get("file"), "line": t.get("line"), "function": t.get("function"),
                 "bytes": t.get("bytes"), "peak_total": t.get("peak_total")} for t in d.top],
        "detail": d.detail,
    }


def build(results: dict, environment: dict, backend: str, caches: list = ()) -> dict:
    tests = []
    for nodeid in sorted(results):
        r = results[nodeid]
        tests.append({
            "nodeid": nodeid,
            "outcome": r.outcome or "unknown",
            "failed_by_memlab": sorted(r.failed_by_memlab),
            "warned": sorted(r.warned),
            "memlab_error": r.memlab_error or None,
            "devices": {device: _device(d) for device, d in sorted(r.devices.items())},
        })
        if r.out_of_memory:
            tests[-1]["out_of_memory"] = r.out_of_memory
        if r.processes:
            tests[-1]["processes"] = r.processes
            tests[-1]["across_processes"] = across(r.processes)
    measured = [t for t in tests if any(d["measured"] for d in t["devices"].values())]
    return {
        "format": FORMAT,
        "version": VERSION,
        "environment": environment,
        "backend": backend or None,
        "summary": {
            "tests": len(tests),
            "measured": len(measured),
            "failed_by_memlab": sum(1 for t in tests if t["failed_by_memlab"]),
            "warned": sum(1 for t in tests if t["warned"]),
            "memlab_errors": sum(1 for t in tests if t["memlab_error"]),
        },
        "tests": tests,
        "caches": [{"device": c["device"], "holder": c["holder"], "bytes": c["bytes"], "tests": list(c["tests"])}
                   for c in caches],
    }


def write_json(path, data) -> None:
    """A report's JSON, keys sorted, written whole or not at all (its folder
    made first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write(path, results: dict, environment: dict, backend: str, caches: list = ()) -> None:
    write_json(path, build(results, environment, backend, caches))
