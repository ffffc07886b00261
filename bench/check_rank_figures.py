"""Each rank judged on its own device, checked on a real distributed suite
(torch's multi-process harness, one GPU per rank): runs the suite once
unmeasured and once under ``--memlab-json``, both with bench/rank_probe.py
recording what each rank reads itself, and checks, test by test:

- the outcomes are the same;
- each rank's own peak in the report equals the rank's own
  ``torch.cuda.max_memory_allocated`` over its life, to the byte;
- each rank lists only the device it used, and balanced ranks (equal own
  peaks) show a spread of 0 B;
- each rank holds a CUDA context on the same GPUs measured and unmeasured
  (its own: measuring makes none elsewhere).

    python bench/check_rank_figures.py SUITE_DIR [--out FILE] -- PYTEST_ARGS...

The suite's test files import ``rank_probe`` (this folder is put on the
path).  Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))


def run(suite: str, args: list[str], probe: str, measured: bool, tmp: str) -> tuple[dict, dict | None, str]:
    junit = os.path.join(tmp, f"{'on' if measured else 'off'}.xml")
    report = os.path.join(tmp, "r.json")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *args]
    cmd += [f"--memlab-json={report}"] if measured else ["-p", "no:memlab"]
    env = dict(os.environ, MEMLAB_RANK_PROBE=probe,
               PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=suite, capture_output=True, text=True, env=env)
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kind = next((k for k in ("failure", "error", "skipped") if case.find(k) is not None), "passed")
        outcomes[case.get("name")] = kind
    data = json.load(open(report)) if measured else None
    return outcomes, data, proc.stdout[-3000:]


def probes(folder: str) -> dict:
    out = {}
    for name in os.listdir(folder):
        test, _, rank = name[:-len(".json")].rpartition("-rank")
        out.setdefault(test, {})[int(rank)] = json.load(open(os.path.join(folder, name)))
    return out


def main() -> int:
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite")
    ap.add_argument("--out", help="append the summary (markdown) to this file")
    args = ap.parse_args(argv)
    problems, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        off_probe, on_probe = os.path.join(tmp, "off"), os.path.join(tmp, "on")
        os.makedirs(off_probe)
        os.makedirs(on_probe)
        off, _, off_tail = run(args.suite, extra, off_probe, False, tmp)
        on, data, on_tail = run(args.suite, extra, on_probe, True, tmp)
        plain, measured = probes(off_probe), probes(on_probe)
    print(off_tail.strip().splitlines()[-1] if off_tail.strip() else "", flush=True)
    print(on_tail.strip().splitlines()[-1] if on_tail.strip() else "", flush=True)
    for name in sorted(set(off) | set(on)):
        if off.get(name) != on.get(name):
            problems.append(f"{name}: {off.get(name)} unmeasured, {on.get(name)} measured")
    checked = 0
    for test in data["tests"]:
        name = test["nodeid"].rpartition("::")[2]
        ranks = {p["rank"]: p for p in test.get("processes", []) if p.get("rank") is not None}
        if name not in measured or not ranks:
            continue
        row = []
        for rank, seen in sorted(measured[name].items()):
            p = ranks.get(rank)
            if p is None or p.get("state") != "done":
                problems.append(f"{name} rank {rank}: no figures in the report")
                continue
            own = f"cuda:{seen['device']}"
            if sorted(p["devices"]) != [own]:
                problems.append(f"{name} rank {rank}: devices {sorted(p['devices'])}, it used {own}")
            peak = p["devices"].get(own, {}).get("peak")
            if peak != seen["max_memory_allocated"]:
                problems.append(f"{name} rank {rank}: own peak {peak}, max_memory_allocated "
                                f"{seen['max_memory_allocated']}")
            unmeasured = plain.get(name, {}).get(rank, {}).get("gpus")
            if seen["gpus"] != unmeasured:
                problems.append(f"{name} rank {rank}: a context on GPUs {seen['gpus']} measured, {unmeasured} not")
            row.append(f"rank {rank} on {own} {peak} B (max_memory_allocated {seen['max_memory_allocated']} B; "
                       f"contexts on GPUs {seen['gpus']} measured, {unmeasured} unmeasured)")
            checked += 1
        across = test.get("across_processes", {}).get("cuda", {})
        peaks = {r: ranks[r]["devices"].get(f"cuda:{measured[name][r]['device']}", {}).get("peak")
                 for r in measured[name] if r in ranks}
        if len(set(peaks.values())) == 1 and across.get("spread") != 0:
            problems.append(f"{name}: balanced ranks, spread {across.get('spread')}")
        lines.append(f"- `{name}` ({on.get(name)}): " + "; ".join(row) + f"; spread {across.get('spread')} B")
    text = "\n".join([f"each rank on its own device, {args.suite}: `{' '.join(extra)}`", "",
                      f"- outcomes: {len(on)} tests, identical measured and unmeasured: "
                      f"{'yes' if not any('unmeasured,' in p for p in problems) else 'NO'}",
                      f"- ranks checked: {checked}; problems: {len(problems)}", *lines])
    print(text)
    for p in problems:
        print("  PROBLEM " + p)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")
    return 1 if problems or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
