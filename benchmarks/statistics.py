"""What statistics at conversion cost, and what they save.

1. Conversion with statistics (the default) against `--no_statistics`, same corpus, same
   run, round-robin; target >= 0.9x (rows/s), with the CPU seconds of both.
2. The quantile sketch on the hot path: DataSketches' KLL (`kll_doubles_sketch`, its k
   chosen for a rank error <= 1%) against the threshold sample `beam_jobs` uses, on the
   corpus' numeric columns in conversion-sized chunks: time per million values and the
   largest rank error of 101 quantiles.
3. `ingest.feature_space` (statistics already recorded) against `FeatureSpace.adapt` on
   the converted 500k-row corpus: the time to a ready FeatureSpace.
4. High-cardinality text (the corpus' five columns of distinct ids, URLs, e-mails, hashes
   and SKUs): the text statistics `beam_jobs` gathers (exact counts up to 2**17 values,
   then batched sketches, `beam_jobs.stats.sketches`) against DataSketches' HLL and
   frequent-strings sketches fed a Python call per value, as `beam_jobs` did before; in
   conversion-sized chunks, alternating, ms per 200k values of a column and the largest
   error of `distinct`.

    python -m benchmarks.statistics [--rows 500000] [--runs 5] [--parts conversion,sketches,feature_space,text]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from benchmarks import _measure, corpus
from benchmarks.conversion import job_convert

_CHUNK = 32_768  # rows per chunk, as the Parquet source reads them


def conversion_ratios(paths: dict, workdir: str, runs: int) -> list:
    out_dir = os.path.join(workdir, "statistics-out")
    times = {(source, on): [] for source in paths for on in (True, False)}
    cpu = {(source, on): [] for source in paths for on in (True, False)}
    for source, path in paths.items():  # warm-up: the first job in a process pays imports and first-use costs
        for on in (True, False):
            job_convert(source, path, out_dir, *([] if on else ["--no_statistics"]))
    for run in range(runs):
        for source, path in paths.items():
            for on in (True, False) if run % 2 == 0 else (False, True):  # neither always runs first
                start, start_cpu = time.perf_counter(), _cpu_seconds()
                rows = job_convert(source, path, out_dir, *([] if on else ["--no_statistics"]))
                times[(source, on)].append(rows / (time.perf_counter() - start))
                cpu[(source, on)].append(_cpu_seconds() - start_cpu)
    rows = []
    for source in paths:
        on, off = statistics.median(times[(source, True)]), statistics.median(times[(source, False)])
        cpu_on, cpu_off = statistics.median(cpu[(source, True)]), statistics.median(cpu[(source, False)])
        rows.append(
            {
                "source": source,
                "with_statistics": on,
                "without": off,
                "ratio": on / off,
                "cpu_s_with": cpu_on,
                "cpu_s_without": cpu_off,
                "cpu_ratio": cpu_off / cpu_on,
                "runs": runs,
            }
        )
    return rows


def _cpu_seconds() -> float:
    """CPU time of this process, every thread: steadier than wall time on a shared machine."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rank_error(quantiles, sorted_values) -> float:
    worst = 0.0
    n = len(sorted_values)
    for i, q in enumerate(quantiles):
        want = i / (len(quantiles) - 1)
        below = np.searchsorted(sorted_values, q, "left") / n
        at_most = np.searchsorted(sorted_values, q, "right") / n
        worst = max(worst, 0.0 if below <= want <= at_most else min(abs(below - want), abs(at_most - want)))
    return worst


def sketch_comparison(parquet_path: str, runs: int) -> list:
    import datasketches
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_jobs.stats import features as feature_stats

    table = pq.read_table(parquet_path, columns=corpus.FLOAT_COLS + corpus.INT_COLS)
    columns = [table.column(c).combine_chunks() for c in table.column_names]
    k = 200
    while datasketches.kll_doubles_sketch.get_normalized_rank_error(k, False) > 0.01:
        k += 50
    results = {"kll": [], "sample": []}
    errors = {"kll": 0.0, "sample": 0.0}
    for _ in range(runs):
        start = time.perf_counter()
        sketches = []
        for col in columns:
            sketch = datasketches.kll_doubles_sketch(k)
            for at in range(0, len(col), _CHUNK):
                sketch.update(col.slice(at, _CHUNK).to_numpy().astype(np.float64))
            sketches.append(sketch)
        results["kll"].append(time.perf_counter() - start)
        start = time.perf_counter()
        accs = []
        for col in columns:
            acc = feature_stats.FeatureStats("float32" if pa.types.is_floating(col.type) else "int64", "number", False)
            acc.counts = None  # quantiles only, as for KLL
            for i, at in enumerate(range(0, len(col), _CHUNK)):
                piece = col.slice(at, _CHUNK)
                acc.add(piece, feature_stats.chunk_keys(len(piece), [0, i]))
            accs.append(acc)
        results["sample"].append(time.perf_counter() - start)
    ranks = np.linspace(0, 1, feature_stats.QUANTILES)
    for col, sketch, acc in zip(columns, sketches, accs):
        values = np.sort(col.to_numpy())
        errors["kll"] = max(errors["kll"], _rank_error(sketch.get_quantiles(ranks), values))
        errors["sample"] = max(errors["sample"], _rank_error(acc.to_json()["quantiles"], values))
    values = sum(len(c) for c in columns)
    sample_cost = statistics.median(results["sample"])
    return [
        {
            "quantiles": "DataSketches KLL" + f" (k={k})",
            "ms_per_million": 1e9 * statistics.median(results["kll"]) / values,
            "vs_sample": statistics.median(results["kll"]) / sample_cost,
            "max_rank_error_pct": 100 * errors["kll"],
        },
        {
            "quantiles": "threshold sample + moments (beam_jobs)",
            "ms_per_million": 1e9 * sample_cost / values,
            "vs_sample": 1.0,
            "max_rank_error_pct": 100 * errors["sample"],
        },
    ]


def _per_value_sketches(col, text) -> int:
    """DataSketches' HLL (lg_k 14) and frequent strings (lg_max_map 13) over a column's
    chunks, each chunk's distinct values one call each, as `beam_jobs` sketched before it
    batched: -> the distinct estimate."""
    import collections

    import datasketches
    import pyarrow.compute as pc

    hll = datasketches.hll_sketch(14)
    frequent = datasketches.frequent_strings_sketch(13)
    for at in range(0, len(col), _CHUNK):
        counted = pc.value_counts(col.slice(at, _CHUNK))
        values = text(counted.field(0))
        collections.deque(map(hll.update, values), maxlen=0)
        collections.deque(map(frequent.update, values, counted.field(1).to_pylist()), maxlen=0)
    return round(hll.get_estimate())


def _batched(col, feature_stats) -> int:
    acc = feature_stats.FeatureStats("bytes", "text", False)
    for i, at in enumerate(range(0, len(col), _CHUNK)):
        piece = col.slice(at, _CHUNK)
        acc.add(piece, feature_stats.chunk_keys(len(piece), [0, i]))
    return acc.to_json()["distinct"]


def text_comparison(rows: int, runs: int) -> list:
    import pyarrow as pa
    import pyarrow.compute as pc

    from beam_jobs.stats import features as feature_stats

    table = corpus.tabular_table(rows, text="high")
    columns = [table.column(c).combine_chunks().cast(pa.large_binary()) for c in corpus.STR_COLS]
    truth = [len(pc.unique(c)) for c in columns]
    how = {
        "DataSketches, a call per value (before)": lambda c: _per_value_sketches(c, feature_stats._as_text),
        "exact to 2**17, then batched sketches (beam_jobs)": lambda c: _batched(c, feature_stats),
    }
    seconds: dict = {name: [] for name in how}
    errors: dict = {name: 0.0 for name in how}
    for run in range(runs + 1):  # the first round warms up
        for name in list(how) if run % 2 == 0 else list(how)[::-1]:  # neither always runs first
            start = time.perf_counter()
            estimates = [how[name](c) for c in columns]
            if run:
                seconds[name].append(time.perf_counter() - start)
            errors[name] = max(abs(e - t) / t for e, t in zip(estimates, truth))
    per = 200_000 / sum(len(c) for c in columns)
    before = statistics.median(seconds[list(how)[0]])
    return [
        {
            "text_statistics": name,
            "ms_per_200k": 1e3 * statistics.median(seconds[name]) * per,
            "speedup": before / statistics.median(seconds[name]),
            "max_distinct_error_pct": 100 * errors[name],
            "runs": runs,
        }
        for name in how
    ]


def feature_space_comparison(dataset: str, runs: int) -> list:
    import keras

    import ingest

    fs = keras.utils.FeatureSpace
    cols = corpus.FLOAT_COLS + corpus.INT_COLS + corpus.STR_COLS

    def specs():
        out = {c: fs.float_normalized() for c in corpus.FLOAT_COLS + corpus.INT_COLS}
        out.update({c: fs.string_categorical() for c in corpus.STR_COLS})
        return out

    ours, theirs = [], []
    for _ in range(runs):
        start = time.perf_counter()
        ready = ingest.feature_space(dataset, features=specs())
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        adapted = fs(features=specs())
        ds = ingest.make_dataset(dataset, batch_size=4096, split="train", num_epochs=1, shuffle=False)
        adapted.adapt(ds.map(lambda x, y: {c: x[c] for c in cols}))
        theirs.append(time.perf_counter() - start)
    x, _ = next(iter(ingest.make_dataset(dataset, batch_size=1024, split="train", num_epochs=1)))
    batch = {c: x[c] for c in cols}
    gap = float(np.abs(np.asarray(ready(batch)) - np.asarray(adapted(batch))).max())
    a, b = statistics.median(ours), statistics.median(theirs)
    return [
        {"how": "FeatureSpace.adapt (a pass over the data)", "seconds": b, "speedup": 1.0, "runs": runs},
        {"how": "ingest.feature_space (recorded statistics)", "seconds": a, "speedup": b / a, "runs": runs},
        {"how": "largest output difference on a batch", "seconds": gap, "speedup": "", "runs": ""},
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--workdir", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="50k rows, 1 run")
    p.add_argument("--parts", default="conversion,sketches,feature_space,text", help="which comparisons to run")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.runs = 50_000, 1
    parts = args.parts.split(",")
    results = {}
    if "conversion" in parts or "sketches" in parts:
        paths = {
            "parquet": corpus.ensure_parquet(args.workdir, args.rows),
            "csv": corpus.ensure_csv(args.workdir, args.rows),
        }
    if "conversion" in parts:
        results["conversion"] = conversion_ratios(paths, args.workdir, args.runs)
        print(
            f"\nConversion of a {args.rows:,}-row, 21-column corpus with and without statistics "
            f"(median of {args.runs})\n"
        )
        print(_measure.table(results["conversion"], list(results["conversion"][0])))
    if "sketches" in parts:
        results["sketches"] = sketch_comparison(paths["parquet"], args.runs)
        print(f"\nQuantiles of the corpus' 15 numeric columns in {_CHUNK:,}-row chunks (median of {args.runs})\n")
        print(_measure.table(results["sketches"], ["quantiles", "ms_per_million", "vs_sample", "max_rank_error_pct"]))
    if "feature_space" in parts:
        dataset = corpus.ensure_dataset(args.workdir, args.rows, 16, layout="blocks")
        results["feature_space"] = feature_space_comparison(dataset, min(args.runs, 3))  # adapt takes ~40 s a run
        runs = results["feature_space"][0]["runs"]
        print(f"\nA ready FeatureSpace for the corpus' 20 features from 500k rows (median of {runs})\n")
        print(_measure.table(results["feature_space"], ["how", "seconds", "speedup", "runs"]))
    if "text" in parts:
        results["text"] = text_comparison(args.rows, args.runs)
        print(
            f"\nStatistics of the corpus' 5 high-cardinality text columns, {args.rows:,} distinct values each, "
            f"in {_CHUNK:,}-value chunks (median of {args.runs})\n"
        )
        print(_measure.table(results["text"], list(results["text"][0])))
    _measure.write_json(args.out, "statistics.json", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
