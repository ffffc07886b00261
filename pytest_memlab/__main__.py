"""``python -m pytest_memlab COMMAND``: the plugin's tools for CI.

``merge OUT IN...`` combines the baselines that CI shards wrote (one per
slice of the suite) into one file.  Every input is read and checked before
anything is written; OUT need not exist, and its entries that no input has
are kept.  A test that two inputs both measured keeps the later input's
figures, and the command says so.

``compare OLD NEW`` compares two runs' figures (each a baseline file, one
lane of it, or a JSON report): each test's own peak, under a tolerance, as
the plugin compares a run with its baseline; what regressed or improved,
with the lines that moved it where both sides kept them, as text or as
Markdown for a pull request's comment.  Exit status 1 when anything
regressed (or, with --fail-on-improvement, improved), 0 otherwise, 2 on
input that cannot be compared.  The logic is
:mod:`pytest_memlab.judging.compare_runs`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .judging.baseline_file import BaselineError, merge
from .judging.verdicts import DEFAULT_TOLERANCE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_memlab")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    m = commands.add_parser("merge", help="merge the baselines of CI shards into one",
                            description="Merges baseline files (written by shards with "
                                        "--memlab-update-baseline) into OUT, atomically, under OUT's lock.")
    m.add_argument("out", metavar="OUT", type=Path, help="the baseline to write (created if missing)")
    m.add_argument("inputs", metavar="IN", type=Path, nargs="+", help="baselines written by the shards")
    c = commands.add_parser(
        "compare", help="compare two runs' memory (baselines or JSON reports)",
        description="Compares each test's own peak in NEW with OLD's, as the plugin compares a run with its "
                    "baseline, and shows what regressed or improved beyond the tolerance, with the lines that "
                    "moved it. Exit status: 1 when anything regressed, 0 otherwise, 2 on bad input.")
    c.add_argument("old", metavar="OLD", help="a baseline file or a JSON report (--memlab-json): the reference")
    c.add_argument("new", metavar="NEW", help="a baseline file or a JSON report: the run judged")
    c.add_argument("--env", metavar="NAME",
                   help="the lane of a baseline to compare (default: its only lane, else 'cuda', else 'cpu')")
    c.add_argument("--tolerance", metavar="SPEC", default=DEFAULT_TOLERANCE,
                   help=f"allowed growth: '5%%', '16MiB' or '5%%,1MiB', the larger applies "
                        f"(default {DEFAULT_TOLERANCE.replace('%', '%%')})")
    c.add_argument("--format", choices=("text", "markdown"), default="text",
                   help="text (default) or markdown (a pull request's comment)")
    c.add_argument("--fail-on-improvement", action="store_true",
                   help="an improvement beyond the tolerance exits 1 too, so that the baseline stays tight")
    args = parser.parse_args(argv)
    if args.command == "compare":
        return _compare(args)
    missing = [str(p) for p in args.inputs if not p.is_file()]
    if missing:
        print(f"pytest-memlab merge: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        result, conflicts = merge(args.out, args.inputs)
    except BaselineError as exc:
        print(f"pytest-memlab merge: {exc}; {args.out} was not written", file=sys.stderr)
        return 2
    for conflict in conflicts:
        print(f"pytest-memlab merge: measured twice: {conflict}", file=sys.stderr)
    envs = ", ".join(f"{name}: {len(env.tests)} test{'' if len(env.tests) == 1 else 's'}" for name, env in sorted(result.environments.items()))
    print(f"pytest-memlab merge: {len(args.inputs)} files into {args.out} ({envs})")
    return 0


def _compare(args) -> int:
    from .judging.compare_runs import InputError, compare_runs, load, pick_tolerance, render_markdown, render_text

    try:
        tolerance = pick_tolerance(args.tolerance)
        old = load(args.old, args.env)
        new = load(args.new, args.env)
    except InputError as exc:
        print(f"pytest-memlab compare: {exc}", file=sys.stderr)
        return 2
    comparison = compare_runs(old, new, tolerance)
    render = render_markdown if args.format == "markdown" else render_text
    sys.stdout.write(render(comparison, args.fail_on_improvement))
    return 1 if comparison.failed(args.fail_on_improvement) else 0


if __name__ == "__main__":
    sys.exit(main())
