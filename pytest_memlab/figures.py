"""The words and figures every layer shares, defined once below them all (a
leaf: it imports nothing of the package): the phases' and the kinds' names,
a test's kinds made the first time they are asked for, and a test's figures
across its child processes and ranks.  The engine and the measurement make
them; the verdicts, the reports and the session read them from here.
"""

from __future__ import annotations

# The phases' names, in the kinds' order (csrc/phases.h, engine/tracing.py):
# the keys of each phase's peak and of a marker's phase budgets (forward=,
# backward=, step=).
PHASE_NAMES = ("forward", "backward", "step")


def phase_bytes(phase_peaks: dict) -> dict:
    """Each phase's own peak as the reports, the baseline and a child's
    record keep it ({name: bytes}), from the figures' {name: (bytes, site)}."""
    return {name: peak for name, (peak, _) in phase_peaks.items()}

# -- memory by kind (measuring/memory_kinds.py classifies) --------------------------
KINDS = ("parameter", "buffer", "gradient", "optimizer_state", "input", "activation", "temporary", "other")
# How they read in a sentence ("at the peak, by kind: activations 640.3 MiB ...")
KIND_WORDS = {"parameter": "parameters", "buffer": "buffers", "gradient": "gradients",
              "optimizer_state": "optimizer state", "input": "inputs", "activation": "activations",
              "temporary": "temporaries", "other": "other"}
# A marker's budget on one kind (cpu_memory(activations="1G")): key -> kind
KIND_BUDGETS = {"parameters": "parameter", "buffers": "buffer", "gradients": "gradient",
                "optimizer_state": "optimizer_state", "inputs": "input", "activations": "activation",
                "temporaries": "temporary"}


def kinds_note(figures) -> str:
    """Why figures have no kinds (after resolve_kinds): the classification's
    own reason, or, where no walk began for them, that no phase ran."""
    return figures.kinds_note or "no phase ran, or the tracer was off"


def resolve_kinds(figures) -> dict | None:
    """figures' bytes at the own peak by kind (and each phase's, and the
    blocks for the timeline), made the first time they are asked for: the
    measurement left with them how (``kinds_pending``: the classifier and
    what it classifies, memory_kinds.defer)."""
    pending = getattr(figures, "kinds_pending", None)
    if pending is None:
        return getattr(figures, "kinds", None)
    figures.kinds_pending = None
    classify, made_of = pending
    classify(figures, *made_of)
    return figures.kinds


# -- across processes (children/gathering.py gathers them) --------------------------
def across(processes: list[dict]) -> dict[str, dict]:
    """The figures across a test's child processes (as the reports keep
    them: ChildFigures.as_dict()), each process taken on its own device:
    per kind of device ("cpu", "cuda"), the highest own peak and the
    process that reached it, the lowest, the spread (max - min), and each
    process's device (a rank on cuda:1 is compared with a rank on cuda:0,
    each where it worked: device_of).  Ranks only, where the children have
    ranks (a DataLoader's workers beside them are not ranks); over says
    which: "ranks" or "processes"."""
    done = [p for p in processes if p.get("state") == "done"]
    ranked = [p for p in done if p.get("rank") is not None]
    over = "ranks" if ranked else "processes"
    out: dict[str, dict] = {}
    for p in ranked or done:
        devices = p.get("devices", {})
        for kind in dict.fromkeys(d.split(":")[0] for d in devices):
            own = own_device(devices, kind)
            if own is None:
                continue
            device, peak = own
            a = out.setdefault(kind, {"over": over, "processes": 0, "max": -1, "worst": "", "min": None,
                                      "devices": {}})
            a["processes"] += 1
            a["devices"][p["label"]] = device
            if peak > a["max"]:
                a["max"], a["worst"] = peak, p["label"]
            a["min"] = peak if a["min"] is None else min(a["min"], peak)
    for a in out.values():
        a["spread"] = a["max"] - a["min"]
    return out


def own_device(devices: dict, kind: str) -> tuple[str, int] | None:
    """A process's device of a kind (the one where its own peak was
    highest) and its own peak there; None where it has no figure."""
    best = None
    for device, d in devices.items():
        if device.split(":")[0] == kind and d.get("peak") is not None:
            if best is None or d["peak"] > best[1]:
                best = (device, d["peak"])
    return best


def device_of(devices: dict, device: str):
    """A process's figures (device -> figures, as DeviceFigures or as the
    reports' dicts) for the test's device: the same device, or for CUDA the
    CUDA device where its own peak was highest (a rank's own GPU)."""
    if not device.startswith("cuda"):
        return devices.get(device)

    def peak(f):
        return f.get("peak") if isinstance(f, dict) else (f.peak if f.measured else None)

    cuda = [f for d, f in devices.items() if d.startswith("cuda") and peak(f) is not None]
    return max(cuda, key=peak) if cuda else None


RANK_KEY = "{device}@rank {rank}"   # a rank's baseline entry, beside the test's own device's


def rank_entries(result) -> dict:
    """A result's ranks (children with a rank, not the test's own process)
    as baseline entries: device@rank N -> figures."""
    entries = {}
    for p in result.processes:
        if p.get("rank") is None or p.get("state") != "done" or p.get("own"):
            continue
        for d in result.devices.values():
            if not d.measured:
                continue
            f = device_of(p.get("devices", {}), d.device)
            if f is None or f.get("peak") is None:
                continue
            entry = entries[RANK_KEY.format(device=d.name or d.device, rank=p["rank"])] = {
                "peak": f["peak"], "peak_total": f.get("peak_total"), "reserved_peak": None, "leaked": None}
            if f.get("phases"):   # compared rank by rank, as the peak
                entry["phases"] = dict(f["phases"])
    return entries
