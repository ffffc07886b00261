"""``--memlab-snapshot=DIR``: per measured test and device, its allocation
events in the format of PyTorch's memory snapshot (the dictionary
``torch.cuda.memory._snapshot()`` returns, which ``memory_viz`` opens):

- ``device_traces``: one list per CUDA device index (the CPU as index 0 in
  its own file), each entry ``{"action", "addr", "size", "stream",
  "time_us", "frames"}`` with ``action`` ``alloc``, then ``free_requested``
  and ``free_completed`` for a free, as the caching allocator records them;
  ``frames`` is the user call chain that allocated the block, innermost
  first (``{"filename", "line", "name"}``).
- ``segments``: the blocks the test still held at its end, one segment
  each (memlab hears blocks, not the caching allocator's segments).

Written as JSON (``NAME.json``) and, for the memory_viz page, which opens
pickles, as the same dictionary pickled (``NAME.pickle``).  NAME is the
test's node id made safe for a file name, and the device.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
from pathlib import Path

from ..atomic_files import write_atomic
from ..devices import CPU, cuda_index
from ..engine.attribution import chain_of

_LARGE = 1 << 20        # the caching allocator's small/large pool boundary


def file_stem(nodeid: str, device: str) -> str:
    """A readable file name unique to the test: its node id made safe, and,
    where making it safe lost characters ("a<b" and "a>b" would both read
    "a_b") or it had to be cut, a hash of the whole id."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("_")
    digest = hashlib.sha1(nodeid.encode()).hexdigest()[:10]
    if len(safe) > 120:   # long parametrised ids: cut
        safe = safe[:100] + "-" + digest
    else:
        path, sep, rest = nodeid.partition("::")
        plain = path.replace("/", "_") + ("_" + rest.replace("::", "_") if sep else "")
        if safe != plain:   # characters of the test's name or parameters were lost
            safe += "-" + digest
    return f"{safe}-{device.replace(':', '')}"


def _frames(site: int, cache: dict) -> list[dict]:
    frames = cache.get(site)
    if frames is None:
        frames = cache[site] = [{"filename": f.path, "line": f.line, "name": f.function} for f in chain_of(site)]
    return frames


def build(nodeid: str, device: str, entries: list, dropped: int) -> dict:
    index = 0 if device == CPU else cuda_index(device)
    trace, live, cache = [], {}, {}
    for addr, size, time_us, site, _seq, _counts in entries:
        frames = _frames(site, cache)
        if size > 0:
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": time_us,
                          "frames": frames})
            live[addr] = (size, frames)
        else:
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": addr, "size": -size, "stream": 0, "time_us": time_us,
                              "frames": frames})
            live.pop(addr, None)
    segments = []
    for addr, (size, frames) in sorted(live.items()):
        segments.append({
            "device": index, "address": addr, "total_size": size, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": 0,
            "segment_type": "large" if size >= _LARGE else "small", "segment_pool_id": [0, 0],
            "is_expandable": False, "frames": frames,
            "blocks": [{"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
                        "frames": frames}],
        })
    return {
        "segments": segments,
        "device_traces": [[] for _ in range(index)] + [trace],
        "allocator_settings": {},
        "memlab": {"nodeid": nodeid, "device": device, "entries_dropped": dropped,
                   "note": "segments are the blocks the test still held at its end, one each"},
    }


def write(folder, nodeid: str, device: str, entries: list, dropped: int) -> Path:
    """Writes NAME.json and NAME.pickle into folder; returns the JSON's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = build(nodeid, device, entries, dropped)
    stem = file_stem(nodeid, device)
    path = folder / f"{stem}.json"
    write_atomic(path, json.dumps(data) + "\n")
    tmp = folder / f".{stem}.pickle.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(data, f, protocol=4)
    tmp.replace(folder / f"{stem}.pickle")
    return path
