"""Moves the fast tier's costly tests to the slow tier, from a measured run.

    make test-fast PYTEST_ARGS=--durations=0 > fast.log
    python scripts/tier_tests.py fast.log            # adds tests over 0.7 s to tests/slow_tests.txt

A test's cost is the sum of its phases (setup, call, teardown) in pytest's durations
report, measured on a quiet 2-core machine. The slow tier still runs in `make test` (CI);
only the working loop, `make test-fast`, leaves them out. Tests listed but no longer
collected are harmless (tests/_tiers.py marks what it finds); rerun this on a fresh log
to prune the list (--replace).
"""

from __future__ import annotations

import argparse
import collections
import os
import re

LIST = os.path.join(os.path.dirname(__file__), os.pardir, "tests", "slow_tests.txt")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*)$")


def costs(lines) -> dict:
    """{node id: seconds, its phases summed} from a pytest durations report."""
    out = collections.defaultdict(float)
    for line in lines:
        m = _DURATION.match(line.strip())
        if m:
            out[m.group(3).strip()] += float(m.group(1))
    return dict(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="output of a test-fast run with --durations=0")
    parser.add_argument("--over", type=float, default=0.7, help="seconds a test may take in the fast tier")
    parser.add_argument("--replace", action="store_true", help="write the measured list alone (prunes the old)")
    args = parser.parse_args(argv)
    with open(args.log, errors="replace") as f:
        measured = costs(f)
    if not measured:
        parser.error(f"{args.log} holds no durations report: run pytest with --durations=0")
    slow = {node for node, seconds in measured.items() if seconds >= args.over}
    header, listed = [], set()
    if os.path.exists(LIST):
        with open(LIST) as f:
            for line in f:
                if line.startswith("#"):
                    header.append(line)
                elif line.strip():
                    listed.add(line.strip())
    kept = slow if args.replace else slow | listed
    with open(LIST, "w") as f:
        f.writelines(header)
        f.writelines(f"{node}\n" for node in sorted(kept))
    print(f"{len(slow - listed)} tests added, {len(kept)} listed in {os.path.normpath(LIST)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
