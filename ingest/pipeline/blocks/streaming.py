"""The blocks layout's stages after the read: serialized blocks -> batches of rows.

    blocks (shard order shuffled per epoch by the read stage)
      -> [block shuffle buffer] -> [repeat]
      -> windows of W blocks -> one parse_blocks call each -> [rows permuted in the window]
      -> rebatch to batch_size -> [(features, label)]

Three levels of shuffling: shard order, blocks through a buffer, rows within a window.
With a seed, each window's permutation is seeded by (seed, window index, its first
block), so a run is reproducible and every window, epoch and pass permutes differently.
Without `shuffle`, rows come in the order the read stage delivers the blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import tensorflow as tf

from ingest.pipeline import _parse, _tuning
from ingest.pipeline.blocks.parse import check_rows, located_in, parse_blocks, permute_rows

if TYPE_CHECKING:
    from ingest.pipeline._request import Request

__all__ = ["block_batches"]


def _window_seed(seed: int, index, serialized) -> tf.Tensor:
    """A stateless seed per window: the user's seed, the window's index and its first block.

    The index alone would repeat the same permutations on every pass over the dataset
    (Keras' `fit` iterates it anew each epoch); the block shuffle puts a different block
    first in each pass's windows, so hashing it in varies them, reproducibly.
    """
    first = tf.strings.to_hash_bucket_fast(serialized[0], 2**62)
    return tf.stack([tf.constant(seed, tf.int64), index ^ first])


def _window_parser(req: Request, plan: _tuning.FileShards):
    features = _parse.selected_features(req)
    padded = _parse.padder(req)
    split_label = _parse.label_splitter(req) or (lambda rows: rows)
    seed = req.seed
    files = tf.constant(list(plan.files))
    blocks_of = tf.constant(plan.counts, tf.int64)
    rows_of = tf.constant(plan.counts if plan.rows is None else plan.rows, tf.int64)
    block_rows = tf.constant(req.info.block_rows or 0, tf.int64)

    def parse(index, blocks):
        if isinstance(blocks, tuple):  # located: checked against the rows the metadata gives each
            serialized, shards, positions = blocks
            names = tf.gather(files, shards)
            last = tf.gather(blocks_of, shards) - 1
            want = tf.where(positions < last, block_rows, tf.gather(rows_of, shards) - block_rows * last)
            rows, got = parse_blocks(
                serialized,
                features,
                with_block_rows=True,
                locate=located_in(names, positions),
                codes=req.text_codes,
                ids=req.text_ids,
                masks=req.masks,
            )
            with tf.control_dependencies([check_rows(got, want, names, positions)]):
                rows = {name: tf.identity(column) for name, column in rows.items()}
        else:
            serialized = blocks
            rows = parse_blocks(serialized, features, codes=req.text_codes, ids=req.text_ids, masks=req.masks)
        if req.shuffle:
            rows = permute_rows(rows, None if seed is None else _window_seed(seed, index, serialized))
        # The label is split off per window, not per batch: one map fewer per batch (rebatch
        # cuts tuples as it cuts dicts).
        return split_label(padded(rows))

    return parse


def block_batches(ds: tf.data.Dataset, req: Request, plan: _tuning.FileShards) -> tf.data.Dataset:
    """Serialized blocks of this pipeline -> batches of parsed rows (and the label apart, if any)."""
    opts = req.options
    window = _tuning.block_window(req.info.block_rows, plan.records, requested=opts.block_window)
    if req.shuffle:
        buffer = _tuning.block_shuffle_buffer(
            window, plan.records, req.split.bytes / max(req.split.tfrecords, 1), requested=opts.block_shuffle_buffer
        )
        ds = ds.shuffle(buffer, seed=req.seed, reshuffle_each_iteration=True)
    if req.num_epochs != 1:
        ds = ds.repeat(req.num_epochs)
    # The window index seeds its permutation; it counts across epochs, so each differs.
    # Counted with scan, not enumerate: enumerate zips in a second source dataset, which
    # the tf.data service's distributed_epoch mode cannot split.
    ds = ds.batch(window).scan(tf.constant(0, tf.int64), lambda index, blocks: (index + 1, (index, blocks)))
    ds = ds.map(
        _window_parser(req, plan),
        num_parallel_calls=opts.num_parallel_calls or tf.data.AUTOTUNE,
        deterministic=req.deterministic,
    )
    if opts.symbolic_checkpoint:
        # tf.data cannot checkpoint rebatch symbolically; unbatch and batch it can.
        ds = ds.unbatch().batch(req.batch_size, drop_remainder=req.drop_remainder)
    else:
        ds = ds.rebatch(req.batch_size, drop_remainder=req.drop_remainder)
    return ds
