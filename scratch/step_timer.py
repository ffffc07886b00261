import os, time, statistics, functools, pytest
T = {}
def wrap(owner, name, key=None):
    fn = getattr(owner, name)
    key = key or f"{owner.__name__}.{name}"
    T[key] = []
    @functools.wraps(fn)
    def w(*a, **k):
        t0 = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            T[key].append(time.perf_counter_ns() - t0)
    setattr(owner, name, w)

def pytest_configure(config):
    from pytest_memlab import plugin, measure, results, attribution
    wrap(plugin.MemlabPlugin, "_begin")
    wrap(plugin.MemlabPlugin, "_end")
    wrap(plugin.MemlabPlugin, "_result")
    wrap(plugin.MemlabPlugin, "_judge")
    wrap(plugin.MemlabPlugin, "_leak_allowances")
    wrap(measure.Measurement, "__init__")
    wrap(measure.Measurement, "begin")
    wrap(measure.Measurement, "end")
    wrap(measure.Measurement, "check_leaks")
    wrap(measure.TraceWindow, "__enter__")
    wrap(measure.TraceWindow, "__exit__")
    wrap(measure.EngineMeter, "begin")
    wrap(measure.EngineMeter, "end")
    wrap(results.DeviceResult, "from_figures")
    plugin.encode = _e = plugin.encode
    T["encode"] = []
    def enc(r):
        t0 = time.perf_counter_ns(); x = _e(r); T["encode"].append(time.perf_counter_ns() - t0); return x
    plugin.encode = enc

def pytest_unconfigure(config):
    with open(os.environ.get("STEP_OUT", "/tmp/pt/steps.txt"), "w") as f:
        for k, v in T.items():
            if v:
                v = v[200:] or v
                f.write(f"{k:40s} n={len(v):6d} median={statistics.median(v)/1000:7.2f} us\n")
