"""The blocks layout cached in memory as parsed columns, each epoch a permutation of it all.

    serialized blocks of this pipeline -> one parse of them all -> cache (columns, in memory)
      -> per epoch: a permutation of every cached row (or their order, without shuffle)
      -> windows of rows gathered in that order -> [pad] -> rebatch -> [(features, label)]

Parsing happens once, in the first epoch; later epochs only gather. And since every row
is at hand, an epoch is a uniform permutation of all of them: a global shuffle, which a
streaming shuffle buffer cannot give. Used for `cache="memory"` (or "auto" when the
columns fit) on the blocks layout, except with the tf.data service, whose workers each
hold their own cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import tensorflow as tf

from ingest.pipeline import _parse, _tuning
from ingest.pipeline.blocks.parse import parse_blocks

if TYPE_CHECKING:
    from ingest.pipeline._request import Request

__all__ = ["cached_column_batches", "columns_bytes"]

# Bytes per value once parsed: a tf.string value is a 32-byte tstring plus its text.
_VALUE_BYTES = {"int64": 8, "float32": 4, "float64": 8, "bytes": 32}


def columns_bytes(features, rows: int, serialized_bytes: float) -> float:
    """What `rows` rows of `features` take parsed in memory (an estimate for the cache budget).

    Fixed shapes are exact for numbers; strings and variable-length lists are counted
    at their fixed cost plus the serialized bytes, which bound their contents.
    """
    per_row = 0
    for f in features:
        values = 1 if f.is_scalar else (f.shape[0] if not f.is_variable_length else (f.max_length or 1))
        per_row += _VALUE_BYTES[f.dtype] * values + (8 if f.is_variable_length else 0)
    return rows * per_row + serialized_bytes


def _row_count(columns: dict) -> tf.Tensor:
    first = next(iter(columns.values()))
    if isinstance(first, tf.RaggedTensor):
        return first.nrows(out_type=tf.int64)
    return tf.shape(first, out_type=tf.int64)[0]


def cached_column_batches(ds: tf.data.Dataset, req: Request, plan: _tuning.FileShards) -> tf.data.Dataset:
    """Serialized blocks of this pipeline -> batches, parsed once and cached as columns."""
    features = _parse.selected_features(req)
    k = req.info.block_rows
    window_rows = _tuning.block_window(k, plan.records, requested=req.options.block_window) * k
    columns = (
        ds.batch(max(plan.records, 1))
        .map(lambda blocks: parse_blocks(blocks, features, codes=req.text_codes, ids=req.text_ids, masks=req.masks))
        .cache()
    )
    if req.num_epochs != 1:
        columns = columns.repeat(req.num_epochs)
    # One random key per epoch. Dataset.random re-randomizes on each new iterator, so with a
    # seed every pass over the dataset (Keras' fit re-iterates it) permutes anew, reproducibly.
    keys = tf.data.Dataset.random(seed=req.seed, rerandomize_each_iteration=True)
    shuffle = req.shuffle

    def epoch_windows(cols, key):
        rows = _row_count(cols)
        order = tf.range(rows)
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(order, seed=tf.stack([key, rows]))
        starts = tf.range(0, rows, window_rows)

        def window(start):
            picked = order[start : start + window_rows]
            return {name: tf.gather(column, picked) for name, column in cols.items()}

        return tf.data.Dataset.from_tensor_slices(starts).map(
            window, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )

    ds = tf.data.Dataset.zip((columns, keys)).flat_map(epoch_windows)
    padded, split_label = _parse.padder(req), _parse.label_splitter(req) or (lambda rows: rows)
    ds = ds.map(
        lambda rows: split_label(padded(rows)),
        num_parallel_calls=req.options.num_parallel_calls or tf.data.AUTOTUNE,
        deterministic=True,
    )
    return ds.rebatch(req.batch_size, drop_remainder=req.drop_remainder)
