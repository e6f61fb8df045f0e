"""Every core, no strings on the hot path (#37): make_dataset's rate by cores and by corpus.

Four comparisons, each on the same data in the same run, batches consumed in-graph
(`_measure.drain_in_graph`: a pipeline built once, a fresh iterator per epoch, as Keras
iterates), medians of epochs after a warm-up:

1. scaling: the rate on 2 cores over the rate on 1 (`taskset -c 0-1` vs `taskset -c 0`,
   a child process each), batch 4096 and 256, on a numeric corpus and on one whose text is
   high-cardinality (every value distinct: ids, URLs) and low (a dozen words). Amdahl: a
   stage that one thread runs for the whole stream caps the ratio below ~1.8.
   Measured twice: an iterator per epoch (as Keras iterates a finite dataset), and one
   long-lived iterator (`num_epochs=None`, as a steps-based trainer reads; timed after a
   warm-up, `_measure.drain_steady_in_graph`). Beside them, the same two rates of a
   synthetic pipeline of make_dataset's shape that does none of its work (`ceiling`):
   what tf.data itself reaches on this machine's cores.
2. raw read: make_dataset over a numeric corpus against a raw read of the same shards
   (`TFRecordDataset`, CRCs checked, no parse), 2 cores.
3. ids: the low-cardinality corpus read with `text="ids"` against the same rows with their
   text stored as int64 columns (what the ids are), 2 cores. (The high-cardinality one's
   columns have more distinct values than a vocabulary holds: it has no ids.)
4. peer: make_dataset (strings) against the in-memory Parquet pipeline on the low- and
   the high-cardinality corpus, 2 cores.

    python -m benchmarks.scaling [--rows 500000] [--epochs 5] [--batch_sizes 4096,256] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks import _measure, corpus

_CORES = {1: "0", 2: "0-1"}


def _pipelines(kind: str, paths: dict, batch_size: int) -> dict:
    """name -> maker, for one child's comparison `kind`."""
    import tensorflow as tf

    import ingest
    from benchmarks import pipelines

    b = batch_size

    def make(corpus_name, **kw):
        return lambda: ingest.make_dataset(paths[corpus_name], batch_size=b, **kw)

    if kind in ("scaling", "steady"):
        epochs = {} if kind == "scaling" else {"num_epochs": None}
        made = {name: make(name, **epochs) for name in ("none", "high", "low")}
        rows = None if kind == "steady" else ingest.load_info(paths["none"]).split("train").records
        return made | {"tf.data ceiling": lambda: ceiling(b, rows, len(_affinity()))}
    if kind == "raw":
        files = pipelines.shard_files(paths["none"])
        rows_per_record = ingest.load_info(paths["none"]).block_rows

        def raw():
            ds = tf.data.TFRecordDataset(files, buffer_size=1 << 20, num_parallel_reads=len(_affinity()))
            # A record is a block of rows: count rows, as the other pipelines' batches do.
            return ds.batch(max(1, b // rows_per_record)).map(lambda x: tf.fill([tf.size(x) * rows_per_record], 0))

        return {"make_dataset": make("none"), "raw read (no parse)": raw}
    if kind == "ids":  # the high corpus' columns pass the vocabulary limit: it has no ids to read
        return {"low, text='ids'": make("low", text="ids"), "low_codes": make("low_codes")}
    return {
        "low, make_dataset": make("low"),
        "low, parquet_in_memory": lambda: pipelines.parquet_in_memory(paths["low_parquet"], batch_size=b),
        "high, make_dataset": make("high"),
        "high, parquet_in_memory": lambda: pipelines.parquet_in_memory(paths["high_parquet"], batch_size=b),
    }


def ceiling(batch_size: int, rows: int | None, cores: int):
    """make_dataset's shape, none of its work: windows of its size (81,920 rows rounded up
    to whole batches), enough for `rows` rows (None: endless), of the numeric corpus' 16
    columns, each made by `cores` parallel calls (random values, permuted: CPU work per
    row like a parse's), then cut into batches by a flat_map and prefetched.

    Its rate on 2 cores over 1 is what tf.data's threads give this machine for a pipeline
    of windows whose work is all parallel: the ceiling of make_dataset's ratio here.
    """
    import tensorflow as tf

    from ingest.pipeline import _tuning

    window = -(-_tuning.SEEKABLE_WINDOW_ROWS // batch_size) * batch_size
    columns = [(tf.float32, name) for name in corpus.FLOAT_COLS] + [(tf.int64, name) for name in corpus.INT_COLS]

    def made(w):
        order = tf.random.experimental.stateless_shuffle(tf.range(window), seed=tf.stack([w, 1]))
        out = {}
        for c, (dtype, name) in enumerate(columns):
            values = tf.random.stateless_uniform(
                [window], seed=tf.stack([w, c + 2]), maxval=None if dtype == tf.float32 else 1000, dtype=dtype
            )
            out[name] = tf.reshape(tf.gather(values, order), [-1, batch_size])
        return out, tf.reshape(tf.gather(tf.cast(order, tf.int64), order), [-1, batch_size])

    ds = tf.data.Dataset.range(-(-rows // window)) if rows is not None else tf.data.Dataset.counter()
    ds = ds.map(made, num_parallel_calls=cores, deterministic=True)
    return ds.flat_map(lambda *x: tf.data.Dataset.from_tensor_slices(x)).prefetch(tf.data.AUTOTUNE)


def _affinity() -> set:
    return os.sched_getaffinity(0)


def _child(kind: str, paths: dict, batch_size: int, epochs: int) -> dict:
    made = {name: make() for name, make in _pipelines(kind, paths, batch_size).items()}
    if kind == "steady":  # one iterator over ~1M rows, timed after its first 100k
        rows = 1_000_000 if batch_size >= 1024 else 500_000
        made = {name: ds.take(-(-rows // batch_size)) for name, ds in made.items()}
        warmup = -(-100_000 // batch_size)

        def drain(ds):
            return _measure.drain_steady_in_graph(ds, warmup_batches=warmup)
    else:
        drain = _measure.drain_in_graph
    rates = {name: [] for name in made}
    for ds in made.values():  # warm-up
        drain(ds)
    for _ in range(epochs):  # round robin: drift hits every pipeline alike
        for name, ds in made.items():
            n, s = drain(ds)
            rates[name].append(n / s)
    return {"cores": len(_affinity()), "rates": {k: statistics.median(v) for k, v in rates.items()}}


def _run(kind: str, cores: int, paths: dict, batch_size: int, epochs: int) -> dict:
    cmd = ["taskset", "-c", _CORES[cores], sys.executable, "-m", "benchmarks.scaling", "--child", kind]
    cmd += ["--paths", json.dumps(paths), "--batch_size", str(batch_size), "--epochs", str(epochs)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])["rates"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch_sizes", default="4096,256")
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="50k rows, 2 epochs: proves the benchmark runs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--paths", help=argparse.SUPPRESS)
    p.add_argument("--batch_size", type=int, default=4096, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, json.loads(args.paths), args.batch_size, args.epochs)))
        return 0
    if args.quick:
        args.rows, args.epochs, args.shards = 50_000, 2, 4
    paths = {
        text: corpus.ensure_dataset(args.workdir, args.rows, args.shards, layout="blocks", text=text)
        for text in corpus.TEXTS
    }
    paths["low_parquet"] = corpus.ensure_parquet(args.workdir, args.rows)
    paths["high_parquet"] = corpus.ensure_parquet(args.workdir, args.rows, text="high")
    results = {}
    for b in (int(x) for x in args.batch_sizes.split(",")):
        one, two = (_run("scaling", c, paths, b, args.epochs) for c in (1, 2))
        steady_one, steady_two = (_run("steady", c, paths, b, args.epochs) for c in (1, 2))
        rows = [
            {
                "corpus": k,
                "1 core": one[k],
                "2 cores": two[k],
                "2 / 1": two[k] / one[k],
                "long-lived: 1 core": steady_one[k],
                "2 cores ": steady_two[k],
                "2 / 1 ": steady_two[k] / steady_one[k],
            }
            for k in one
        ]
        print(
            f"\nScaling, batch {b}: rows/s of make_dataset (defaults), medians of {args.epochs}: an iterator "
            "per epoch, then one long-lived iterator; the ceiling is a synthetic pipeline of its shape\n"
        )
        print(_measure.table(rows, list(rows[0])), flush=True)
        pairs = {"raw": ("make_dataset", "raw read (no parse)")}
        pairs |= {"ids": None, "peer": None}
        other = {kind: _run(kind, 2, paths, b, args.epochs) for kind in pairs}
        ratios = [
            ("numeric: make_dataset / raw read", other["raw"]["make_dataset"], other["raw"]["raw read (no parse)"]),
            ("low: text='ids' / int64 columns", other["ids"]["low, text='ids'"], other["ids"]["low_codes"]),
            (
                "low: make_dataset / parquet_in_memory",
                other["peer"]["low, make_dataset"],
                other["peer"]["low, parquet_in_memory"],
            ),
            (
                "high: make_dataset / parquet_in_memory",
                other["peer"]["high, make_dataset"],
                other["peer"]["high, parquet_in_memory"],
            ),
        ]
        ratio_rows = [
            {"comparison (2 cores)": n, "rows/s": a, "baseline rows/s": c, "ratio": a / c} for n, a, c in ratios
        ]
        print(f"\nSame run, batch {b}, 2 cores\n")
        print(_measure.table(ratio_rows, ["comparison (2 cores)", "rows/s", "baseline rows/s", "ratio"]), flush=True)
        results[b] = {"scaling": rows, "ratios": ratio_rows}
    _measure.write_json(args.out, "scaling.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
