"""python -m benchmarks [--quick] [--out DIR]: the idle-time suite (see benchmarks/suite.py)."""

import argparse
import sys

from benchmarks import _noise, suite


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=suite.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="50k rows, fewer steps and 2 repeats of each compared pipeline (not 3): proves the suite runs (< 3 min)",
    )
    p.add_argument("--out", default="bench-out/suite", help="where results.json and the plots go")
    p.add_argument("--workdir", default="bench-out/data", help="generated corpora and datasets (reused)")
    args = p.parse_args(argv)
    before = _noise.Machine.read()
    results = suite.run(args.out, quick=args.quick, workdir=args.workdir)
    busy = _noise.busy_warning(before, _noise.Machine.read())
    print(suite.table(results))
    print()
    print(suite.verdicts(results))
    if busy:
        print(busy)
    print(
        f"\nresults: {args.out}/results.json, plots: {args.out}/idle_by_scenario.png, {args.out}/wait_timeline.png, "
        f"{args.out}/layouts_sweep.png"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
