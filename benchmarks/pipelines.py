"""The hand-written pipelines `make_dataset` is compared with, written as users write them.

They read the same converted shards; their parse specs come from the public metadata
(`ingest.load_info`), as a user would copy them from it.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
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


def _interleaved(path: str, *, cycle_length, read_buffer_bytes, shuffle: bool) -> tf.data.Dataset:
    """The shards' records, read `cycle_length` files at a time in parallel."""
    files = tf.data.Dataset.from_tensor_slices(shard_files(path))
    if shuffle:
        files = files.shuffle(64)
    return files.interleave(
        lambda f: tf.data.TFRecordDataset(f, buffer_size=read_buffer_bytes),
        cycle_length=cycle_length,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )


def best_practice(
    path: str,
    *,
    batch_size: int,
    label: str = "label",
    shuffle_buffer: int = 10_000,
    cycle_length: int = tf.data.AUTOTUNE,
    read_buffer_bytes: int | None = None,
    cache: bool = False,
) -> tf.data.Dataset:
    """The TensorFlow guide's advice: parallel interleave, shuffle, batch before a vectorized
    parse_example, AUTOTUNE everywhere, prefetch. With the defaults it is the guide's code
    as written; `tuned_by_hand` sets what an expert tunes after measuring."""
    spec = parse_spec(path)

    def parse_batch(records):
        x = tf.io.parse_example(records, spec)
        y = x.pop(label)
        return x, y

    ds = _interleaved(path, cycle_length=cycle_length, read_buffer_bytes=read_buffer_bytes, shuffle=True)
    if cache:  # the guide: cache before the random work
        ds = ds.cache()
    ds = ds.shuffle(shuffle_buffer).batch(batch_size)
    ds = ds.map(parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.prefetch(tf.data.AUTOTUNE)


def tuned_by_hand(path: str, *, batch_size: int, label: str = "label", cache: bool = False) -> tf.data.Dataset:
    """The guide's pipeline after an expert's measurements on this machine: 4 shards read
    at once (AUTOTUNE picks 2 here) and a 1 MB read buffer (TF's default is 256 KB)."""
    return best_practice(
        path, batch_size=batch_size, label=label, cycle_length=4, read_buffer_bytes=1 << 20, cache=cache
    )


def hand_tuned_rows(path: str, *, batch_size: int, label: str = "label") -> tf.data.Dataset:
    """The strongest hand-written row pipeline we know (the block-layout issue's baseline):
    interleave 4 shards, shuffle(50_000) records, parse 1024 records per parse_example,
    rebatch to batch_size."""
    spec = parse_spec(path)

    def parse_block(records):
        x = tf.io.parse_example(records, spec)
        y = x.pop(label)
        return x, y

    ds = _interleaved(path, cycle_length=4, read_buffer_bytes=1 << 20, shuffle=True)
    ds = ds.shuffle(50_000).batch(1024)
    ds = ds.map(parse_block, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return ds.rebatch(batch_size).prefetch(tf.data.AUTOTUNE)


def raw_read(path: str, *, batch_size: int) -> tf.data.Dataset:
    """The shards' serialized records, read as fast as the hand-tuned pipeline reads them
    and batched, never parsed: the ceiling of any pipeline that parses row records."""
    ds = _interleaved(path, cycle_length=4, read_buffer_bytes=1 << 20, shuffle=False)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def csv_direct(csv_path: str, *, batch_size: int, label: str = "label") -> tf.data.Dataset:
    """Reading the CSV directly with TensorFlow's own helper, as its tutorials do."""
    return tf.data.experimental.make_csv_dataset(
        csv_path, batch_size=batch_size, label_name=label, num_epochs=1, shuffle=True, shuffle_buffer_size=10_000
    )


def parquet_direct(parquet_path: str, *, batch_size: int, label: str = "label") -> tf.data.Dataset:
    """Reading Parquet directly: pyarrow record batches through a Python generator."""
    schema = pq.read_schema(parquet_path)
    arrow_to_tf = {
        pa.int64(): tf.int64,
        pa.int32(): tf.int32,
        pa.float32(): tf.float32,
        pa.float64(): tf.float64,
        pa.bool_(): tf.bool,
        pa.string(): tf.string,
    }
    dtypes = {f.name: arrow_to_tf[f.type] for f in schema}

    def batches():
        for batch in pq.ParquetFile(parquet_path).iter_batches(batch_size=batch_size):
            cols = {name: batch.column(name).to_numpy(zero_copy_only=False) for name in batch.schema.names}
            y = cols.pop(label)
            yield {k: (v.astype(object) if dtypes[k] == tf.string else v) for k, v in cols.items()}, y

    signature = (
        {name: tf.TensorSpec([None], dt) for name, dt in dtypes.items() if name != label},
        tf.TensorSpec([None], dtypes[label]),
    )
    return tf.data.Dataset.from_generator(batches, output_signature=signature).prefetch(tf.data.AUTOTUNE)


def parquet_in_memory(parquet_path: str, *, batch_size: int, label: str = "label") -> tf.data.Dataset:
    """The whole Parquet table in memory, a fresh permutation per epoch (per iterator), one
    `tf.gather` per column per batch: what a user who can hold the table writes by hand."""
    table = pq.read_table(parquet_path)
    columns = {name: tf.constant(table.column(name).to_numpy(zero_copy_only=False)) for name in table.column_names}
    y = columns.pop(label)
    rows = table.num_rows

    def batch(order):
        return {k: tf.gather(v, order) for k, v in columns.items()}, tf.gather(y, order)

    def batches(order):
        starts = tf.data.Dataset.range(0, rows, batch_size)
        return starts.map(lambda start: order[start : start + batch_size])

    orders = tf.data.Dataset.from_tensors(rows).map(lambda n: tf.random.shuffle(tf.range(n, dtype=tf.int64)))
    ds = orders.flat_map(batches).map(batch, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def sleep_each(ds: tf.data.Dataset, ms: float) -> tf.data.Dataset:
    """Each element takes `ms` more to produce, in a tf.data thread (time.sleep frees the GIL)."""

    def slow(*x):
        done = tf.py_function(lambda: (time.sleep(ms / 1000), 0)[1], [], tf.int32)
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, x if len(x) > 1 else x[0])

    return ds.map(slow)


def synthetic_load(*, load_ms: float, prefetch: bool, steps: int) -> tf.data.Dataset:
    """Batches that each take `load_ms` to load: the reference's prefetch scenario."""
    ds = sleep_each(tf.data.Dataset.range(steps).map(lambda i: (tf.fill([32], i), i)), load_ms)
    if prefetch:
        return ds.prefetch(2)
    off = tf.data.Options()
    off.experimental_optimization.inject_prefetch = False  # TF adds one unless told not to
    return ds.with_options(off)
