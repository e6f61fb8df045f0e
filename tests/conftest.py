"""Shared helpers: run real conversions in-process and read shards back independently."""

from __future__ import annotations

import glob
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from tests.gcs import TF_GCS_ENV  # noqa: E402  (before TensorFlow is imported, which reads them)

for _k, _v in TF_GCS_ENV.items():
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Two logical CPU devices for MirroredStrategy tests; must happen before TF initializes.
_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
except RuntimeError:
    pass

from beam_jobs import convert  # noqa: E402

# The `alone` marker's lock (a plugin of its own, so that its test runs it without TensorFlow).
from tests._alone import pytest_configure, pytest_runtest_protocol, pytest_unconfigure  # noqa: E402, F401

# The slow tier by measurement (tests/slow_tests.txt).
from tests._tiers import pytest_collection_modifyitems  # noqa: E402, F401

# Property tests run their full example counts in `make test` (CI) and a tenth in
# `make test-fast` (INGEST_HYPOTHESIS=fast), the working loop.
_FAST_PROPERTIES = os.environ.get("INGEST_HYPOTHESIS") == "fast"


def examples(n: int) -> int:
    """Hypothesis' max_examples for a property test that runs `n` in the full tier."""
    return max(10, n // 10) if _FAST_PROPERTIES else n


from ingest import contract  # noqa: E402


def real_csv(name: str = "seattle-weather.csv") -> str:
    """A real dataset shipped with vega_datasets (a test dependency): seattle-weather.csv is
    Seattle's daily weather 2012-2015 (date, precipitation, temp_max, temp_min, wind,
    weather); airports.csv, sf-temps.csv, stocks.csv, ... are there too."""
    import importlib.util

    return os.path.join(importlib.util.find_spec("vega_datasets").submodule_search_locations[0], "_data", name)


def run_convert(*args) -> contract.DatasetInfo:
    return convert.run([str(a) for a in args])


def convert_table(root, table, *args) -> str:
    """Writes `table` as root/in/a.parquet, converts it into root/ds; returns the dataset path."""
    import pyarrow.parquet as pq

    os.makedirs(os.path.join(root, "in"), exist_ok=True)
    pq.write_table(table, os.path.join(root, "in", "a.parquet"))
    run_convert(
        "--source",
        "parquet",
        "--input",
        os.path.join(root, "in", "a.parquet"),
        "--output",
        os.path.join(root, "ds"),
        *args,
    )
    return str(os.path.join(root, "ds"))


def _example_dicts(path, comp: str) -> list:
    out = []
    for raw in tf.data.TFRecordDataset(path, compression_type=comp).as_numpy_iterator():
        ex = tf.train.Example.FromString(raw)
        out.append(
            {
                k: list(getattr(f, f.WhichOneof("kind")).value) if f.WhichOneof("kind") else []
                for k, f in ex.features.feature.items()
            }
        )
    return out


def _cut_block(block: dict, features: dict) -> list:
    """One block's rows, cut by docs/block_format.md alone; missing values as absent keys."""
    (n,) = block["__rows__"]
    rows = [{} for _ in range(n)]
    for name, f in features.items():
        values, shape = block[name], f["shape"]
        if name + "/codes" in block:  # a bytes column: the block's dictionary, a code per value
            values = [values[c] for c in block[name + "/codes"]]
        if shape == []:
            parts = [[v] for v in values]
        elif shape[0] is not None:
            k = shape[0]
            parts = [values[i * k : (i + 1) * k] for i in range(n)]
        else:
            ends = np.cumsum([0, *block[name + "/row_lengths"]])
            parts = [values[ends[i] : ends[i + 1]] for i in range(n)]
        missing = set(block.get(name + "/missing", []))
        for i in range(n):
            if i not in missing:
                rows[i][name] = parts[i]
    return rows


def read_examples(dataset_dir, split: str = "train") -> list:
    """Every row of a split as a dict of Python lists, parsed with protobuf (not ingest).

    Either layout: blocks are cut into their rows by the format spec, checked against the
    metadata's counts, so tests of the conversion read the default layout the same way.
    """
    info = json.load(open(os.path.join(dataset_dir, "dataset_info.json")))
    shards = next(s for s in info["splits"] if s["name"] == split)["shards"]
    return [row for shard in shards for row in read_shard(dataset_dir, shard["filename"])]


def read_shard(dataset_dir, filename: str) -> list:
    """The rows of one shard file of a dataset, in file order (see `read_examples`)."""
    info = json.load(open(os.path.join(dataset_dir, "dataset_info.json")))
    shard = next(s for split in info["splits"] for s in split["shards"] if s["filename"] == filename)
    records = _example_dicts(os.path.join(dataset_dir, filename), "GZIP" if info["compression"] == "gzip" else "")
    # A float64 feature holds the int64 bit patterns of its values (docs/block_format.md).
    wide = [f["name"] for f in info["features"] if f["dtype"] == "float64"]
    for record in records:
        for name in wide:
            if name in record:
                record[name] = np.array(record[name], np.int64).view(np.float64).tolist()
    if info.get("layout", "rows") == "rows":
        return records
    assert len(records) == shard["blocks"] and sum(b["__rows__"][0] for b in records) == shard["records"]
    features = {f["name"]: f for f in info["features"]}
    rows = []
    for block in records:
        assert block["__rows__"][0] <= info["block_rows"]
        rows.extend(_cut_block(block, features))
    return rows


def write_fragments(
    tmp, encode, *, n: int, fragments: int = 4, runs: int = 5, shuffled_runs: bool = True, bundles: int | None = None
) -> list:
    """Values 0..n-1 over `fragments` fragment files of `runs` runs each, as ConvertFiles
    writes them: each run one chunk's share, in random order (or in order, without
    `shuffled_runs`). `encode(fragment, run, values)` gives the run's (data, frame
    lengths, rows); returns the fragments' descriptors. With `bundles`, the same runs
    are written by that many bundles taking turns, as worker processes do: the runs
    of one file then lie in several fragments."""
    from beam_jobs.output.fragments import FragmentWriter

    rng = np.random.default_rng(0)
    per_run = n // (fragments * runs)
    writers = [FragmentWriter(str(tmp), f"bundle{b}") for b in range(bundles or fragments)]
    made = []
    for f in range(fragments):
        for r in range(runs):
            first = (f * runs + r) * per_run
            values = first + (rng.permutation(per_run) if shuffled_runs else np.arange(per_run))
            made.append(((f, 0, r), encode(f, r, values)))
    # Worker processes take work items in no fixed order: their bundles' runs lie in a
    # fragment in another order than the input's.
    order = range(len(made)) if bundles is None else np.random.default_rng(1).permutation(len(made))
    for k in order:
        where, (data, lengths, rows) = made[k]
        writer = writers[where[0] if bundles is None else k % bundles]
        writer.append(0, 0, where, data, lengths, rows=rows)
    return [fragment for w in writers for fragment in w.close()]


def quarantine_lines(dataset_dir) -> list:
    lines = []
    for path in sorted(glob.glob(os.path.join(dataset_dir, "quarantine", "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            lines.extend(json.loads(line) for line in f if line.strip())
    return lines


def write_text(path, text: str, *, encoding="utf-8", newline="\n") -> str:
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding=encoding, newline=newline) as f:
        f.write(text)
    return str(path)


@pytest.fixture
def tmp(tmp_path):
    return tmp_path


@pytest.fixture(scope="session")
def preloaded():
    """Runs test scripts forked from one process that imported TensorFlow (tests/_preloaded.py):
    `preloaded.run([script, *args], env=..., timeout=...)` as `subprocess.run` with its output captured."""
    from tests._preloaded import Server

    server = Server()
    yield server
    server.close()
