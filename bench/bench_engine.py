"""Engine replay: how many allocator events per second one core absorbs.

Replays a recorded event stream (fixtures/events/) through the engine inside
an open scope, so every event does its full work (ledger insert or removal,
scope accounting, peaks).  Target: at least 50 million events per second.

    python bench/bench_engine.py [STREAM ...]
"""

import statistics
import struct
import sys
import time
from pathlib import Path

from pytest_memlab import _engine as engine

TARGET = 50e6


def slots_of(data: bytes) -> set[int]:
    # Event: u64 addr, i64 size, i64 total, i64 reserved, i32 slot, i32 source
    return {struct.unpack_from("i", data, off + 32)[0] for off in range(0, len(data), engine.EVENT_SIZE)}


def bench(path: Path, repeat: int = 200, rounds: int = 7) -> float:
    data = path.read_bytes()
    n = len(data) // engine.EVENT_SIZE
    slots = sorted(slots_of(data))
    rates = []
    for _ in range(rounds):
        scopes = [(s, engine.begin(s)) for s in slots]
        t0 = time.perf_counter()
        delivered = engine.replay(data, repeat)
        dt = time.perf_counter() - t0
        for s, sid in reversed(scopes):
            engine.end(s, sid)
        rates.append(delivered / dt)
    rate = statistics.median(rates)
    print(f"{path.name}: {n} events x {repeat}, median of {rounds}: {rate / 1e6:.1f} M events/s "
          f"(min {min(rates) / 1e6:.1f}, max {max(rates) / 1e6:.1f}); target >= {TARGET / 1e6:.0f} M: "
          f"{'met' if rate >= TARGET else 'MISSED'}")
    return rate


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]] or sorted(Path("fixtures/events").glob("*.bin"))
    rates = [bench(p) for p in paths]
    return 0 if all(r >= TARGET for r in rates) else 1


if __name__ == "__main__":
    sys.exit(main())
