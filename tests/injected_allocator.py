"""Stands where torch's allocator would: delivers allocation events to the
engine through its test-only entry (inject).  Kept out of the tracer's scope
by the tests, as torch's own code is."""

from pytest_memlab import _engine as E

_addr = [0x100000]


def alloc(n, slot=E.SLOT_CPU):
    _addr[0] += 0x1000
    E.inject(slot, _addr[0], n)
    return _addr[0]


def free(addr, n, slot=E.SLOT_CPU):
    E.inject(slot, addr, -n)
