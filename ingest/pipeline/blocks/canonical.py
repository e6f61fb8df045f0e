"""Canonical partitions: a stream of global batches that does not depend on how many input pipelines read it.

With `ReadOptions(canonical_pipelines=C)` the split's blocks are dealt to C canonical
partitions, each read in its own seekable order (seeded by the user's seed and the
partition) with batches of `global batch / C` rows. Global batch s is the union of
batch s of every partition. An actual input pipeline j of M (M divides C) reads
partitions j, j + M, ... and joins their batch s into its own, so the set of rows in
each global batch is the same for any M. A run stopped at step s (its checkpoint holds
s) can resume with another number of workers at the same global batch size and deliver
every remaining record of the epoch once: Mosaic Streaming's canonical nodes, on the
seekable block order.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING

import tensorflow as tf

from ingest.pipeline.blocks.index import BlockIndex, pipeline_blocks
from ingest.pipeline.blocks.seekable import seekable_block_batches

if TYPE_CHECKING:
    from ingest.pipeline._request import Request

__all__ = ["canonical_batches"]


def _partition_seed(seed: int, partition: int) -> int:
    digest = hashlib.sha256(f"{seed}/{partition}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


def _joined(*batches):
    """One batch of each partition -> this pipeline's batch (their rows one after the other)."""
    return tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *batches)


def canonical_batches(req: Request, index: BlockIndex) -> tuple:
    """This pipeline's batches, joined from its canonical partitions; and the rows it reads per epoch."""
    canonical = req.options.canonical_pipelines
    if canonical > len(index):
        # Each partition must read blocks: an empty one would give no batch to join.
        raise ValueError(
            f"ReadOptions.canonical_pipelines={canonical} is more than the split's {len(index)} blocks in "
            f"{len(index.files)} shard(s): each partition reads whole blocks, so some would read nothing. Use at "
            "most that many, or reconvert with a smaller --block_rows"
        )
    mine = range(req.pipeline_id, canonical, req.num_pipelines)
    share = len(mine)
    streams, rows = [], 0
    for partition in mine:
        blocks = pipeline_blocks(index, num_pipelines=canonical, pipeline_id=partition)
        part = dataclasses.replace(req, batch_size=req.batch_size // share, seed=_partition_seed(req.seed, partition))
        streams.append(seekable_block_batches(part, blocks))
        rows += int(blocks.rows.sum())
    if share == 1:
        return streams[0], rows
    return tf.data.Dataset.zip(tuple(streams)).map(_joined), rows
