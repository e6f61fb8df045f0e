"""What the missing-value masks cost (#47): `make_dataset(missing="mask")`, the default, against
`missing="fill"` (the defaults alone, as before), on the same data in the same run.

The corpus: the tabular benchmark table with a tenth of the values of every other column
missing (nulls in Parquet), so half the features get a mask. Each round reads both
settings, alternating which goes first; long-lived iterators consumed in-graph, timed
after 100k rows of warm-up; medians of `--rounds`, with their spread.

    python -m benchmarks.missing [--rows 500000] [--batch_sizes 4096,256] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import _measure, _noise, corpus

_WARMUP_ROWS = 100_000


def ensure_dataset(workdir: str, rows: int) -> str:
    """The table with missing values, converted (blocks, 8 shards) on first use."""
    dataset = os.path.join(workdir, f"missing-{rows}")
    if os.path.exists(os.path.join(dataset, "dataset_info.json")):
        return dataset
    from beam_jobs import convert

    table = corpus.tabular_table(rows)
    rng = np.random.default_rng(1)
    for i, name in enumerate(table.column_names):
        if i % 2 == 0 and name != corpus.LABEL:
            lacking = rng.random(rows) < 0.1
            column = pa.array(table.column(name).to_numpy(zero_copy_only=False), mask=lacking)
            table = table.set_column(i, name, column)
    os.makedirs(workdir, exist_ok=True)
    source = os.path.join(workdir, f"missing-{rows}.parquet")
    pq.write_table(table, source)
    convert.run(["--source", "parquet", "--input", source, "--output", dataset, "--label", corpus.LABEL])
    return dataset


def _rate(dataset: str, batch_size: int, missing: str, steady_rows: int) -> float:
    import ingest

    warmup = max(1, _WARMUP_ROWS // batch_size)
    ds = ingest.make_dataset(dataset, batch_size=batch_size, seed=1, num_epochs=None, missing=missing)
    n, seconds = _measure.drain_steady_in_graph(ds.take(warmup + steady_rows // batch_size), warmup_batches=warmup)
    return n / seconds


def measure(dataset: str, batch_size: int, rounds: int, steady_rows: int) -> dict:
    rates = {"mask": [], "fill": []}
    for r in range(rounds):
        for missing in ("mask", "fill") if r % 2 == 0 else ("fill", "mask"):
            rates[missing].append(_rate(dataset, batch_size, missing, steady_rows))
    return rates


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--batch_sizes", default="4096,256")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--quick", action="store_true", help="50k rows, batch 4096, 1 round: proves the benchmark runs")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.batch_sizes, args.rounds = 150_000, "4096", 1
    dataset = ensure_dataset(args.workdir, args.rows)
    before = _noise.Machine.read()
    rows = []
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        steady = min(1_000_000 if batch_size >= 1024 else 400_000, args.rows)
        rates = measure(dataset, batch_size, args.rounds, steady)
        mask, fill = (_noise.spread(rates[k]) for k in ("mask", "fill"))
        ratios = [m / f for m, f in zip(rates["mask"], rates["fill"])]
        rows.append(
            {
                "batch": batch_size,
                "fill rows/s": f"{fill.median:,.0f} ({fill.low:,.0f}-{fill.high:,.0f})",
                "mask rows/s": f"{mask.median:,.0f} ({mask.low:,.0f}-{mask.high:,.0f})",
                "mask/fill": f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
            }
        )
    print(_measure.table(rows, ["batch", "fill rows/s", "mask rows/s", "mask/fill"]))
    warning = _noise.busy_warning(before, _noise.Machine.read())
    if warning:
        print(warning)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
