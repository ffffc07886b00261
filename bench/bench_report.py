"""What the JSON and HTML reports of a large suite weigh, and how fast the
HTML opens: a suite of N tests (default 2000), each a few allocations with a
mark (so that every test has a timeline with points and a mark), run once
under ``--memlab-report=json:...,html:...``; then headless Chromium opens
the HTML report five times and the page says when it was ready (the index
rendered and the first test's timeline drawn: ``data-ready-ms``, from the
start of navigation).  The same for a one-test report, side by side, so the
figure reads against the browser's own start.

    python bench/bench_report.py [--tests N] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SUITE = '''
import pytest, torch
MiB = 2**20

@pytest.mark.parametrize("n", range({n}))
def test_step(memlab, n):
    keep = [torch.empty((n % 7 + 1) * 64 * 1024, dtype=torch.uint8) for _ in range(8)]
    memlab.mark("allocated")
    for _ in range(16):
        t = torch.empty(MiB, dtype=torch.uint8)
        del t
    del keep
'''


def run_suite(folder: str, n: int, details: str = "flagged") -> tuple[str, str, float]:
    with open(os.path.join(folder, "test_many.py"), "w") as f:
        f.write(SUITE.replace("{n}", str(n)))
    with open(os.path.join(folder, "pytest.ini"), "w") as f:
        f.write("[pytest]\naddopts = -p no:cacheprovider -p no:randomly -p no:xdist\n")
    html, js = os.path.join(folder, "r.html"), os.path.join(folder, "r.json")
    env = {**os.environ, "MEMLAB_CORE": os.environ.get("MEMLAB_CORE", "bridge")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", f"--memlab-report=json:{js},html:{html}",
                           f"--memlab-details={details}", "-p", "no:memray"], cwd=folder, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the suite failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return html, js, time.perf_counter() - t0


def ready_ms(chromium: str, html: str, profile: str) -> tuple[float, float]:
    """(the page's own ready time, the browser process's wall time), ms."""
    t0 = time.perf_counter()
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                           "--dump-dom", "file://" + html], capture_output=True, text=True, timeout=300)
    wall = (time.perf_counter() - t0) * 1000
    found = re.search(r'data-ready-ms="(\d+)"', proc.stdout)
    if found is None or "data-errors" in proc.stdout.split("<body", 1)[0]:
        raise SystemExit(f"the page did not get ready:\n{proc.stdout[:2000]}\n{proc.stderr[-2000:]}")
    return float(found.group(1)), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="append the table (markdown) to this file")
    args = ap.parse_args()
    chromium = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                    None)
    rows = []
    with tempfile.TemporaryDirectory() as big, tempfile.TemporaryDirectory() as small:
        cases = [(f"{args.tests} tests (default: details of flagged tests)", big, args.tests, "flagged"),
                 (f"{args.tests} tests, --memlab-details=all", big, args.tests, "all"),
                 ("1 test, --memlab-details=all", small, 1, "all")]
        for label, folder, n, details in cases:
            html, js, run_s = run_suite(folder, n, details)
            ready = wall = None
            if chromium:
                ready_ms(chromium, html, os.path.join(folder, "profile"))    # warm the browser's caches
                measured = [ready_ms(chromium, html, os.path.join(folder, "profile")) for _ in range(args.rounds)]
                ready = statistics.median(m[0] for m in measured)
                wall = statistics.median(m[1] for m in measured)
            import json

            per_test = statistics.median(len(json.dumps(t, indent=2)) for t in json.load(open(js))["tests"])
            rows.append((label, os.path.getsize(html), os.path.getsize(js), per_test, run_s, ready, wall))
    import platform

    lines = [f"Reports of a suite of trivial-but-marked tests (8 kept and 16 passing allocations, one mark each); "
             f"Python {platform.python_version()}; Chromium headless, median of {args.rounds} loads", "",
             "| report of | HTML size | JSON size | JSON per test, median (target <= 4 KiB) | suite run (s) | "
             "page ready (ms, from navigation start; target <= 2000) | browser process (ms) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for label, html_size, json_size, per_test, run_s, ready, wall in rows:
        lines.append(f"| {label} | {html_size / 2**20:.2f} MiB | {json_size / 2**20:.2f} MiB | "
                     f"{per_test / 1024:.1f} KiB | {run_s:.1f} | "
                     f"{'-' if ready is None else f'{ready:.0f}'} | {'-' if wall is None else f'{wall:.0f}'} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table + "\n\n")


if __name__ == "__main__":
    main()
