"""Shared helpers: run real conversions in-process and read shards back independently."""

from __future__ import annotations

import glob
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from tests.gcs import TF_GCS_ENV  # noqa: E402  (before TensorFlow is imported, which reads them)

for _k, _v in TF_GCS_ENV.items():
    os.environ.setdefault(_k, _v)

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
from ingest import contract  # noqa: E402


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


def read_examples(dataset_dir, split: str = "train") -> list:
    """Every record of a split as a dict of Python lists, parsed with protobuf (not ingest)."""
    info = json.load(open(os.path.join(dataset_dir, "dataset_info.json")))
    comp = "GZIP" if info["compression"] == "gzip" else ""
    out = []
    for shard in next(s for s in info["splits"] if s["name"] == split)["shards"]:
        path = os.path.join(dataset_dir, shard["filename"])
        for raw in tf.data.TFRecordDataset(path, compression_type=comp).as_numpy_iterator():
            ex = tf.train.Example.FromString(raw)
            row = {}
            for k, f in ex.features.feature.items():
                kind = f.WhichOneof("kind")
                row[k] = list(getattr(f, kind).value) if kind else []
            out.append(row)
    return out


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
