"""A baseline gate on a real third-party suite, as a new user would try it,
with no code changed between writing and comparing:

1. written serially in collection order, compared serially in reverse
   order (bench/memlab_shard.py reverses the items; with ``--shards N``,
   N serial processes side by side, each a consecutive part of the
   selection, the same part written and compared);
2. written under ``-n N``, compared twice under ``-n N`` (xdist schedules
   differently each run); with ``--xdist-args=--memlab-gpus-per-worker``,
   one worker per GPU; step ``xdist-serial`` compares the serial baseline
   under ``-n N`` too;
3. optionally, a growth injected into the suite's code (``--inject FILE
   AFTER NEW``: the line NEW inserted after the first line that is AFTER,
   with its indentation), compared serially with the serial baseline: each
   test that regressed should name the injected line first.

    python bench/bench_baseline_order.py SUITE_DIR --out FILE [--xdist N]
        [--inject FILE AFTER NEW] [--shards N] [--budget SECONDS] -- PYTEST_ARGS...

Counts the false regressions and improvements of each comparison from the
JSON reports (a test whose baseline is "regressed" or "improved" with no
code changed), and lists the tests with first-use memory (what it is, who
holds it).  Exit status 1 when a comparison without a change found any.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(suite: str, runs: list[tuple[list[str], dict, Path]], budget: float) -> tuple[int, float]:
    """Runs pytest once per (args, extra environment, log), side by side;
    the worst exit status (124: past the budget) and the wall time."""
    started = time.perf_counter()
    procs = []
    for args, extra_env, log in runs:
        env = dict(os.environ, **extra_env)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        f = open(log, "w")
        procs.append((subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                                       cwd=suite, env=env, stdout=f, stderr=subprocess.STDOUT), f))
    rc = 0
    for proc, f in procs:
        try:
            code = proc.wait(timeout=max(1.0, budget - (time.perf_counter() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = 124
        f.close()
        if code not in (0, 1) or rc == 0:
            rc = code
    return rc, time.perf_counter() - started


def merge_reports(parts: list[Path], into: Path) -> None:
    """The shards' JSON reports as one (their tests together)."""
    tests = []
    for part in parts:
        if part.exists():
            tests += json.loads(part.read_text())["tests"]
    if tests:
        into.write_text(json.dumps({"tests": tests}))


def merge_baselines(parts: list[Path], into: Path) -> None:
    """The shards' baselines as one file (each shard wrote its own tests)."""
    merged = None
    for part in parts:
        if not part.exists():
            continue
        data = json.loads(part.read_text())
        if merged is None:
            merged = data
        else:
            merged["tests"].update(data["tests"])
    if merged is not None:
        into.write_text(json.dumps(merged, indent=2, sort_keys=True))


def changes(report: Path) -> dict:
    data = json.loads(report.read_text())
    out = {"regressed": [], "improved": [], "same": 0, "new": 0, "first_use": [], "tests": 0, "grew_first": []}
    for t in data["tests"]:
        out["tests"] += 1
        for dev, d in t["devices"].items():
            kind = d.get("baseline")
            if kind in ("regressed", "improved"):
                out[kind].append((t["nodeid"], dev, d.get("baseline_peak"), d.get("peak"), d.get("site_changes") or []))
            elif kind in ("same", "new"):
                out[kind] += 1
            if d.get("first_use"):
                out["first_use"].append((t["nodeid"], dev, d["first_use"], d.get("first_use_held") or []))
    return out


def inject(path: Path, after: str, new: str) -> str:
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.strip() == after.strip():
            indent = line[: len(line) - len(line.lstrip())]
            lines.insert(i + 1, f"{indent}{new.strip()}\n")
            path.write_text("".join(lines))
            return text
    raise SystemExit(f"bench_baseline_order: {after!r} is not a line of {path}")


def main() -> int:
    argv = sys.argv[1:]
    pytest_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, pytest_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser()
    p.add_argument("suite")
    p.add_argument("--out", required=True)
    p.add_argument("--xdist", type=int, default=0)
    p.add_argument("--steps", default="write,reverse,xdist,inject",
                   help="which steps: write (serial), reverse (serial compare reversed), xdist, "
                        "xdist-serial (the serial baseline compared under -n N), inject")
    p.add_argument("--baseline-in", help="a serial baseline written before (a call of its own): no write step")
    p.add_argument("--baseline-out", help="where to copy the serial baseline written (for a later call)")
    p.add_argument("--xdist-baseline-in", help="an -n N baseline written before (a call of its own): no -n write")
    p.add_argument("--xdist-baseline-out", help="where to copy the -n N baseline written (for a later call)")
    p.add_argument("--xdist-compares", type=int, default=2, help="how many -n N compares after the write")
    p.add_argument("--xdist-args", default="", help="the -n N runs' own options (--memlab-gpus-per-worker)")
    p.add_argument("--inject-k", default="", help="the injected run's own -k (a subset that uses the code)")
    p.add_argument("--inject", nargs=3, metavar=("FILE", "AFTER", "NEW"))
    p.add_argument("--budget", type=float, default=540.0, help="seconds for all the runs together")
    p.add_argument("--name", default="")
    p.add_argument("--keep", help="a folder to copy the runs' logs, JSON reports and baselines into")
    p.add_argument("--shards", type=int, default=1,
                   help="the serial steps as N serial processes side by side, each a consecutive part of the "
                        "selection (bench/memlab_shard.py): the same part written and compared")
    a = p.parse_args(argv)
    suite = os.path.abspath(a.suite)
    work = Path(tempfile.mkdtemp(prefix="memlab-order-"))
    deadline = time.perf_counter() + a.budget
    rows, notes, bad = [], [], 0

    def step(label: str, extra: list[str], report: Path | None, serial: bool = False,
             reverse: bool = False, baseline_out: Path | None = None) -> dict | None:
        """One pytest run (or, serial with --shards, one per shard side by
        side: ``{shard}`` in an argument becomes the shard's number, its
        reports and baselines are merged into ``report`` and
        ``baseline_out``)."""
        nonlocal bad
        left = deadline - time.perf_counter()
        if left < 20:
            notes.append(f"{label}: not run (the budget ran out)")
            return None
        name = label.replace(" ", "_").replace(",", "")
        shards = a.shards if serial else 1
        runs = []
        procs = shards if serial else max(1, a.xdist if "-n" in extra else 1)
        for i in range(shards):
            env = {"MEMLAB_SHARD_REVERSE": "1" if reverse else "0"}
            if procs > 1 and "OMP_NUM_THREADS" not in os.environ:
                # side by side, each process's intra-op threads as many as
                # the cores allow: 4 processes of 16 threads on 16 cores
                # spin-wait each other (a 1052-test step ran past 530 s)
                env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // procs))
            if shards > 1:
                env["MEMLAB_SHARD"] = f"{i}/{shards}"
            runs.append(([*pytest_args, "-p", "memlab_shard", *(x.replace("{shard}", str(i)) for x in extra)], env,
                         work / f"{name}.{i}.log"))
        rc, took = run(suite, runs, left)
        parts = [str(i) for i in range(shards)]
        if report is not None and "{shard}" in str(report):
            merge_reports([Path(str(report).replace("{shard}", i)) for i in parts],
                          Path(str(report).replace(".{shard}", "")))
            report = Path(str(report).replace(".{shard}", ""))
        if baseline_out is not None:
            merge_baselines([Path(str(baseline_out).replace("{shard}", i)) for i in parts],
                            Path(str(baseline_out).replace(".{shard}", "")))
        tail = " / ".join(line for _, _, log in runs for line in log.read_text().strip().splitlines()[-1:])
        print(f"{label}: exit {rc}, {took:.1f} s: {tail}", flush=True)
        if rc not in (0, 1):
            print("\n".join(runs[0][2].read_text().strip().splitlines()[-25:]), flush=True)
        if report is None or not report.exists():
            rows.append((label, rc, took, tail, None))
            return None
        c = changes(report)
        rows.append((label, rc, took, tail, c))
        return c

    serial_bl, xdist_bl = work / "serial.json", work / "xdist.json"
    steps = set(a.steps.split(","))
    if a.baseline_in:
        shutil.copyfile(a.baseline_in, serial_bl)
    if a.xdist_baseline_in:
        shutil.copyfile(a.xdist_baseline_in, xdist_bl)
    compared = []
    if "write" in steps:
        part = work / "serial.{shard}.json"
        step("serial write, collection order", ["-p", "no:randomly", f"--memlab-baseline={part}",
                                                "--memlab-update-baseline", f"--memlab-json={work / 'w.{shard}.json'}"],
             work / "w.{shard}.json", serial=True, baseline_out=part)
        if a.baseline_out and serial_bl.exists():
            shutil.copyfile(serial_bl, a.baseline_out)
    if "reverse" in steps and serial_bl.exists():
        c = step("serial compare, reversed", ["-p", "no:randomly", f"--memlab-baseline={serial_bl}",
                                              f"--memlab-json={work / 'r.{shard}.json'}"],
                 work / "r.{shard}.json", serial=True, reverse=True)
        compared.append(c)
    if a.xdist and "xdist" in steps:
        n = ["-n", str(a.xdist), "-p", "no:randomly", *a.xdist_args.split()]
        if not a.xdist_baseline_in:
            step(f"-n {a.xdist} write", [*n, f"--memlab-baseline={xdist_bl}", "--memlab-update-baseline"], None)
            if a.xdist_baseline_out and xdist_bl.exists():
                shutil.copyfile(xdist_bl, a.xdist_baseline_out)
        for k in range(1, a.xdist_compares + 1):
            compared.append(step(f"-n {a.xdist} compare {k}", [*n, f"--memlab-baseline={xdist_bl}",
                                                               f"--memlab-json={work / f'x{k}.json'}"],
                                 work / f"x{k}.json"))
    if a.xdist and "xdist-serial" in steps and serial_bl.exists():
        # the serial baseline (one process, one GPU) compared under -n N:
        # what moves from the serial run to the workers (and, pinned, to
        # the other GPU) is the schedule and the device, never a figure
        n = ["-n", str(a.xdist), "-p", "no:randomly", *a.xdist_args.split()]
        compared.append(step(f"-n {a.xdist} compare, serial baseline", [*n, f"--memlab-baseline={serial_bl}",
                                                                        f"--memlab-json={work / 'xs.json'}"],
                             work / "xs.json"))
    injected = None
    if a.inject and "inject" in steps and serial_bl.exists():
        file, after, new = a.inject
        target = Path(suite) / file
        original = inject(target, after, new)
        saved = list(pytest_args)
        if a.inject_k:   # pytest takes the last -k: the run's own selection and the subset together
            if "-k" in pytest_args:
                i = pytest_args.index("-k")
                pytest_args[i + 1] = f"({pytest_args[i + 1]}) and ({a.inject_k})"
            else:
                pytest_args += ["-k", a.inject_k]
        try:
            injected = step("serial compare, growth injected", ["-p", "no:randomly", f"--memlab-baseline={serial_bl}",
                                                                f"--memlab-json={work / 'i.json'}"], work / "i.json")
        finally:
            target.write_text(original)
            pytest_args[:] = saved
    for c in compared:
        if c is not None:
            bad += len(c["regressed"]) + len(c["improved"])

    lines = [f"### {a.name or 'A baseline on a real suite'}: written and compared with nothing changed", "",
             *([f"Serial steps: {a.shards} serial processes side by side, each a consecutive part of the "
                f"selection, the same part written (collection order) and compared (reversed).", ""]
               if a.shards > 1 else []),
             f"`{' '.join(shlex.quote(x) for x in pytest_args)}` in `{a.suite}`", "",
             "| run | exit | wall s | tests | same | regressed | improved | first use | pytest's last line |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, rc, took, tail, c in rows:
        if c is None:
            lines.append(f"| {label} | {rc} | {took:.1f} | | | | | | {tail} |")
        else:
            lines.append(f"| {label} | {rc} | {took:.1f} | {c['tests']} | {c['same']} | {len(c['regressed'])} | "
                         f"{len(c['improved'])} | {len(c['first_use'])} | {tail} |")
    lines.append("")
    for label, rc, took, tail, c in rows:
        if c is None:
            continue
        for kind in ("regressed", "improved"):
            for nodeid, dev, old, new, sc in c[kind][:10]:
                what = "; ".join(f"{x.get('function')}: {x.get('text')} ({x.get('old')} -> {x.get('new')} B)"
                                 for x in sc[:3])
                lines.append(f"- {label}: {kind} `{nodeid}` {dev}: {old} -> {new} B" + (f"; {what}" if what else ""))
        for nodeid, dev, n, held in c["first_use"][:8]:
            lines.append(f"- {label}: first use in `{nodeid}` {dev}: {n} B; " + "; ".join(held))
    if injected is not None:
        named = sum(1 for _, _, _, _, sc in injected["regressed"] if sc and a.inject[2].strip()[:60] in sc[0]["text"])
        lines += ["", f"Growth injected (`{a.inject[2].strip()}` after `{a.inject[1].strip()}` in {a.inject[0]}): "
                  f"{len(injected['regressed'])} tests regressed, {named} of them name the injected line first."]
        for nodeid, dev, old, new, sc in injected["regressed"][:6]:
            first = sc[0] if sc else {}
            lines.append(f"- `{nodeid}` {dev}: {old} -> {new} B; first: {first.get('file')} {first.get('function')}: "
                         f"{first.get('text')} ({first.get('old')} -> {first.get('new')} B)")
        others = [(n, sc[0]["text"] if sc else None) for n, _, _, _, sc in injected["regressed"]
                  if not sc or a.inject[2].strip()[:60] not in sc[0]["text"]]
        for nodeid, text in others[:6]:
            lines.append(f"- not named first: `{nodeid}`: first change {text!r}")
    lines += [""] + [f"- {n}" for n in notes]
    lines.append(f"\nFalse regressions and improvements, all comparisons without a change: **{bad}**")
    text = "\n".join(lines) + "\n"
    Path(a.out).write_text(text)
    if a.keep:   # the runs' logs, reports and baselines, for a look after the call
        shutil.copytree(work, a.keep, dirs_exist_ok=True)
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
