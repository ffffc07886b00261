"""Reports: the option's spellings, the JSON report (its schema, its
figures from real allocations, under pytest-xdist too), the timelines in
it, and the HTML report rendered by a real browser."""

import html
import json
import os
import re
import shutil
import struct
import subprocess
import zlib

import pytest

from conftest import line_no, requires_cuda, requires_torch

pytestmark = requires_torch

SUITE = """
import pytest, torch
MiB = 2**20

@pytest.mark.cpu_memory(max="8MiB")
def test_within():
    a = torch.empty(3 * MiB, dtype=torch.uint8)
    del a

@pytest.mark.cpu_memory(max="1MiB")
def test_over():
    a = torch.empty(2 * MiB, dtype=torch.uint8)
    del a

@pytest.mark.cpu_memory
def test_fails_itself():
    a = torch.empty(MiB, dtype=torch.uint8)
    assert False

def test_unmarked():
    pass   # measured all the same: a report implies --memlab
"""


def validate(data):
    jsonschema = pytest.importorskip("jsonschema")
    from pytest_memlab.reports.json_report import SCHEMA

    jsonschema.validate(data, json.loads(SCHEMA.read_text()))


def check_report(path, suite_file):
    text = path.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"   # stable: sorted keys
    assert data["format"] == "pytest-memlab-report" and data["version"] == 2
    tests = {t["nodeid"]: t for t in data["tests"]}
    assert list(tests) == sorted(tests)                                   # node id order
    assert list(tests) == ["test_suite.py::test_fails_itself", "test_suite.py::test_over",
                           "test_suite.py::test_unmarked", "test_suite.py::test_within"]
    import torch

    unmarked = "cuda:0" if torch.cuda.is_available() else "cpu"   # an unmarked test measures the default device
    assert tests["test_suite.py::test_unmarked"]["devices"][unmarked]["peak"] == 0
    within = tests["test_suite.py::test_within"]
    assert within["outcome"] == "passed" and within["failed_by_memlab"] == []
    cpu = within["devices"]["cpu"]
    assert (cpu["peak"], cpu["max"], cpu["leaked"], cpu["reserved_peak"]) == (3 * 2**20, 8 * 2**20, 0, None)
    line = line_no(suite_file, "a = torch.empty(3 * MiB")
    assert cpu["top"][0] == {"file": "test_suite.py", "line": line, "function": "test_within",
                             "bytes": 3 * 2**20, "peak_total": cpu["top"][0]["peak_total"]}
    over = tests["test_suite.py::test_over"]
    assert over["outcome"] == "failed" and over["failed_by_memlab"] == ["cpu max"]
    assert over["devices"]["cpu"]["peak"] == 2 * 2**20
    itself = tests["test_suite.py::test_fails_itself"]
    assert itself["outcome"] == "failed" and itself["failed_by_memlab"] == []
    assert itself["devices"]["cpu"]["max"] is None
    assert data["summary"] == {"tests": 4, "measured": 4, "failed_by_memlab": 1, "warned": 0, "memlab_errors": 0}
    assert data["environment"]["torch"] and data["backend"].startswith("bridge")
    validate(data)
    return data


@pytest.mark.parametrize("args", [["--memlab-json=out/report.json"], ["--memlab-report=term,json:out/report.json"]])
def test_the_json_report(inner, args):
    inner.makepyfile(test_suite=SUITE)
    result = inner.runpytest_inprocess(*args)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["JSON report: out/report.json"])
    check_report(inner.path / "out" / "report.json", inner.path / "test_suite.py")
    if "term" in args[0]:
        result.stdout.fnmatch_lines(["test * own peak*"])


def test_the_json_report_under_xdist_and_from_the_ini(inner):
    inner.makepyfile(test_suite=SUITE)
    inner.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\nmemlab_json = report.json\n")
    result = inner.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=2, failed=2)
    check_report(inner.path / "report.json", inner.path / "test_suite.py")


def test_the_json_report_carries_the_baseline(inner):
    inner.makepyfile(test_suite=SUITE)
    inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-update-baseline")
    inner.makepyfile(test_suite=SUITE.replace("3 * MiB", "4 * MiB"))
    result = inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-json=r.json")
    result.assert_outcomes(passed=1, failed=3)
    data = json.loads((inner.path / "r.json").read_text())
    validate(data)
    within = next(t for t in data["tests"] if t["nodeid"].endswith("test_within"))
    assert within["failed_by_memlab"] == ["cpu baseline"]
    assert (within["devices"]["cpu"]["baseline_peak"], within["devices"]["cpu"]["peak"],
            within["devices"]["cpu"]["baseline"]) == (3 * 2**20, 4 * 2**20, "regressed")
    unmarked = next(t for t in data["tests"] if t["nodeid"].endswith("test_unmarked"))
    (device,) = unmarked["devices"].values()
    assert device["baseline"] == "same"   # --memlab-baseline measures every test


def test_a_path_after_the_bare_flag_is_a_path(inner):
    inner.makepyfile(test_suite=SUITE)
    sub = inner.mkpydir("sub")
    (sub / "test_other.py").write_text("def test_other():\n    pass\n")
    result = inner.runpytest_inprocess("--memlab-report", "sub")
    result.assert_outcomes(passed=1)                       # only sub/ was collected
    import torch
    unmarked = "cuda:0" if torch.cuda.is_available() else "cpu"   # an unmarked test measures the default device
    result.stdout.fnmatch_lines([f"on {unmarked}, in sub/test_other.py:", "test * own peak*", "test_other *"])
    result = inner.runpytest_inprocess("test_suite.py::test_within", "--memlab-report", "sub/test_other.py")
    result.assert_outcomes(passed=2)
    result = inner.runpytest_inprocess("--memlab-report=term", "sub")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("spec, message", [
    ("xml", "'xml' is not a report (expected a comma list of: term, json:PATH, html:PATH, bmf:PATH, gab:PATH)"),
    ("json:", "'json:' names no file (write json:PATH)"),
    ("html:", "'html:' names no file (write html:PATH)"),
    ("bmf:", "'bmf:' names no file (write bmf:PATH)"),
    ("gab: ", "'gab:' names no file (write gab:PATH)"),
    ("json:r.json,bmf:r.json", "the JSON report and the Bencher (BMF) report name the same file (r.json)*"),
])
def test_a_bad_report_spec_is_a_usage_error(inner, spec, message):
    inner.makepyfile(test_suite=SUITE)
    result = inner.runpytest_inprocess(f"--memlab-report={spec}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


# Bencher's published schema for BMF (https://bencher.dev/bmf.json), and the
# shape github-action-benchmark's README gives its customSmallerIsBetter
# input (name, unit, value required; range, extra optional strings).
BMF_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema", "type": "object",
    "patternProperties": {".+": {"type": "object", "patternProperties": {".+": {
        "type": "object", "required": ["value"],
        "properties": {"value": {"type": "number"}, "lower_value": {"type": "number"},
                       "upper_value": {"type": "number"}}}}}},
}
GAB_SCHEMA = {
    "type": "array", "items": {
        "type": "object", "required": ["name", "unit", "value"], "additionalProperties": False,
        "properties": {"name": {"type": "string"}, "unit": {"type": "string"}, "value": {"type": "number"},
                       "range": {"type": "string"}, "extra": {"type": "string"}}},
}


def test_the_dashboard_exports_hold_the_figures_in_their_formats(inner):
    """bmf:PATH and gab:PATH: each valid against its format's published
    shape, each figure the JSON report's (a test's own peak: the 3 MiB it
    allocated; what a test left: the 1 MiB it kept), measured devices only."""
    jsonschema = pytest.importorskip("jsonschema")
    inner.makepyfile(test_suite=SUITE + """
kept = []

@pytest.mark.cpu_memory(leaks="2M")   # the CPU, also where there is CUDA
def test_leaves():
    kept.append(torch.empty(MiB, dtype=torch.uint8))
""")
    result = inner.runpytest_inprocess("--memlab-report=json:r.json,bmf:dash/b.json,gab:g.json", "-p", "no:randomly")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["Bencher (BMF) report: dash/b.json", "github-action-benchmark report: g.json"])
    bmf = json.loads((inner.path / "dash" / "b.json").read_text())
    gab = json.loads((inner.path / "g.json").read_text())
    jsonschema.validate(bmf, BMF_SCHEMA)
    jsonschema.validate(gab, GAB_SCHEMA)
    # Each test's measured devices (an unmarked test measures CUDA where
    # there is CUDA): the exports hold each of them, nothing else.
    report = {(t["nodeid"], device): figures for t in json.loads((inner.path / "r.json").read_text())["tests"]
              for device, figures in t["devices"].items()}
    assert sorted(bmf) == sorted({nodeid for nodeid, _ in report})
    for nodeid in bmf:
        assert bmf[nodeid] == {f"memlab {what} {device}": {"value": figures[what] or 0}
                               for (n, device), figures in report.items() if n == nodeid
                               for what in ("peak", "leaked")}
    assert bmf["test_suite.py::test_within"]["memlab peak cpu"]["value"] == 3 * 2**20
    assert bmf["test_suite.py::test_leaves"]["memlab leaked cpu"]["value"] == 2**20
    assert sorted((e["name"], e["value"]) for e in gab) == sorted(
        (f"{nodeid} [{device}] {what}", figures[what] or 0) for (nodeid, device), figures in report.items()
        for what in ("peak", "leaked"))
    assert {e["unit"] for e in gab} == {"bytes"}
    within = next(e for e in gab if e["name"] == "test_suite.py::test_within [cpu] peak")
    assert within["extra"] == "own peak 3.0 MiB; max 8.0 MiB"


def test_an_unwritable_json_report_is_said_and_fails_the_run(inner):
    inner.makepyfile(test_suite="def test_ok():\n    pass\n")
    (inner.path / "blocked").write_text("a file, not a folder")
    result = inner.runpytest_inprocess("--memlab-json=blocked/r.json")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["pytest-memlab: the JSON report blocked/r.json was not written: *"])


TIMELINE_SUITE = """
import pytest, torch
MiB = 2**20
pytestmark = pytest.mark.cpu_memory

def test_steps(memlab):
    a = torch.empty(MiB, dtype=torch.uint8)
    memlab.mark("one MiB")
    b = torch.empty(2 * MiB, dtype=torch.uint8)
    del a
    memlab.mark("two MiB")
    del b

def test_many_events():
    keep = []
    for i in range(20000):
        t = torch.empty(64, dtype=torch.uint8)
        if i == 12345:
            keep.append(torch.empty(5 * MiB, dtype=torch.uint8))
    del keep
"""


def test_the_json_report_carries_timelines_marks_and_the_peak(inner):
    inner.makepyfile(test_timeline=TIMELINE_SUITE)
    result = inner.runpytest_inprocess("--memlab-json=r.json", "--memlab-details=all")
    result.assert_outcomes(passed=2)
    data = json.loads((inner.path / "r.json").read_text())
    validate(data)
    tests = {t["nodeid"].split("::")[1]: t["devices"]["cpu"] for t in data["tests"]}
    steps = tests["test_steps"]
    detail = steps["detail"]
    MiB = 2**20
    # allocations: 1 MiB, then 2 MiB (peak 3 MiB), then frees: 4 events
    assert detail["events"] == 4
    assert [p[2] for p in detail["timeline"]] == [0, MiB, 3 * MiB, 2 * MiB, 0]
    assert [(m["label"], m["kind"], m["at"]) for m in detail["marks"]] == [("one MiB", "mark", 1),
                                                                         ("two MiB", "mark", 3)]
    assert detail["peak_at"] == 2 and steps["peak"] == 3 * MiB
    assert detail["peak_line"].startswith(f"test_timeline.py:{line_no(inner.path / 'test_timeline.py', 'b = torch.empty')} test_steps")
    many = tests["test_many_events"]["detail"]
    # 40002 events (20000 short-lived tensors and the list's 5 MiB one,
    # each allocated and freed) merged into at most 512 points: the spike
    # survives at its exact height (5 MiB, and two 64-byte tensors while
    # the loop's next one is allocated before the last one goes)
    assert many["events"] == 40002
    assert len(many["timeline"]) <= 512
    assert max(p[2] for p in many["timeline"]) == 5 * MiB + 128 == tests["test_many_events"]["peak"]
    assert min(p[1] for p in many["timeline"][1:]) == 0
    xs = [p[0] for p in many["timeline"]]
    assert xs == sorted(xs) and xs[0] == 0


def test_timelines_are_fetched_only_for_a_report_that_shows_them(inner):
    inner.makepyfile(test_timeline=TIMELINE_SUITE)
    result = inner.runpytest_inprocess("--memlab-report", "--junitxml=j.xml")
    result.assert_outcomes(passed=2)
    junit = (inner.path / "j.xml").read_text()
    assert "memlab.cpu.peak" in junit and "memlab.cpu.detail" not in junit


def _png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA PNG, the
    kind Chromium writes; enough of PNG for the check below."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)

TRAINING_SUITE = """
import pytest, torch, torch.nn as nn
pytestmark = pytest.mark.cpu_memory

def test_training_step(memlab):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(512, 256)
    loss = model(x).sum()
    memlab.mark("after forward")
    loss.backward()
    opt.step()

def test_small():
    torch.ones(16)
"""


def test_the_html_report_is_one_file_that_a_browser_draws(inner, tmp_path):
    inner.makepyfile(test_train=TRAINING_SUITE)
    result = inner.runpytest_inprocess("--memlab-report=term,html:out/r.html", "--memlab-details=all")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["HTML report: out/r.html"])
    page = (inner.path / "out" / "r.html").read_text()
    # self-contained: no script, style, image or font from anywhere
    assert "<link" not in page and " src=" not in page and "@import" not in page and "url(" not in page
    assert "test_train.py::test_training_step" in page
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (ci/install installs Debian's chromium)")
    # index order: test_small, test_training_step
    url = (inner.path / "out" / "r.html").as_uri() + "#test=1"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1200,1000", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(common + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "data-errors" not in dom.stdout.split("<body", 1)[0], dom.stdout[:500]  # no script error
    assert "Uncaught" not in dom.stderr
    # the svg grows by a row for each row of mark labels under its x axis
    assert re.search(r'<svg width="900" height="3\d\d" class="timeline"', dom.stdout)
    assert 'class="peak-label"' in dom.stdout and ">own peak " in dom.stdout
    assert f"at test_train.py:{line_no(inner.path / 'test_train.py', 'loss.backward()')} test_training_step" in dom.stdout
    assert ">after forward</text>" in dom.stdout
    # the phases of the training step marked themselves
    assert ">forward Sequential</text>" in dom.stdout and ">backward</text>" in dom.stdout
    assert ">SGD.step</text>" in dom.stdout
    # the index filters and sorts (the view in the address, as a user's click leaves it)
    view = (inner.path / "out" / "r.html").as_uri() + "#filter=small&sort=2&desc=0"
    dom = subprocess.run(common + ["--dump-dom", view], capture_output=True, text=True, timeout=120)
    assert '<span id="count">1 of 2 shown</span>' in dom.stdout
    index = dom.stdout.split('<tbody id="rows">')[1].split("</tbody>")[0]
    assert index.count('<tr class="row') == 1 and "test_train.py::test_small</td>" in index
    view = (inner.path / "out" / "r.html").as_uri() + "#sort=2&desc=0"     # own peak, smallest first
    dom = subprocess.run(common + ["--dump-dom", view], capture_output=True, text=True, timeout=120)
    assert dom.stdout.index("test_train.py::test_small</td>") < dom.stdout.index("test_train.py::test_training_step</td>")
    shot = tmp_path / "shot.png"
    run = subprocess.run(common + [f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    width, height, rows = _png_pixels(shot)
    assert (width, height) == (1200, 1000)
    # the own-bytes line (#d62728) and the peak's dot are drawn
    red = sum(1 for row in rows for px in row if abs(px[0] - 0xd6) < 12 and abs(px[1] - 0x27) < 12
              and abs(px[2] - 0x28) < 12)
    assert red > 500, red


PHASES_SUITE = """
import pytest, torch, torch.nn as nn
pytestmark = pytest.mark.cpu_memory

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x):
        return self.body(x)

def test_two_steps(memlab):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(torch.randn(32, 64)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    memlab.mark("done")

def test_a_forward_that_raises_leaves_no_phase_open():
    model = Net()
    with pytest.raises(RuntimeError):
        model(torch.randn(3, 5))        # wrong width: raises inside forward
    model(torch.randn(3, 64))

@pytest.mark.cpu_memory(max="64KiB")
def test_peak_in_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    x = torch.randn(512, 256)
    loss = model(x).sum()
    loss.backward()

def test_compiled_fullgraph():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    fn = torch.compile(model, fullgraph=True, backend="eager")
    assert fn(torch.ones(2, 8)).shape == (2, 8)
"""


def test_phases_mark_themselves_on_the_timeline(inner):
    inner.makepyfile(test_phases=PHASES_SUITE)
    result = inner.runpytest_inprocess("--memlab-json=r.json", "--memlab-details=all")
    result.assert_outcomes(passed=3, failed=1)
    # no hook was registered with torch: torch.compile(fullgraph=True) passed, and did not warn of one
    result.stdout.no_fnmatch_line("*global hooks*")
    data = json.loads((inner.path / "r.json").read_text())
    validate(data)
    tests = {t["nodeid"].split("::")[1]: t["devices"]["cpu"] for t in data["tests"]}
    marks = tests["test_two_steps"]["detail"]["marks"]
    # the top-level module's forward only (not its children's), each backward and step
    assert [(m["kind"], m["label"]) for m in marks] == [
        ("phase", "forward Net"), ("phase", "backward"), ("phase", "SGD.step"),
        ("phase", "forward Net"), ("phase", "backward"), ("phase", "SGD.step"), ("mark", "done")]
    ats = [m["at"] for m in marks]
    # in event order; the frees of the test's locals come after its last line
    assert ats == sorted(ats) and ats[-1] < tests["test_two_steps"]["detail"]["events"]
    raised = tests["test_a_forward_that_raises_leaves_no_phase_open"]["detail"]["marks"]
    assert [m["label"] for m in raised] == ["forward Net", "forward Net"]
    # the failure says in which phase the peak fell
    result.stdout.fnmatch_lines(["cpu peak * exceeds max 64.0 KiB by *",
                                 "  peak reached during backward, in test_phases.py:* test_peak_in_backward: "
                                 "loss.backward()"])
    peak = tests["test_peak_in_backward"]["detail"]
    backward = next(m["at"] for m in peak["marks"] if m["label"] == "backward")
    assert peak["peak_at"] > backward


SNAPSHOT_SUITE = """
import pytest, torch
MiB = 2**20
KEPT = []

@pytest.mark.cpu_memory(leaks=None)
def test_alloc_free_keep():
    a = torch.empty(MiB, dtype=torch.uint8)
    del a
    KEPT.append(torch.empty(2 * MiB, dtype=torch.uint8))
"""


def test_snapshots_are_what_torchs_memory_viz_reads(inner):
    import pickle

    from torch.cuda import _memory_viz

    inner.makepyfile(test_snap=SNAPSHOT_SUITE)
    result = inner.runpytest_inprocess("--memlab-snapshot=snap")
    result.assert_outcomes(passed=1)
    stem = str(inner.path / "snap" / "test_snap.py_test_alloc_free_keep-cpu")
    data = json.loads(open(stem + ".json").read())
    assert pickle.loads(open(stem + ".pickle", "rb").read()) == data
    MiB = 2**20
    trace = data["device_traces"][0]
    assert [(e["action"], e["size"]) for e in trace if e["size"] >= MiB] == [
        ("alloc", MiB), ("free_requested", MiB), ("free_completed", MiB), ("alloc", 2 * MiB)]
    first = next(e for e in trace if e["size"] == MiB)
    assert first["frames"][0] == {"filename": str(inner.path / "test_snap.py"),
                                  "line": line_no(inner.path / "test_snap.py", "a = torch.empty"),
                                  "name": "test_alloc_free_keep"}
    assert set(first) == {"action", "addr", "size", "stream", "time_us", "frames"}
    # the block still held at the end is a segment, with its frames
    kept = [s for s in data["segments"] if s["total_size"] == 2 * MiB]
    assert len(kept) == 1 and kept[0]["blocks"][0]["state"] == "active_allocated"
    assert kept[0]["blocks"][0]["frames"][0]["line"] == line_no(inner.path / "test_snap.py", "KEPT.append")
    # torch's own readers of a snapshot take it as it is
    text = _memory_viz.trace(data)
    assert f"{len(trace)} entries" in text and "2.0MiB" in text
    assert "total_allocated: 2.0MiB" in _memory_viz.segsum(data)
    flame = _memory_viz.memory(data, format_flamegraph=lambda lines: lines)
    assert f"test_snap.py:{line_no(inner.path / 'test_snap.py', 'KEPT.append')}:test_alloc_free_keep {2 * MiB}" in flame


def test_a_snapshot_folder_that_cannot_be_written_is_said_not_failed(inner):
    inner.makepyfile(test_snap=SNAPSHOT_SUITE)
    (inner.path / "blocked").write_text("a file, not a folder")
    result = inner.runpytest_inprocess("--memlab-snapshot=blocked/snap", "--memlab-report")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*the snapshot was not written: *"])


CUDA_SNAPSHOT_SUITE = """
import pytest, torch
MiB = 2**20

@pytest.mark.cuda_memory
def test_cuda_alloc_free():
    a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    del a, b
"""


@requires_cuda
def test_cuda_snapshots_have_the_structure_torch_writes(inner):
    import torch

    # torch's own snapshot of the same allocations, for its structure
    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        a = torch.empty(2**20, dtype=torch.uint8, device="cuda")
        b = torch.empty(3 * 2**20, dtype=torch.uint8, device="cuda")
        del a, b
        theirs = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    their_trace = [e for e in theirs["device_traces"][torch.cuda.current_device()] if e["action"] == "alloc"]
    inner.makepyfile(test_snap=CUDA_SNAPSHOT_SUITE)
    result = inner.runpytest_inprocess("--memlab-snapshot=snap")
    result.assert_outcomes(passed=1)
    device = f"cuda{torch.cuda.current_device()}"
    ours = json.loads((inner.path / "snap" / f"test_snap.py_test_cuda_alloc_free-{device}.json").read_text())
    assert set(ours) >= {"segments", "device_traces"}
    trace = ours["device_traces"][torch.cuda.current_device()]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert [e["size"] for e in allocs] == [e["size"] for e in their_trace[-2:]] == [2**20, 3 * 2**20]
    assert set(allocs[0]) <= set(their_trace[0])
    assert set(allocs[0]["frames"][0]) <= set(their_trace[0]["frames"][0])
    assert {e["action"] for e in trace} <= {"alloc", "free_requested", "free_completed"}


TABLE_SUITE = """
import pytest, torch
MiB = 2**20
pytestmark = pytest.mark.cpu_memory

@pytest.mark.parametrize("n", range(1, 26))
def test_a_rather_long_test_name_that_shows_how_node_ids_are_cut_to_fit_the_table(n):
    a = torch.empty(n * MiB, dtype=torch.uint8)

@pytest.mark.cpu_memory(max="2MiB")
def test_near_its_budget():
    a = torch.empty(MiB + MiB // 2, dtype=torch.uint8)
"""


def test_the_terminal_table_fits_100_columns_worst_first_and_follows_q_and_v(inner):
    inner.makepyfile(test_table=TABLE_SUITE)
    result = inner.runpytest_inprocess("--memlab-report")
    result.assert_outcomes(passed=26)
    lines = result.stdout.str().split("= memlab =")[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("test "))
    listed = lines[start:]          # the table, and the heaviest tests' lines after it
    assert all(len(ln) <= 100 for ln in listed), max(listed, key=len)
    result.stdout.fnmatch_lines([
        "26 tests measured through torch's allocators (torch *)",
        "on cpu, in test_table.py:",
        "test * own peak * total peak * max * use",
        # worst first: the test with a budget uses 75% of it
        "test_near_its_budget * 1.5 MiB * 1.5 MiB * 2.0 MiB * 75%",
        # a name longer than the room: cut in its middle, its start and its parameters kept
        "test_a_rather_long_t...*_table[[]25]  25.0 MiB * 25.0 MiB * - * -",
        "... and 6 more rows (-v shows all)",
        "the heaviest tests, by the lines that allocated most (allocated over the test, not held at once):",
        "test_table.py::test_a_ra*[[]25] (cpu, own peak 25.0 MiB)",
        f"    25.0 MiB allocated by test_table.py:{line_no(inner.path / 'test_table.py', 'a = torch.empty(n')} "
        "test_a_rather_long_test_name*...",
    ])
    assert next(i for i, ln in enumerate(listed) if ln.startswith("... and")) == 1 + 20   # header and 20 rows
    verbose = inner.runpytest_inprocess("--memlab-report", "-v").stdout.str().split("= memlab =")[1]
    rows = [ln for ln in verbose.splitlines() if ln.startswith(("test_a_rather", "test_near")) and " MiB " in ln]
    assert len(rows) == 26 and verbose.count("(cpu, own peak") == 10 and "more rows" not in verbose
    quiet = inner.runpytest_inprocess("--memlab-report", "-q").stdout.str().split("= memlab =")[1]
    rows = [ln for ln in quiet.splitlines() if ln.startswith(("test_a_rather", "test_near"))]
    assert len(rows) == 10 and "heaviest tests" not in quiet and "16 more rows" in quiet
    counts_only = inner.runpytest_inprocess("--memlab-report", "-qq").stdout.str()
    assert "26 tests measured" in counts_only and " own peak " not in counts_only


def test_details_by_default_only_for_the_tests_memlab_flagged(inner):
    """The JSON and HTML reports stay small on a large suite: a passing
    test carries its figures; its timeline, marks and leak text come only
    for the tests memlab failed or warned of, or for all with
    --memlab-details=all."""
    import json

    inner.makepyfile(test_d="""
import pytest, torch

@pytest.mark.cpu_memory
def test_passes():
    x = torch.empty(2**20, dtype=torch.uint8)

@pytest.mark.cpu_memory(max="1K")
def test_over():
    x = torch.empty(2**20, dtype=torch.uint8)
""")
    inner.runpytest_inprocess("--memlab-json=r.json").assert_outcomes(passed=1, failed=1)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((inner.path / "r.json").read_text())["tests"]}
    assert tests["test_passes"]["devices"]["cpu"]["detail"] is None
    assert tests["test_passes"]["devices"]["cpu"]["peak"] == 2**20
    assert tests["test_over"]["devices"]["cpu"]["detail"]["timeline"]
    assert all(len(json.dumps(t)) < 4096 for t in tests.values())
    inner.runpytest_inprocess("--memlab-json=r.json", "--memlab-details=all").assert_outcomes(passed=1, failed=1)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((inner.path / "r.json").read_text())["tests"]}
    assert tests["test_passes"]["devices"]["cpu"]["detail"]["timeline"]
    bad = inner.runpytest_inprocess("--memlab-details=some")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*'some' is not one of: flagged, all*"])


FLAGGED_SUITE = """
import pytest, torch
pytestmark = pytest.mark.cpu_memory

def test_a_plain():
    x = torch.ones(1024)

@pytest.mark.cpu_memory(max="1K")
def test_b_over_budget():
    x = torch.ones(4096)
"""


def test_the_html_report_opens_on_the_flagged_test_and_says_why_a_timeline_is_missing(inner, tmp_path):
    """Under the default --memlab-details=flagged the page opens on the
    test memlab failed, and a test kept without a timeline says why and
    how to keep it (not "measured without the torch bridge", which the
    header would contradict)."""
    inner.makepyfile(test_flagged=FLAGGED_SUITE)
    result = inner.runpytest_inprocess("-p", "no:randomly", "--memlab-html=r.html")
    result.assert_outcomes(passed=1, failed=1)
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (ci/install installs Debian's chromium)")
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    page = (inner.path / "r.html").as_uri()
    dom = subprocess.run(common + ["--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
    detail = dom.split('id="detail"', 1)[1].split("<script", 1)[0]
    assert "test_flagged.py::test_b_over_budget (cpu" in detail.split("</h2>")[0]
    assert '<svg width="900" height="300" class="timeline"' in detail
    dom = subprocess.run(common + ["--dump-dom", page + "#test=0"], capture_output=True, text=True, timeout=120).stdout
    detail = dom.split('id="detail"', 1)[1].split("<script", 1)[0]
    assert "test_flagged.py::test_a_plain (cpu" in detail.split("</h2>")[0]
    assert "no timeline: the reports keep timelines only for the tests memlab failed" in detail
    assert "--memlab-details=all" in detail and "without the torch bridge" not in detail


def _browse(page, tmp_path, fragment=""):
    """The page as Chromium leaves it (the DOM after its script ran), with
    no script error."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (ci/install installs Debian's chromium)")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,1000",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri() + fragment],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "data-errors" not in dom.stdout.split("<body", 1)[0], dom.stdout[:500]
    return dom.stdout


def _seen(dom):
    """What a reader sees of a page: its text outside the scripts (and
    outside the data they carry), tooltips left out."""
    text = re.sub(r"<script.*?</script>|<style.*?</style>|<title>.*?</title>", "", dom, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", text))


def _index(dom):
    """The index's cells, by node id."""
    body = dom.split('<tbody id="rows">')[1].split("</tbody>")[0]
    rows = [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r'<tr class="row[^"]*"[^>]*>(.*?)</tr>', body)]
    return {row[0].split("::")[1]: row for row in rows}


WORDS_SUITE = """
import pytest, torch
MiB = 2**20
GROW = {grow}
KEPT = []

@pytest.mark.cpu_memory(leaks="16M")
def test_keeps():
    KEPT.append(torch.empty(8 * MiB, dtype=torch.uint8))

@pytest.mark.cpu_memory
def test_grows():
    x = torch.empty((4 if GROW else 3) * MiB, dtype=torch.uint8)

@pytest.mark.cpu_memory
def test_shrinks():
    x = torch.empty((47 if GROW else 48) * MiB, dtype=torch.uint8)

@pytest.mark.cpu_memory
def test_barely():
    x = torch.empty(16 * MiB + (1024 if GROW else 0), dtype=torch.uint8)

@pytest.mark.cpu_memory
def test_from_nothing():
    if GROW:
        x = torch.empty(8 * MiB, dtype=torch.uint8)

@pytest.mark.cpu_memory(max="4M")
def test_near():
    x = torch.empty(3 * MiB, dtype=torch.uint8)

@pytest.mark.cpu_memory(max="100K")
def test_at_999():
    x = torch.empty(999 * 1024, dtype=torch.uint8)

@pytest.mark.cpu_memory(max="100K")
def test_at_1000():
    x = torch.empty(1000 * 1024, dtype=torch.uint8)

@pytest.mark.cpu_memory(max="64K")
def test_far_over():
    for _ in range(2):
        x = torch.empty(2 * MiB + MiB // 4, dtype=torch.uint8)
        del x

if GROW:
    @pytest.mark.cpu_memory
    def test_new():
        x = torch.empty(MiB, dtype=torch.uint8)
"""


def test_the_html_report_says_what_each_figure_counts(inner, tmp_path):
    """Every figure on the page is true and reads true: the own peak of a
    test that kept 8 MiB past its teardown says so beside its 0 B; the
    line table says it counts what each line allocated over the test, not
    what was held at once; the share of the budget and the change against
    the baseline read as the terminal writes them; the header says how the
    run was measured in words, not the bridge library's name."""
    inner.makepyfile(test_words=WORDS_SUITE.format(grow=0))
    inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-update-baseline")
    inner.makepyfile(test_words=WORDS_SUITE.format(grow=1))
    result = inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-html=r.html", "--memlab-details=all")
    assert result.ret == 1
    import torch

    report = inner.path / "r.html"
    dom = _browse(report, tmp_path)
    seen = _seen(dom)
    # the header: how it was measured, in words; the library stays in the data
    assert f"measured through torch's allocators (torch {torch.__version__.split('+')[0]})" in seen
    assert "memlab_bridge" not in seen and "bridge:" not in seen and "bridge" in report.read_text()
    # the index: each column says what it counts (its tooltip, and the key above the table)
    head = dom.split('<table id="index"')[1].split("</thead>")[0]
    assert re.findall(r"<th title=\"[^\"]{20,}\">([^<]*)</th>", head) == [
        "test", "outcome", "own peak", "total peak", "reserved peak", "budget use", "leaked", "vs baseline"]
    assert "own peak: the most bytes this test's own tensors held at once, without what it kept past its teardown" in seen
    assert ("total peak: all bytes allocated on the device at their highest during the test (on the CPU: only the "
            "tensors allocated while memlab measured it)") in seen
    cells = _index(dom)
    own, use, leaked, change = 2, 5, 6, 7
    assert cells["test_keeps"][own] == "0 B (+8.0 MiB kept)" and cells["test_keeps"][leaked] == "8.0 MiB"
    assert cells["test_near"][own] == "3.0 MiB"                       # nothing kept: nothing beside it
    assert [cells[t][use] for t in ("test_near", "test_at_999", "test_at_1000", "test_far_over", "test_grows")] == [
        "75%", "999%", "10x", "36x", ""]
    assert {t: cells[t][change] for t in ("test_keeps", "test_grows", "test_shrinks", "test_barely",
                                          "test_from_nothing", "test_new")} == {
        "test_keeps": "same", "test_grows": "+33.3%", "test_shrinks": "-2.1%", "test_barely": "+0.0%",
        "test_from_nothing": "+8.0 MiB", "test_new": "new"}
    # the detail of the test that kept 8 MiB: the figure, its line table, its timeline
    nodeids = sorted(f"test_words.py::{name}" for name in cells)
    dom = _browse(report, tmp_path, f"#test={nodeids.index('test_words.py::test_keeps')}")
    detail = _seen(dom.split('id="detail"', 1)[1])
    assert "own peak 0 B (and 8.0 MiB kept past teardown, not counted in it)" in detail
    assert "allocated by the line over the test (not held at once)" in detail
    assert "bytes allocated" not in detail
    assert "own: bytes held by tensors this test allocated, the 8.0 MiB it kept past teardown included" in detail
    assert "8.0 MiB kept past teardown (not in the own peak)" in detail
    dom = _browse(report, tmp_path, f"#test={nodeids.index('test_words.py::test_far_over')}")
    detail = _seen(dom.split('id="detail"', 1)[1])
    assert "own peak 2.3 MiB; budget max 64.0 KiB (36x: the own peak is 36 times it); total peak 2.3 MiB" in detail
    assert "budget: max 64.0 KiB" in detail and "budget on the own peak (the marker's max)" in detail
    dom = _browse(report, tmp_path, f"#test={nodeids.index('test_words.py::test_grows')}")
    detail = _seen(dom.split('id="detail"', 1)[1])
    assert "own peak 4.0 MiB; total peak 4.0 MiB" in detail and " kept" not in detail
    assert "against the baseline: +33.3% (the baseline's own peak: 3.0 MiB)" in detail


MARKS_SUITE = """
import pytest, torch
MiB = 2**20
pytestmark = pytest.mark.cpu_memory

def test_training_step(memlab):   # the demo's: a mark and a phase at one event
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(1024, 512)
    for _ in range(2):
        loss = model(x).square().mean()
        memlab.mark("loss computed")
        loss.backward()
        opt.step()
        opt.zero_grad()

def test_many_marks(memlab):
    keep = []
    for i in range(60):
        keep.append(torch.empty(1024 * (i % 7 + 1), dtype=torch.uint8))
        memlab.mark(f"step {i}" + (" after a long warm-up" if i % 10 == 0 else ""))

@pytest.fixture(scope="module")
def table():
    return torch.empty(4 * MiB, dtype=torch.uint8)

def test_beside_a_module_fixture(table):
    x = torch.empty(MiB, dtype=torch.uint8)
    del x
    y = torch.empty(2 * MiB, dtype=torch.uint8)
"""


def _labels(svg):
    """The mark labels drawn under the x axis: (x, y, width, text)."""
    return [(float(x), float(y), float(w), html.unescape(text)) for x, y, w, text in re.findall(
        r'<text x="([\d.]+)" y="([\d.]+)" fill="[^"]+" class="mark-label" data-w="([\d.]+)">([^<]*)</text>', svg)]


def _ticks(svg):
    return re.findall(r'class="y-tick">([^<]*)</text>', svg)


def test_the_html_timeline_says_what_its_axes_and_lines_are(inner, tmp_path):
    """The timeline's x axis says it is time counted in allocator events;
    its y ticks are round sizes; the mark and phase labels never overlap
    (a label with no room is its line's tooltip, and the axis says so);
    the legend names only what is drawn, the total where it differs from
    the own bytes."""
    inner.makepyfile(test_marks=MARKS_SUITE)
    result = inner.runpytest_inprocess("-p", "no:randomly", "--memlab-report=json:r.json,html:r.html",
                                       "--memlab-details=all")
    result.assert_outcomes(passed=3)
    tests = {t["nodeid"].split("::")[1]: (i, t["devices"]["cpu"])
             for i, t in enumerate(json.loads((inner.path / "r.json").read_text())["tests"])}
    MiB = 2**20
    for name in ("test_training_step", "test_many_marks", "test_beside_a_module_fixture"):
        i, figures = tests[name]
        dom = _browse(inner.path / "r.html", tmp_path, f"#test={i}")
        detail = dom.split('id="detail"', 1)[1]
        svg = detail.split("<svg", 1)[1].split("</svg>")[0]
        events = figures["detail"]["events"]
        assert f">time, in allocator events ({events} in this test; not seconds)" in svg
        # round ticks: 0, then 1, 2 or 5 times a power of ten apart, in the unit of the top
        ticks = _ticks(svg)
        assert ticks[0] == "0" and len(ticks) <= 6, ticks
        unit = ticks[-1].split()[1]
        values = [float(t.split()[0]) for t in ticks[1:]]
        assert all(t.endswith(" " + unit) for t in ticks[1:]), ticks
        step = values[0]
        assert all(abs(v - step * (k + 1)) < 1e-9 for k, v in enumerate(values)), ticks
        assert re.fullmatch(r"(1|2|5)(0*|\.0*)|0\.0*(1|2|5)", f"{step:g}"), ticks
        # the axis ends at the first tick at or above what is drawn (the own bytes, and the total where drawn)
        scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
        drawn = max(max(p[2], p[4] if 'class="total"' in svg else 0) for p in figures["detail"]["timeline"])
        assert values[-1] * scale >= drawn > (values[-1] - step) * scale, (ticks, drawn)
        # the own peak still marked and labelled
        assert f">own peak {figures['peak'] / MiB:.1f} MiB at test_marks.py:" in svg or figures["peak"] < MiB
        # the labels: none overlaps another (rows at least a line apart)
        labels = _labels(svg)
        rows = sorted({y for _, y, _, _ in labels})
        assert all(b - a >= 13 for a, b in zip(rows, rows[1:])), rows
        for row in rows:
            spans = sorted((x, x + w) for x, y, w, _ in labels if y == row)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), (row, spans)
        marks = figures["detail"]["marks"]
        # each line has its label and event as a tooltip; the labels with no room say so
        assert svg.count(" (allocator event ") == len(marks)
        hidden = len(marks) - len(labels)
        if hidden:
            assert f"; {hidden} labels had no room: hover their lines" in svg
        legend = _seen(detail.split('class="legend">', 1)[1].split("<svg", 1)[0])
        assert "own: bytes held by tensors this test allocated" in legend and "device total" not in legend
        if name == "test_training_step":
            # every label drawn: "loss computed" and "backward" at one event, in two rows
            assert ticks == ["0", "10 MiB", "20 MiB", "30 MiB", "40 MiB"] or figures["peak"] > 40 * MiB
            assert [text for _, _, _, text in labels] == [m["label"] for m in marks] == [
                "forward Sequential", "loss computed", "backward", "Adam.step"] * 2
            at = {}
            for (x, y, _, text), m in zip(labels, marks):
                at.setdefault(m["at"], set()).add(y)
            assert any(len(ys) == 2 for ys in at.values())
            assert "start of a phase (forward, backward, optimizer step)" in legend
            assert "memlab.mark(label) in the test" in legend
        if name == "test_many_marks":
            assert len(marks) == 60 and 0 < hidden < 60 and len(rows) == 4
            assert "start of a phase" not in legend and "memlab.mark(label) in the test" in legend
        if name == "test_beside_a_module_fixture":
            # the module fixture's 4 MiB count in the total, not in the own bytes: both drawn, both named
            assert 'class="total"' in svg and 'class="own"' in svg
            assert "total: all CPU tensors allocated while memlab measured (the test and its fixtures)" in legend
            assert ticks == ["0", "2 MiB", "4 MiB", "6 MiB"]
        else:
            assert 'class="total"' not in svg
            assert "total: the same as own here (nothing else was allocated while memlab measured)" in legend


SUMMARY_SUITE = """
import pytest, torch
MiB = 2**20
GROW = {grow}
_TABLE = {{}}
_GROWS = []

DEV = "cuda" if torch.cuda.is_available() else "cpu"   # what an unmarked test measures

def constant(dtype):
    if dtype not in _TABLE:
        _TABLE[dtype] = torch.ones(1024, dtype=dtype, device=DEV)
    return _TABLE[dtype]

@pytest.mark.cpu_memory
def test_model():
    weights = torch.empty(2 * MiB + GROW, dtype=torch.uint8)
    weights.fill_(1)

@pytest.mark.cpu_memory(max="1M")
def test_over():
    x = torch.empty(3 * MiB, dtype=torch.uint8)
    x.fill_(1)

@pytest.mark.cpu_memory
def test_keeps():
    _GROWS.append(torch.empty(MiB // 2, dtype=torch.uint8))

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float32, torch.float64])
def test_uses_the_cache(dtype):
    constant(dtype).sum()
"""


def test_the_pull_request_summary_is_appended_where_github_says(inner, monkeypatch):
    """$GITHUB_STEP_SUMMARY set: each run appends its section, whose tables
    render as tables (markdown-it, GitHub's flavour of tables) and hold the
    run's figures: the test memlab failed, the regression against the
    baseline with the line that grew, the leak, the cache."""
    markdown_it = pytest.importorskip("markdown_it")
    summary = inner.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    inner.makepyfile(test_suite=SUMMARY_SUITE.format(grow=0))
    inner.runpytest_inprocess("--memlab-baseline=bl.json", "--memlab-update-baseline", "-p", "no:randomly")
    first = summary.read_text()
    import torch

    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert first.startswith("## pytest-memlab\n") and "7 tests measured · 2 failed by memlab" in first
    inner.makepyfile(test_suite=SUMMARY_SUITE.format(grow="MiB"))
    result = inner.runpytest_inprocess("--memlab-baseline=bl.json", "-p", "no:randomly")
    result.assert_outcomes(passed=5, failed=2, errors=1)
    text = summary.read_text()
    assert text.startswith(first) and text.count("## pytest-memlab") == 2
    second = text[len(first):]
    assert "7 tests measured · 3 failed by memlab · baseline: 1 regressed, 0 improved, 0 new · 1 leaking" in second
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(second)
    tables = [[[cell.split(">", 1)[1].split("</t")[0] for cell in row.split("<t")[1:] if cell[:2] in ("d>", "h>")
                or cell.startswith(("d ", "h "))]
               for row in table.split("<tr>")[1:]] for table in html.split("<table>")[1:]]
    assert tables[0] == [["test", "for", "own peak"],
                         ["<code>test_suite.py::test_keeps</code>", "cpu leaks", "cpu 0 B"],
                         ["<code>test_suite.py::test_model</code>", "cpu baseline", "cpu 3.0 MiB"],
                         ["<code>test_suite.py::test_over</code>", "cpu max", "cpu 3.0 MiB"]]
    assert tables[1][0] == ["test", "device", "baseline", "now", "change", "what grew where"]
    assert tables[1][1][:5] == ["<code>test_suite.py::test_model</code>", "cpu", "2.0 MiB", "3.0 MiB", "+50.0%"]
    assert tables[1][1][5].startswith("+1.0 MiB <code>weights = torch.empty(2 * MiB + GROW, dtype=torch.uint8)</code>")
    assert tables[2] == [["test", "device", "left"], ["<code>test_suite.py::test_keeps</code>", "cpu", "512.0 KiB"]]
    assert tables[3] == [["holder", "device", "bytes", "filled by"],
                         ["<code>module test_suite, global _TABLE</code>", dev, "12.0 KiB",
                          "<code>test_suite.py::test_uses_the_cache[dtype0]</code>"]]


def test_the_summary_follows_its_option(inner, monkeypatch):
    """--memlab-summary=PATH writes there; off writes none, $GITHUB_STEP_SUMMARY
    set or not; an empty one is a usage error."""
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(inner.path / "github.md"))
    inner.makepyfile(test_suite=SUITE)
    inner.runpytest_inprocess("--memlab-summary=mine.md")
    assert (inner.path / "mine.md").read_text().startswith("## pytest-memlab\n")
    assert not (inner.path / "github.md").exists()
    inner.runpytest_inprocess("--memlab-summary=off")
    assert not (inner.path / "github.md").exists()
    result = inner.runpytest_inprocess("--memlab-summary=")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--memlab-summary names no file (write --memlab-summary=PATH, or off)"])
