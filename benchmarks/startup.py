"""Start-up: how long before the first batch, in a fresh process and for a new iterator.

A trainer pays the first in every process it starts (each worker, each restart after
preemption); Keras pays the second at every epoch of a finite dataset, and an evaluation
split at every evaluation. Compared with the strongest hand-written pipeline over the
same corpus in row records (`hand_tuned_rows`) and with the in-memory Parquet peer
(whose table load is its start-up).

- fresh process: `python -c` in a child with TensorFlow and the packages imported
  beforehand, timed from before the pipeline is built to its first batch (building
  traces its functions; the first batch instantiates them and reads).
- new iterator: `iter(ds)` and its first batch, over a dataset built once and already
  iterated, after the previous iterator was consumed to its end (as Keras does).

Medians of `--runs` each.

    python -m benchmarks.startup [--rows 500000] [--shards 16] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from benchmarks import _measure, corpus


def _make(which: str, paths: dict, batch_size: int):
    import ingest
    from benchmarks import pipelines

    if which == "make_dataset":
        return ingest.make_dataset(paths["blocks"], batch_size=batch_size, shuffle=True)
    if which == "hand_tuned_rows":
        return pipelines.hand_tuned_rows(paths["rows"], batch_size=batch_size)
    return pipelines.parquet_in_memory(paths["parquet"], batch_size=batch_size)


def _child(which: str, paths: dict, batch_size: int) -> None:
    import tensorflow as tf  # noqa: F401  (imported before the clock starts)

    import ingest.pipeline._dataset  # noqa: F401  (the package as a trainer has imported it)
    from benchmarks import pipelines  # noqa: F401

    start = time.perf_counter()
    ds = _make(which, paths, batch_size)
    built = time.perf_counter()
    next(iter(ds))
    done = time.perf_counter()
    print(json.dumps({"build_s": built - start, "first_batch_s": done - built, "total_s": done - start}))


def new_iterator_seconds(ds, runs: int) -> list:
    """iter(ds) and its first batch, each after the previous iterator was consumed to its end."""
    times = []
    for _ in range(runs):
        _measure.drain_in_graph(ds)  # a whole epoch: its iterator ends, as a Keras epoch's does
        start = time.perf_counter()
        next(iter(ds))
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="50k rows, 2 runs: proves the benchmark runs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.runs = 50_000, 2
    paths = {
        layout: corpus.ensure_dataset(args.workdir, args.rows, args.shards, layout=layout)
        for layout in ("rows", "blocks")
    }
    paths["parquet"] = corpus.ensure_parquet(args.workdir, args.rows)
    if args.child:
        _child(args.child, paths, args.batch_size)
        return 0
    names = ["make_dataset", "hand_tuned_rows", "parquet_in_memory"]
    fresh = {name: [] for name in names}
    for _ in range(args.runs):  # round robin: drift hits every pipeline alike
        for name in names:
            child = _measure.run_child(
                "benchmarks.startup", "--child", name, "--rows", args.rows, "--shards", args.shards,
                "--batch_size", args.batch_size, "--workdir", args.workdir,
            )  # fmt: skip
            fresh[name].append(child["total_s"])
    rows = []
    for name in names:
        again = new_iterator_seconds(_make(name, paths, args.batch_size), args.runs)
        rows.append(
            {
                "pipeline": name,
                "fresh_process_s": statistics.median(fresh[name]),
                "vs_hand_tuned": statistics.median(fresh[name]) / statistics.median(fresh["hand_tuned_rows"]),
                "new_iterator_s": statistics.median(again),
            }
        )
    print(
        f"\nStart-up to the first batch, {args.rows} rows in {args.shards} shards, batch {args.batch_size}, "
        f"median of {args.runs}\n"
    )
    print(_measure.table(rows, ["pipeline", "fresh_process_s", "vs_hand_tuned", "new_iterator_s"]))
    _measure.write_json(args.out, "startup.json", {"rows": rows, "fresh_runs": fresh})
    return 0


if __name__ == "__main__":
    sys.exit(main())
