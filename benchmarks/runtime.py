"""Runtime throughput: make_dataset on both record layouts vs hand-written pipelines.

The same corpus converted twice, as row records and as column blocks
(docs/block_format.md). The hand-written pipelines read the row records: naive, the
TensorFlow guide's best practice, the guide's pipeline tuned by hand, the strongest
hand-written one (`hand_tuned_rows`, 1024-record parses) and the raw read of the records
without parsing, the ceiling of any pipeline over row records; and the source Parquet
file held in memory (`parquet_in_memory`: a permutation per epoch, one gather per batch),
what a user whose table fits in memory writes. Each pipeline is built once and iterated
with a fresh iterator per epoch, as Keras does. Same process, epochs
interleaved round-robin so drift hits every pipeline alike; medians after a warm-up
epoch. Batches are consumed inside the TensorFlow runtime, as a compiled training step
takes them (`_measure.drain_in_graph`). Peak RSS of each pipeline is measured in a
child process of its own.

    python -m benchmarks.runtime [--rows 500000] [--shards 16] [--epochs 7] [--batch_sizes 256,4096] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from benchmarks import _measure, corpus


def _pipelines(paths: dict, batch_size: int) -> dict:
    """name -> (layout read, maker)."""
    import ingest
    from benchmarks import pipelines

    rows, b = paths["rows"], batch_size
    return {
        "parquet_in_memory": ("parquet", lambda: pipelines.parquet_in_memory(paths["parquet"], batch_size=b)),
        "naive": ("rows", lambda: pipelines.naive(rows, batch_size=b)),
        "best_practice": ("rows", lambda: pipelines.best_practice(rows, batch_size=b)),
        "tuned_by_hand": ("rows", lambda: pipelines.tuned_by_hand(rows, batch_size=b)),
        "hand_tuned_rows": ("rows", lambda: pipelines.hand_tuned_rows(rows, batch_size=b)),
        "raw_read (no parse)": ("rows", lambda: pipelines.raw_read(rows, batch_size=b)),
        "make_dataset, rows": ("rows", lambda: ingest.make_dataset(rows, batch_size=b)),
        "make_dataset, blocks": ("blocks", lambda: ingest.make_dataset(paths["blocks"], batch_size=b)),
        # The order before iterators became seekable (ReadOptions(seekable_order=False)): what
        # the few-KB checkpoints cost here.
        "make_dataset, blocks, streaming order": (
            "blocks",
            lambda: ingest.make_dataset(
                paths["blocks"], batch_size=b, options=ingest.ReadOptions(seekable_order=False)
            ),
        ),
    }


def compare(paths: dict, *, batch_size: int, epochs: int, naive_epochs: int) -> list:
    makers = _pipelines(paths, batch_size)
    # Each pipeline built once and iterated anew each epoch, as Keras' fit does.
    made = {name: make() for name, (_, make) in makers.items()}
    rates = {name: [] for name in makers}
    for ds in made.values():  # warm-up epoch each
        _measure.drain_in_graph(ds)
    for i in range(epochs):
        for name, ds in made.items():
            if name == "naive" and i >= naive_epochs:
                continue
            n, s = _measure.drain_in_graph(ds)
            rates[name].append(n / s)
    med = {k: statistics.median(v) for k, v in rates.items()}
    return [
        {
            "pipeline": name,
            "layout": layout,
            "examples_per_sec": med[name],
            "vs_hand_tuned_rows": med[name] / med["hand_tuned_rows"],
            "vs_raw_read": med[name] / med["raw_read (no parse)"],
            "vs_naive": med[name] / med["naive"],
            "vs_parquet_in_memory": med[name] / med["parquet_in_memory"],
            "epochs": len(rates[name]),
        }
        for name, (layout, _) in makers.items()
    ]


def _rss_child(paths: dict, pipeline: str, batch_size: int) -> None:
    _, make = _pipelines(paths, batch_size)[pipeline]
    with _measure.RssSampler() as whole:
        ds = make()
        next(iter(ds))  # trace and start up outside the iteration measurement
        with _measure.RssSampler() as rss:
            _measure.drain(ds)
    print(json.dumps({"pipeline": pipeline, "peak_rss_mb": whole.peak_mb, "iteration_rss_growth_mb": rss.growth_mb}))


def bytes_on_disk(paths: dict) -> list:
    import ingest

    size = {layout: ingest.load_info(p).split("train").bytes for layout, p in paths.items()}
    return [{"layout": k, "train_bytes": v, "vs_rows": v / size["rows"]} for k, v in size.items()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--epochs", type=int, default=7)
    p.add_argument("--naive_epochs", type=int, default=3, help="the naive pipeline is slow; fewer epochs")
    p.add_argument("--batch_sizes", default="256,4096", help="comma-separated; each a run of its own")
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--no_rss", action="store_true", help="skip the peak-RSS children")
    p.add_argument("--quick", action="store_true", help="50k rows, 2 epochs: proves the benchmark runs")
    p.add_argument(
        "--rss_child", nargs=4, metavar=("ROWS_PATH", "BLOCKS_PATH", "PARQUET_PATH", "PIPELINE"), help=argparse.SUPPRESS
    )
    p.add_argument("--batch_size", type=int, default=256, help=argparse.SUPPRESS)  # an RSS child's
    args = p.parse_args(argv)
    if args.rss_child:
        rows_path, blocks_path, parquet_path, pipeline = args.rss_child
        _rss_child({"rows": rows_path, "blocks": blocks_path, "parquet": parquet_path}, pipeline, args.batch_size)
        return 0
    if args.quick:
        args.rows, args.epochs, args.naive_epochs = 50_000, 2, 1
    paths = {
        layout: corpus.ensure_dataset(args.workdir, args.rows, args.shards, layout=layout)
        for layout in ("rows", "blocks")
    }
    paths["parquet"] = corpus.ensure_parquet(args.workdir, args.rows)
    columns = ["pipeline", "layout", "examples_per_sec", "vs_parquet_in_memory", "vs_hand_tuned_rows", "vs_raw_read"]
    columns += ["vs_naive", "epochs"] + ([] if args.no_rss else ["peak_rss_mb", "rss_growth_mb"])
    results = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        rows = compare(paths, batch_size=batch_size, epochs=args.epochs, naive_epochs=args.naive_epochs)
        if not args.no_rss:
            for r in rows:
                child = _measure.run_child(
                    "benchmarks.runtime",
                    "--rss_child",
                    paths["rows"],
                    paths["blocks"],
                    paths["parquet"],
                    r["pipeline"],
                    "--batch_size",
                    batch_size,
                )
                r["peak_rss_mb"] = child["peak_rss_mb"]
                r["rss_growth_mb"] = child["iteration_rss_growth_mb"]
        results[batch_size] = rows
        print(
            f"\nRuntime throughput, {args.rows} rows in {args.shards} shards, batch {batch_size}, shuffled, "
            "a fresh iterator per epoch, median of epochs after warm-up\n"
        )
        print(_measure.table(rows, columns), flush=True)
    sizes = bytes_on_disk({k: v for k, v in paths.items() if k != "parquet"})
    print("\nBytes on disk, train split\n")
    print(_measure.table(sizes, ["layout", "train_bytes", "vs_rows"]))
    _measure.write_json(args.out, "runtime.json", {"throughput": results, "bytes": sizes})
    return 0


if __name__ == "__main__":
    sys.exit(main())
