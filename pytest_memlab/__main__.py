"""``python -m pytest_memlab merge OUT IN...``: combines the baselines that
CI shards wrote (one per slice of the suite) into one file.

Every input is read and checked before anything is written; OUT need not
exist, and its entries that no input has are kept.  A test that two inputs
both measured keeps the later input's figures, and the command says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .judging.baseline_file import BaselineError, merge


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_memlab")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    m = commands.add_parser("merge", help="merge the baselines of CI shards into one",
                            description="Merges baseline files (written by shards with "
                                        "--memlab-update-baseline) into OUT, atomically, under OUT's lock.")
    m.add_argument("out", metavar="OUT", type=Path, help="the baseline to write (created if missing)")
    m.add_argument("inputs", metavar="IN", type=Path, nargs="+", help="baselines written by the shards")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
