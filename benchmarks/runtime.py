"""Runtime throughput: make_dataset vs a naive and a best-practice hand-written pipeline.

Same shards, same process, epochs interleaved round-robin so drift hits every pipeline
alike; medians after a warm-up epoch. Peak RSS of each pipeline is measured in a child
process of its own.

    python -m benchmarks.runtime [--rows 500000] [--shards 16] [--epochs 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from benchmarks import _measure, corpus


def _pipelines(path: str, batch_size: int) -> dict:
    import ingest
    from benchmarks import pipelines

    return {
        "naive": lambda: pipelines.naive(path, batch_size=batch_size),
        "best_practice": lambda: pipelines.best_practice(path, batch_size=batch_size),
        "tuned_by_hand": lambda: pipelines.tuned_by_hand(path, batch_size=batch_size),
        "make_dataset": lambda: ingest.make_dataset(path, batch_size=batch_size),
    }


def compare(path: str, *, batch_size: int, epochs: int, naive_epochs: int) -> list:
    makers = _pipelines(path, batch_size)
    rates = {name: [] for name in makers}
    for name, make in makers.items():  # warm-up epoch each
        _measure.drain(make())
    for i in range(epochs):
        for name, make in makers.items():
            if name == "naive" and i >= naive_epochs:
                continue
            n, s = _measure.drain(make())
            rates[name].append(n / s)
    med = {k: statistics.median(v) for k, v in rates.items()}
    best_by_hand = max(med["best_practice"], med["tuned_by_hand"])
    rows = []
    for name in makers:
        rows.append(
            {
                "pipeline": name,
                "examples_per_sec": med[name],
                "vs_best_by_hand": med[name] / best_by_hand,
                "vs_naive": med[name] / med["naive"],
                "epochs": len(rates[name]),
            }
        )
    return rows


def _rss_child(path: str, pipeline: str, batch_size: int) -> None:
    make = _pipelines(path, batch_size)[pipeline]
    with _measure.RssSampler() as whole:
        ds = make()
        next(iter(ds))  # trace and start up outside the iteration measurement
        with _measure.RssSampler() as rss:
            _measure.drain(ds)
    print(json.dumps({"pipeline": pipeline, "peak_rss_mb": whole.peak_mb, "iteration_rss_growth_mb": rss.growth_mb}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--epochs", type=int, default=7)
    p.add_argument("--naive_epochs", type=int, default=3, help="the naive pipeline is slow; fewer epochs")
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="50k rows, 2 epochs: proves the benchmark runs")
    p.add_argument("--rss_child", nargs=2, metavar=("PATH", "PIPELINE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rss_child:
        _rss_child(args.rss_child[0], args.rss_child[1], args.batch_size)
        return 0
    if args.quick:
        args.rows, args.epochs, args.naive_epochs = 50_000, 2, 1
    path = corpus.ensure_dataset(args.workdir, args.rows, args.shards)
    rows = compare(path, batch_size=args.batch_size, epochs=args.epochs, naive_epochs=args.naive_epochs)
    for r in rows:
        child = _measure.run_child(
            "benchmarks.runtime", "--rss_child", path, r["pipeline"], "--batch_size", args.batch_size
        )
        r["peak_rss_mb"] = child["peak_rss_mb"]
        r["rss_growth_mb"] = child["iteration_rss_growth_mb"]
    print(
        f"\nRuntime throughput, {args.rows} rows in {args.shards} shards, batch {args.batch_size}, "
        "median of epochs after warm-up\n"
    )
    print(
        _measure.table(
            rows,
            ["pipeline", "examples_per_sec", "vs_best_by_hand", "vs_naive", "epochs", "peak_rss_mb", "rss_growth_mb"],
        )
    )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "runtime.json"), "w") as f:
        json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
