"""Conversion speed and memory, each against a baseline on the same data in the same run.

1. The encoder alone: Arrow record batches -> serialized tf.train.Example, one core.
   `beam_jobs.encode_record_batch` against protobuf objects built per row and, when
   `tfx-bsl` is installed (`pip install -e '.[bench]'`), TFX's C++
   `RecordBatchToExamplesEncoder` on the same batches.
2. The whole job against a naive converter. Naive: csv.DictReader and one
   tf.train.Example per row, written with TFRecordWriter, as a tutorial would. The job:
   `beam_jobs.convert` on the in-process DirectRunner, timed from launch to metadata
   (inference pass, encoding, sharding, commit), from CSV and from the same rows as
   Parquet, in the default blocks layout and in the rows layout, on corpora with
   low-cardinality text (a dozen words) and high (every value distinct: --texts). Its
   start-up, a 1-row job, is measured apart and also taken off.
3. One large CSV (--mp_gb or --mp_rows) on the multi-process DirectRunner: 2 worker processes
   against 1, with the peak RSS of all the job's processes and their CPU seconds.
4. Peak RSS of the job, in a child process per corpus size.

    python -m benchmarks.conversion [--rows 500000] [--runs 5] [--mp_gb 1 | --mp_rows N] [--quick]
                                    [--texts low,high] [--parts encoder,job,mp,rss]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
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
    info = convert.run(
        ["--source", source, "--input", input_path, "--output", out_dir, "--label", corpus.LABEL, *extra]
    )
    return info.source["rows"]


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    rows = fn(*args)
    return rows / (time.perf_counter() - start)


# --- 1. the encoder alone ---------------------------------------------------------------


def _list_batches(parquet_path: str, batch_rows: int) -> list:
    """The corpus as record batches whose columns are lists of one value: the input TFX's
    encoder requires, given to every encoder alike."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = []
    for b in pq.ParquetFile(parquet_path).iter_batches(batch_size=batch_rows):
        offsets = pa.array(np.arange(b.num_rows + 1, dtype=np.int32))
        cols = [
            pa.ListArray.from_arrays(offsets, c.cast(pa.binary()) if pa.types.is_string(c.type) else c)
            for c in b.columns
        ]
        out.append(pa.RecordBatch.from_arrays(cols, names=b.schema.names))
    return out


def _protobuf_encode(batches: list) -> int:
    import tensorflow as tf

    rows = batches[0].to_pylist()
    for row in rows:
        feature = {}
        for k, (v,) in row.items():
            if isinstance(v, float):
                feature[k] = tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
            elif isinstance(v, int):
                feature[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
            else:
                feature[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
        tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
    return len(rows)


def _tfx_encoder():
    try:
        from tfx_bsl.coders.example_coder import RecordBatchToExamplesEncoder
    except ImportError:
        return None
    return RecordBatchToExamplesEncoder()


def encoder_rates(parquet_path: str, *, runs: int, batch_rows: int = 32768) -> list:
    from beam_jobs import encode_record_batch

    batches = _list_batches(parquet_path, batch_rows)
    total = sum(b.num_rows for b in batches)
    bytes_per_row = len(encode_record_batch(batches[0])[0]) / batches[0].num_rows
    encoders = {
        "ingest (encode_record_batch)": lambda: sum(len(encode_record_batch(b)[1]) - 1 for b in batches),
        "ingest, framed as TFRecords (+CRC32C)": lambda: sum(
            len(encode_record_batch(b, framed=True)[1]) - 1 for b in batches
        ),
        "protobuf object per row (first batch)": lambda: _protobuf_encode(batches),
    }
    tfx = _tfx_encoder()
    if tfx is not None:
        tfx_bytes = sum(len(r) for r in tfx.encode(batches[0])) / batches[0].num_rows
        encoders["tfx-bsl RecordBatchToExamplesEncoder (C++)"] = lambda: sum(len(tfx.encode(b)) for b in batches)
    rates = {name: [] for name in encoders}
    for name, fn in encoders.items():
        fn()  # warm-up
    for _ in range(runs):  # round-robin, so drift hits all alike
        for name, fn in encoders.items():
            rates[name].append(_timed(fn))
    reference = (
        "tfx-bsl RecordBatchToExamplesEncoder (C++)" if tfx is not None else "protobuf object per row (first batch)"
    )
    med = {k: statistics.median(v) for k, v in rates.items()}
    rows = [
        {
            "encoder": k,
            "rows_per_sec": v,
            "vs_" + ("tfx_bsl" if tfx is not None else "protobuf"): v / med[reference],
            "bytes_per_row": tfx_bytes if k.startswith("tfx") else bytes_per_row,
        }
        for k, v in med.items()
    ]
    if tfx is None:
        print("note: tfx-bsl is not installed (pip install -e '.[bench]'); the TFX comparison is skipped")
    print(f"(encoder rows: {total} in batches of {batch_rows}, one core, median of {runs} runs)")
    return rows


# --- 2. the whole job against the naive converter ------------------------------------------

_JOB_COLUMNS = [
    "converter",
    "text",
    "rows_per_sec",
    "vs_naive",
    "seconds",
    "seconds_less_startup",
    "vs_naive_less_startup",
    "input_mb_per_sec",
    "output_mb",
    "runs",
]


def _startup_s(tmp: str, runs: int) -> float:
    """The job's fixed cost: a 1-row job from CSV and from Parquet, after a warm-up one."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    one = corpus.tabular_table(1)
    paths = {"csv": os.path.join(tmp, "one.csv"), "parquet": os.path.join(tmp, "one.parquet")}
    pacsv.write_csv(one, paths["csv"])
    pq.write_table(pa.table(one), paths["parquet"])
    job_convert("csv", paths["csv"], os.path.join(tmp, "job-one"))
    seconds = []
    for _ in range(runs):
        for source, path in paths.items():
            start = time.perf_counter()
            job_convert(source, path, os.path.join(tmp, "job-one"))
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _tree_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 1e6


def job_rates(args, tmp: str) -> tuple:
    """The naive converter, then the job from CSV and Parquet in the blocks layout (and in
    rows, on the first text corpus), on each text corpus: medians of `args.runs` rounds,
    each converter once a round, after a warm-up round. -> (table rows, start-up s)."""
    texts = args.texts.split(",")
    naive_rows = min(args.naive_rows, args.rows)
    jobs: dict = {}  # (name, text) -> (source, path, extra flags)
    naive: dict = {}  # text -> a CSV of the corpus' first naive_rows rows
    for text in texts:
        csv_path = corpus.ensure_csv(args.workdir, args.rows, text=text)
        pq_path = corpus.ensure_parquet(args.workdir, args.rows, text=text)
        naive[text] = corpus.ensure_csv(args.workdir, naive_rows, text=text)
        jobs[("job_csv", text)] = ("csv", csv_path)
        jobs[("job_parquet", text)] = ("parquet", pq_path)
        if text == texts[0]:  # the rows layout, for TFX-style readers
            jobs[("job_csv --layout rows", text)] = ("csv", csv_path, "--layout", "rows")
            jobs[("job_parquet --layout rows", text)] = ("parquet", pq_path, "--layout", "rows")
    out = os.path.join(tmp, "job")
    seconds: dict = {key: [] for key in jobs}
    output_mb: dict = {}
    naive_rates: dict = {text: [] for text in texts}
    for round_ in range(args.runs + 1):  # round 0 warms up, and measures the bytes written
        for text, path in naive.items():
            naive_rates[text].append(_timed(naive_convert, path, os.path.join(tmp, "naive.tfrecord")))
        for key, (source, path, *extra) in jobs.items():
            start = time.perf_counter()
            job_convert(source, path, out, *extra)
            seconds[key].append(time.perf_counter() - start)
            output_mb.setdefault(key, _tree_mb(out))
    startup = _startup_s(tmp, max(3, args.runs))
    rows = []
    for text in texts:
        rate = statistics.median(naive_rates[text][1:])
        rows.append({"converter": "naive", "text": text, "rows_per_sec": rate, "vs_naive": 1.0, "runs": args.runs})
        for (name, t), (source, path, *_) in jobs.items():
            if t != text:
                continue
            med = statistics.median(seconds[(name, t)][1:])
            less = med - startup
            rows.append(
                {
                    "converter": name,
                    "text": text,
                    "rows_per_sec": args.rows / med,
                    "vs_naive": args.rows / med / rate,
                    "seconds": med,
                    "seconds_less_startup": less,
                    "vs_naive_less_startup": args.rows / less / rate if less > 0 else None,
                    "input_mb_per_sec": os.path.getsize(path) / 1e6 / med,
                    "output_mb": output_mb[(name, t)],
                    "runs": args.runs,
                }
            )
    return rows, startup


# --- 3. multi-process DirectRunner ----------------------------------------------------------


def _worker_role(cmdline: str) -> str:
    return "workers" if "sdk_worker_main" in cmdline else "other"


def multiprocess_rates(csv_path: str, out_dir: str, *, runs: int) -> list:
    """1 and 2 SDK worker processes, alternating: rows/s, peak RSS of every process of
    the job together, and CPU seconds of the runner's own process (it feeds the workers
    over gRPC and runs the stages between them) and of the workers; medians."""
    runs_of: dict = {1: [], 2: []}
    for _ in range(runs):
        for workers in runs_of:
            with _measure.TreeSampler(_worker_role) as tree:
                start = time.perf_counter()
                rows = job_convert(
                    "csv",
                    csv_path,
                    out_dir,
                    "--direct_running_mode=multi_processing",
                    f"--direct_num_workers={workers}",
                )
                seconds = time.perf_counter() - start
            cpu = tree.cpu_s
            runs_of[workers].append(
                {
                    "rows_per_sec": rows / seconds,
                    "seconds": seconds,
                    "peak_rss_mb": tree.peak_mb,
                    "runner_rss_mb": tree.peak_mb_by_role.get("job", 0.0),
                    "workers_rss_mb": tree.peak_mb_by_role.get("workers", 0.0),
                    "runner_cpu_s": cpu.get("job", 0.0),
                    "workers_cpu_s": cpu.get("workers", 0.0),
                }
            )
    med = {w: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for w, rs in runs_of.items()}
    return [
        {"workers": w, **m, "speedup": m["rows_per_sec"] / med[1]["rows_per_sec"], "runs": len(runs_of[w])}
        for w, m in med.items()
    ]


def _rss_child(rows: int, workdir: str) -> None:
    csv_path = corpus.ensure_csv(workdir, rows)
    with _measure.RssSampler() as rss:
        job_convert("csv", csv_path, os.path.join(workdir, f"rss-out-{rows}"))
    print(json.dumps({"rows": rows, "peak_rss_mb": rss.peak_mb}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--mp_gb", type=float, default=1.0, help="size of the CSV for the multi-process runs (0: skip)")
    p.add_argument("--mp_rows", type=int, help="rows of the CSV for the multi-process runs (instead of --mp_gb)")
    p.add_argument("--mp_runs", type=int, default=3)
    p.add_argument("--rss_rows", default="100000,1000000", help="corpus sizes for the peak-RSS comparison")
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument(
        "--quick", action="store_true", help="50k rows, 1 run, a 20 MB multi-process CSV, RSS at 20k vs 100k rows"
    )
    p.add_argument(
        "--texts",
        default="low,high",
        help="text columns of the job's corpora (benchmarks.corpus.TEXTS): low (a dozen words), high (all distinct)",
    )
    p.add_argument("--naive_rows", type=int, default=100_000, help="rows the naive converter is timed on (its rate)")
    p.add_argument("--parts", default="encoder,job,mp,rss", help="which comparisons to run (job always runs)")
    p.add_argument("--rss_child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rss_child:
        _rss_child(args.rss_child, args.workdir)
        return 0
    if args.quick:
        args.rows, args.runs, args.mp_runs, args.rss_rows = 50_000, 1, 1, "20000,100000"
        args.naive_rows = min(args.naive_rows, 20_000)
        args.mp_gb = min(args.mp_gb, 0.02)
    csv_path = corpus.ensure_csv(args.workdir, args.rows)
    tmp = os.path.join(args.workdir, "conversion-out")
    os.makedirs(tmp, exist_ok=True)
    results = {}
    if "encoder" in args.parts:
        results["encoder"] = encoder_rates(corpus.ensure_parquet(args.workdir, args.rows), runs=args.runs)

    results["job"], results["startup_s"] = job_rates(args, tmp)

    if (args.mp_rows or args.mp_gb > 0) and "mp" in args.parts:
        bytes_per_row = os.path.getsize(csv_path) / args.rows
        mp_rows = args.mp_rows or math.ceil(args.mp_gb * 2**30 / bytes_per_row)
        mp_csv = corpus.ensure_csv(args.workdir, mp_rows)
        results["multiprocess"] = multiprocess_rates(mp_csv, os.path.join(tmp, "job-mp"), runs=args.mp_runs)
        results["multiprocess_csv_mb"] = os.path.getsize(mp_csv) / 2**20

    sizes = [int(x) for x in args.rss_rows.split(",")]
    if "rss" in args.parts:
        for n in sizes:
            corpus.ensure_csv(args.workdir, n)
        results["rss"] = [
            _measure.run_child("benchmarks.conversion", "--rss_child", n, "--workdir", args.workdir) for n in sizes
        ]

    if "encoder" in results:
        print("\nEncoder alone: Arrow record batches -> serialized tf.train.Example\n")
        print(_measure.table(results["encoder"], list(results["encoder"][0])))
    print(
        f"\nConversion of a {args.rows}-row, 21-column corpus (median of {args.runs} runs after a warm-up; naive on "
        f"its first {min(args.naive_rows, args.rows)} rows; start-up: a 1-row job, median {results['startup_s']:.3f} s,"
        " taken off in the _less_startup columns)\n"
    )
    print(_measure.table(results["job"], _JOB_COLUMNS))
    if "multiprocess" in results:
        print(
            f"\nOne {results['multiprocess_csv_mb']:.0f} MB CSV on the multi-process DirectRunner "
            f"(median of {args.mp_runs} runs, 1 and 2 workers alternating; RSS: every process of the job together; "
            "CPU: the runner's own process, which feeds the workers, and the workers)\n"
        )
        columns = ["workers", "rows_per_sec", "speedup", "seconds", "peak_rss_mb", "runner_rss_mb", "workers_rss_mb"]
        columns += ["runner_cpu_s", "workers_cpu_s"]
        print(_measure.table(results["multiprocess"], columns + ["runs"]))
    if "rss" in results:
        print("\nPeak RSS of the conversion job (CSV, DirectRunner, own process)\n")
        print(_measure.table(results["rss"], ["rows", "peak_rss_mb"]))
        ratio = results["rss"][-1]["peak_rss_mb"] / results["rss"][0]["peak_rss_mb"]
        print(f"\nRSS ratio {sizes[-1]} vs {sizes[0]} rows: {ratio:.2f}")
    _measure.write_json(args.out, "conversion.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
