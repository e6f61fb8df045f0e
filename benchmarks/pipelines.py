"""The hand-written pipelines `make_dataset` is compared with, written as users write them.

They read the same converted shards; their parse specs come from the public metadata
(`ingest.load_info`), as a user would copy them from it.
"""

from __future__ import annotations

import tensorflow as tf

import ingest

_DTYPES = {"int64": tf.int64, "float32": tf.float32, "bytes": tf.string}


def parse_spec(path: str) -> dict:
    info = ingest.load_info(path)
    return {f.name: tf.io.FixedLenFeature(list(f.shape), _DTYPES[f.dtype]) for f in info.features}


def shard_files(path: str, split: str = "train") -> list:
    info = ingest.load_info(path)
    return [f"{path}/{s.filename}" for s in info.split(split).shards]


def naive(path: str, *, batch_size: int, label: str = "label") -> tf.data.Dataset:
    """TFRecordDataset -> map(parse_single_example) -> batch: no parallelism, no prefetch."""
    spec = parse_spec(path)

    def parse_one(record):
        x = tf.io.parse_single_example(record, spec)
        y = x.pop(label)
        return x, y

    return tf.data.TFRecordDataset(shard_files(path)).map(parse_one).batch(batch_size)


def best_practice(path: str, *, batch_size: int, label: str = "label", shuffle_buffer: int = 10_000,
                  cycle_length: int = tf.data.AUTOTUNE, read_buffer_bytes: int | None = None) -> tf.data.Dataset:
    """The TensorFlow guide's advice: parallel interleave, shuffle, batch before a vectorized
    parse_example, AUTOTUNE everywhere, prefetch. With the defaults it is the guide's code
    as written; `tuned_by_hand` sets what an expert tunes after measuring."""
    spec = parse_spec(path)

    def parse_batch(records):
        x = tf.io.parse_example(records, spec)
        y = x.pop(label)
        return x, y

    files = tf.data.Dataset.from_tensor_slices(shard_files(path)).shuffle(64)
    ds = files.interleave(
        lambda f: tf.data.TFRecordDataset(f, buffer_size=read_buffer_bytes),
        cycle_length=cycle_length, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False,
    )
    ds = ds.shuffle(shuffle_buffer).batch(batch_size)
    ds = ds.map(parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.prefetch(tf.data.AUTOTUNE)


def tuned_by_hand(path: str, *, batch_size: int, label: str = "label") -> tf.data.Dataset:
    """The guide's pipeline after an expert's measurements on this machine: 4 shards read
    at once (AUTOTUNE picks 2 here) and a 1 MB read buffer (TF's default is 256 KB)."""
    return best_practice(path, batch_size=batch_size, label=label, cycle_length=4, read_buffer_bytes=1 << 20)
