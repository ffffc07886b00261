"""scratch: time spent inside memlab's hooks per test protocol, cold, in pytest."""
import functools, inspect, os, statistics, time
import pytest
from pytest_memlab import plugin as P

ACC = [0]
PER = {}
def _now():
    return time.perf_counter_ns()

def _timed(name, fn):
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def w(*a, **k):
            t0 = _now(); g = fn(*a, **k); v = next(g); d = _now() - t0
            ACC[0] += d; PER[name] = PER.get(name, 0) + d
            r = yield v
            t0 = _now()
            try:
                g.send(r)
            except StopIteration as s:
                d = _now() - t0; ACC[0] += d; PER[name] = PER.get(name, 0) + d
                return s.value
            raise RuntimeError("wrapper yielded twice")
        return w
    @functools.wraps(fn)
    def w(*a, **k):
        t0 = _now()
        try:
            return fn(*a, **k)
        finally:
            d = _now() - t0; ACC[0] += d; PER[name] = PER.get(name, 0) + d
    return w

for name in ("pytest_runtest_setup", "pytest_pyfunc_call", "pytest_runtest_teardown",
             "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_fixture_setup"):
    setattr(P.MemlabPlugin, name, _timed(name, getattr(P.MemlabPlugin, name)))

_T = {True: [], False: []}
_H = {True: [], False: []}
_per = {True: {}, False: {}}

@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    measured = P.SPECS in item.stash
    ACC[0] = 0; PER.clear()
    t0 = _now()
    yield
    _T[measured].append(_now() - t0)
    _H[measured].append(ACC[0])
    for k, v in PER.items():
        _per[measured].setdefault(k, []).append(v)

def pytest_unconfigure(config):
    with open(os.environ["HOOK_OUT"], "w") as f:
        for m in (True, False):
            if _T[m]:
                f.write(f"measured={m}: protocol {statistics.median(_T[m][25:])/1000:.1f} us, in memlab hooks {statistics.median(_H[m][25:])/1000:.1f} us\n")
                for k, v in _per[m].items():
                    f.write(f"    {k:30s} {statistics.median(v[25:])/1000:.1f} us\n")
