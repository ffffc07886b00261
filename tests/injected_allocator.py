"""Stands where torch's allocator would: delivers allocation events to the
engine through its test-only entry (inject).  Kept out of the tracer's scope
by the tests, as torch's own code is."""

import itertools

from pytest_memlab import _engine as E

# One address per block, from any thread: next() on a count is one step
# under the GIL, where `addr += 0x1000` could hand two threads the same.
_addresses = itertools.count(0x101000, 0x1000)


def alloc(n, slot=E.SLOT_CPU):
    addr = next(_addresses)
    E.inject(slot, addr, n)
    return addr


def free(addr, n, slot=E.SLOT_CPU):
    E.inject(slot, addr, -n)
