import time, statistics, torch, pytest, os
from pytest_memlab.plugin import SPECS
from pytest_memlab._core import core, engine
from pytest_memlab.measure import Measurement, EngineMeter
from pytest_memlab.devices import resolve

@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    c = core()
    T = {}
    def t(k, fn, n=3000):
        v = []
        for _ in range(n):
            t0 = time.perf_counter_ns(); fn(); v.append(time.perf_counter_ns() - t0)
        T[k] = statistics.median(v[500:]) / 1000
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t("resolve", lambda: resolve(c, dev))
    conc = resolve(c, dev)[0]
    t("is_initialized", torch.cuda.is_initialized)
    if torch.cuda.is_initialized():
        t("current_device", torch.cuda.current_device)
        t("bridge_cuda_totals", lambda: engine.bridge_cuda_totals(0))
        t("memory_allocated", lambda: torch.cuda.memory_allocated(0))
    m = EngineMeter(c, conc, timeline=True)
    def be():
        m.begin(); m.end(True)
    t("meter begin+end", be)
    ms = Measurement(c, [conc], park=True, timeline=True, log=False)
    def mbe():
        ms.final = None; ms.begin(); ms.end()
    t("Measurement begin+end", mbe)
    t("Measurement()", lambda: Measurement(c, [dev], park=True, timeline=True, log=False))
    with open(os.environ["HOT_OUT"], "w") as f:
        for k, v in T.items():
            f.write(f"{k:30s} {v:7.2f} us\n")
