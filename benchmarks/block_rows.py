"""Choosing K, the rows per block: parse cost against shuffle granularity, measured.

The same indexed corpus converted with several `--block_rows`; for each, make_dataset's
throughput at its defaults (shuffled, batch 256, consumed in-graph, median of epochs
taken round-robin after a warm-up), how well it mixes (`benchmarks.mixing` re-share),
and the bytes on disk.

    python -m benchmarks.block_rows [--rows 500000] [--ks 256,512,1024,2048,4096]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks import _measure, corpus, mixing


def main(argv=None) -> int:
    import ingest

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--ks", default="256,512,1024,2048,4096")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--workdir", default="bench-out/data")
    args = p.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    paths = {
        k: corpus.ensure_dataset(args.workdir, args.rows, args.shards, layout="blocks", indexed=True, block_rows=k)
        for k in ks
    }
    rates = {k: [] for k in ks}
    for k in ks:  # warm-up
        _measure.drain_in_graph(ingest.make_dataset(paths[k], batch_size=args.batch_size))
    for _ in range(args.epochs):
        for k in ks:
            n, s = _measure.drain_in_graph(ingest.make_dataset(paths[k], batch_size=args.batch_size))
            rates[k].append(n / s)
    base = statistics.median(rates[1024]) if 1024 in rates else statistics.median(rates[ks[0]])
    rows = []
    for k in ks:
        mixed = mixing.measure(paths[k], key=corpus.INDEX, batch_size=args.batch_size)
        rows.append(
            {
                "block_rows": k,
                "rows_per_sec": statistics.median(rates[k]),
                "vs_1024": statistics.median(rates[k]) / base,
                "reshare": f"{mixed['reshare']:.3%}",
                "ideal": f"{mixed['ideal_reshare']:.3%}",
                "MB": ingest.load_info(paths[k]).split("train").bytes / 2**20,
            }
        )
    print(f"\nBlock size, {args.rows} rows in {args.shards} shards, batch {args.batch_size}, defaults otherwise\n")
    print(_measure.table(rows, ["block_rows", "rows_per_sec", "vs_1024", "reshare", "ideal", "MB"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
