import time, statistics, torch, pytest, os
from pytest_memlab.plugin import SPECS, RUNNING
from pytest_memlab.results import encode

class FakeItem:
    def __init__(self, specs):
        self.stash = pytest.Stash(); self.nodeid = "test_x.py::test_y"; self.stash[SPECS] = specs
        self.funcargs = {}

class Rep:
    def __init__(self, when):
        self.when = when; self.failed = False; self.passed = True; self.outcome = "passed"
        self.user_properties = []; self.sections = []

@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    plugin = session.config.pluginmanager.get_plugin("memlab-manager")
    specs = session.items[0].stash[SPECS]
    T = {k: [] for k in ("begin", "window", "end", "judge", "result", "encode", "total")}
    for i in range(4000):
        item = FakeItem(specs)
        t0 = time.perf_counter_ns()
        plugin._begin(item, specs)
        t1 = time.perf_counter_ns()
        running = item.stash[RUNNING]
        with running.measurement.window():
            torch.ones(16)
        t2 = time.perf_counter_ns()
        plugin._end(item, running)
        t3 = time.perf_counter_ns()
        plugin._judge(running, Rep("call"), False); plugin._judge(running, Rep("teardown"), True)
        t4 = time.perf_counter_ns()
        r = plugin._result(item.nodeid, running)
        t5 = time.perf_counter_ns()
        encode(r)
        t6 = time.perf_counter_ns()
        for k, v in zip(T, (t1-t0, t2-t1, t3-t2, t4-t3, t5-t4, t6-t5, t6-t0)):
            T[k].append(v)
    plugin.current = None
    with open(os.environ["HOT_OUT"], "w") as f:
        for k, v in T.items():
            f.write(f"{k:8s} {statistics.median(v[500:])/1000:7.2f} us\n")
