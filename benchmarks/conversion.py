"""Conversion speed and memory: the Beam job against a naive converter, same file, same run.

Naive: csv.DictReader and one tf.train.Example per row, written with TFRecordWriter,
as a tutorial would. The job: `beam_jobs.convert` on the in-process DirectRunner,
timed from launch to metadata (inference pass, encoding, sharding, commit).
Peak RSS is measured in a child process per corpus size.

    python -m benchmarks.conversion [--rows 500000] [--runs 3] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
import time

from benchmarks import _measure, corpus


def naive_convert(csv_path: str, out_path: str) -> int:
    import tensorflow as tf

    n = 0
    with open(csv_path, newline="") as f, tf.io.TFRecordWriter(out_path) as w:
        for row in csv.DictReader(f):
            feature = {}
            for k in corpus.FLOAT_COLS:
                feature[k] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(row[k])]))
            for k in corpus.INT_COLS + [corpus.LABEL]:
                feature[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(row[k])]))
            for k in corpus.STR_COLS:
                feature[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[row[k].encode()]))
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            n += 1
    return n


def job_convert(source: str, input_path: str, out_dir: str, *extra) -> int:
    from beam_jobs import convert

    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    info = convert.run(["--source", source, "--input", input_path, "--output", out_dir, "--label", corpus.LABEL, *extra])
    return info.source["rows"]


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    rows = fn(*args)
    return rows / (time.perf_counter() - start)


def _rss_child(rows: int, workdir: str) -> None:
    csv_path = corpus.ensure_csv(workdir, rows)
    with _measure.RssSampler() as rss:
        job_convert("csv", csv_path, os.path.join(workdir, f"rss-out-{rows}"))
    print(json.dumps({"rows": rows, "peak_rss_mb": rss.peak_mb}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rss_rows", default="100000,1000000", help="corpus sizes for the peak-RSS comparison")
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="50k rows, 1 run, RSS at 20k vs 100k rows")
    p.add_argument("--rss_child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rss_child:
        _rss_child(args.rss_child, args.workdir)
        return 0
    if args.quick:
        args.rows, args.runs, args.rss_rows = 50_000, 1, "20000,100000"
    csv_path = corpus.ensure_csv(args.workdir, args.rows)
    pq_path = corpus.ensure_parquet(args.workdir, args.rows)
    tmp = os.path.join(args.workdir, "conversion-out")
    os.makedirs(tmp, exist_ok=True)
    rates = {"naive": [], "job_csv": [], "job_parquet": []}
    for _ in range(args.runs):  # round-robin, so drift hits all alike
        rates["naive"].append(_timed(naive_convert, csv_path, os.path.join(tmp, "naive.tfrecord")))
        rates["job_csv"].append(_timed(job_convert, "csv", csv_path, os.path.join(tmp, "job-csv")))
        rates["job_parquet"].append(_timed(job_convert, "parquet", pq_path, os.path.join(tmp, "job-parquet")))
    med = {k: statistics.median(v) for k, v in rates.items()}
    rows = [{"converter": k, "rows_per_sec": v, "vs_naive": v / med["naive"], "runs": len(rates[k])} for k, v in med.items()]
    sizes = [int(x) for x in args.rss_rows.split(",")]
    for n in sizes:
        corpus.ensure_csv(args.workdir, n)
    rss = [_measure.run_child("benchmarks.conversion", "--rss_child", n, "--workdir", args.workdir) for n in sizes]
    print(f"\nConversion of a {args.rows}-row, 21-column corpus (median of {args.runs} runs)\n")
    print(_measure.table(rows, ["converter", "rows_per_sec", "vs_naive", "runs"]))
    print("\nPeak RSS of the conversion job (CSV, DirectRunner, own process)\n")
    print(_measure.table(rss, ["rows", "peak_rss_mb"]))
    print(f"\nRSS ratio {sizes[-1]} vs {sizes[0]} rows: {rss[-1]['peak_rss_mb'] / rss[0]['peak_rss_mb']:.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "conversion.json"), "w") as f:
        json.dump({"throughput": rows, "rss": rss}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
