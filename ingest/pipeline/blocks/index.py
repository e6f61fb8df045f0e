"""Where every block of a split lives: shard, byte offset, rows; and which blocks each input pipeline reads.

The seekable block order (blocks.seekable) reads blocks one by one at their byte offsets,
so that an epoch's order can be any permutation and a restored iterator can start
anywhere. The offsets come from each shard's block index (docs/block_format.md: its
blocks' frame lengths, written by the conversion beside the shard), one small read per
shard, checked against the metadata's block count and byte size and the shard file's
size. Shards converted before indexes were written are scanned instead: their TFRecord
frame headers (8-byte length, 4-byte CRC, data, 4-byte CRC) read one by one, one small
read per block. Only the shards an input pipeline reads are opened (`pipeline_index`),
in a thread pool, their offsets cached per process. Every block holds `block_rows` rows
but the last of its shard (docs/block_format.md); the parser checks that as it reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ingest import contract
from ingest.pipeline import _tuning

__all__ = ["BlockIndex", "block_rows_of", "index_split", "pipeline_blocks", "pipeline_index"]

_FRAME_OVERHEAD = 16  # length (8), its CRC (4), the data's CRC (4)

_cache_lock = threading.Lock()
_offsets_cache: dict = {}


class ShardSizeError(ValueError):
    """A shard file whose frames do not add up to the blocks its metadata lists."""


class BlockIndexError(ValueError):
    """A shard's block index that is missing, or is not the one its conversion wrote."""


@dataclasses.dataclass(frozen=True)
class BlockIndex:
    """Blocks in a fixed order (shard by shard, as the metadata lists them)."""

    files: tuple  # shard paths
    file_of: np.ndarray  # [blocks] int64: index into files
    offsets: np.ndarray  # [blocks] int64: byte offset of the block's frame
    lengths: np.ndarray  # [blocks] int64: bytes of the block's frame, header and CRCs included
    rows: np.ndarray  # [blocks] int64: rows in the block
    block_in_shard: np.ndarray  # [blocks] int64: the block's position in its shard, for error messages
    # Which conversion wrote the blocks (its job id): two conversions may lay out blocks
    # alike (names, offsets, rows) and still hold other rows.
    content: str = ""

    def __len__(self) -> int:
        return len(self.offsets)

    def take(self, positions) -> "BlockIndex":
        positions = np.asarray(positions, np.int64)
        return BlockIndex(
            self.files,
            self.file_of[positions],
            self.offsets[positions],
            self.lengths[positions],
            self.rows[positions],
            self.block_in_shard[positions],
            self.content,
        )

    def fingerprint(self) -> int:
        """A 62-bit digest of the blocks (conversion, names, offsets, rows): what a checkpoint must find again."""
        h = hashlib.sha256(self.content.encode() + b"\0")
        for name in self.files:
            h.update(name.rsplit("/", 1)[-1].encode() + b"\0")
        for array in (self.file_of, self.offsets, self.lengths, self.rows):
            h.update(np.ascontiguousarray(array, "<i8").tobytes())
        return int.from_bytes(h.digest()[:8], "little") >> 2


def block_rows_of(shard: contract.ShardInfo, block_rows: int) -> np.ndarray:
    """Rows in each block of a shard: `block_rows`, the last one the rest."""
    blocks = shard.blocks or 0
    rows = np.full(blocks, block_rows, np.int64)
    if blocks:
        rows[-1] = shard.records - block_rows * (blocks - 1)
    return rows


def _scan(path: str, blocks: int) -> np.ndarray:
    """Byte offsets of the `blocks` frames of a TFRecord file, and its size last; checks they end together."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        size = f.size()
        # Before the offsets are allocated: the file, not only the metadata, must hold that many frames.
        if size < _FRAME_OVERHEAD * blocks:
            raise ShardSizeError(
                f"shard {path} has {size} bytes, fewer than the {_FRAME_OVERHEAD * blocks} that the "
                f"blocks={blocks} {contract.METADATA_FILENAME} lists for it take at {_FRAME_OVERHEAD} bytes a frame "
                "at least: the shard was cut, or the metadata edited or from another conversion. Reconvert the dataset."
            )
        offsets = np.empty(blocks + 1, np.int64)
        pos = 0
        for j in range(blocks):
            offsets[j] = pos
            f.seek(pos)
            header = f.read(8)
            if len(header) < 8:
                raise ShardSizeError(
                    f"shard {path} ends after {j} of the {blocks} blocks its metadata lists ({size} bytes): "
                    "it is truncated. Reconvert the dataset, or pass skip_corrupt=True."
                )
            pos += struct.unpack("<Q", header)[0] + _FRAME_OVERHEAD
    if pos != size:
        raise _size_error(path, blocks, pos, size)
    offsets[blocks] = size
    return offsets


def _size_error(path: str, blocks: int, end: int, size: int) -> ShardSizeError:
    more = "holds more blocks than" if end < size else "is shorter than"
    return ShardSizeError(
        f"shard {path} {more} its metadata says: its {blocks} blocks end at byte {end}, the file has {size}. "
        f"The shard was replaced or appended to after conversion, or {contract.METADATA_FILENAME} comes from "
        "another conversion. Reconvert the dataset."
    )


def _from_index(path: str, index: str, shard: contract.ShardInfo) -> np.ndarray:
    """What `_scan` gives, from the shard's block index: two small reads, whatever the shard's size.

    A missing, cut or corrupt index, or one that does not describe the shard the metadata
    lists, is an error: falling back to a scan would download the shard on object
    storage, once per input pipeline, behind a warning few would see.
    """
    import tensorflow as tf

    # The index's frames add up to the metadata's bytes (checked below): the file must too.
    size = tf.io.gfile.stat(path).length
    if size != shard.bytes:
        raise _size_error(path, shard.blocks or 0, shard.bytes, size)
    try:
        with tf.io.gfile.GFile(index, "rb") as f:
            # The size the metadata implies, and a byte more to see one too long: a read of
            # the whole file would ask object storage for its size first, a request more.
            expected = contract.block_index_size(shard.blocks or 0)
            data = f.read(expected + 1)
            if len(data) > expected:  # longer than the metadata says: all of it, to tell why
                data += f.read()
    except tf.errors.NotFoundError as e:
        raise BlockIndexError(
            f"block index {index} of shard {path} is missing ({contract.METADATA_FILENAME} names it): copy it "
            "along with its shard (each *.tfrecord.index belongs beside its *.tfrecord), or reconvert the dataset."
        ) from e
    try:
        lengths = contract.decode_block_index(data, blocks=shard.blocks or 0, shard_bytes=shard.bytes)
    except ValueError as e:
        raise BlockIndexError(
            f"block index {index} of shard {path} does not describe that shard: {e}. Its offsets cannot be "
            "trusted; reconvert the dataset (or restore the index its conversion wrote)."
        ) from e
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _offsets(path: str, shard: contract.ShardInfo, index: str | None, content: str) -> np.ndarray:
    # A dataset reconverted in place may keep its shard names and sizes with other block
    # boundaries: the conversion's id is part of the key.
    blocks = shard.blocks or 0
    key = (path, blocks, shard.bytes, content)
    with _cache_lock:
        hit = _offsets_cache.get(key)
    if hit is None:
        hit = _scan(path, blocks) if index is None else _from_index(path, index, shard)
        with _cache_lock:
            _offsets_cache[key] = hit
    return hit


def index_split(
    path: str,
    split: contract.SplitInfo,
    block_rows: int,
    *,
    content: str = "",
    shards: range | None = None,
    threads: int = 16,
) -> BlockIndex:
    """Blocks of `split`, shard by shard, with their byte offsets (from block indexes, or
    scanned) and rows (from the metadata).

    `content`: the id of the conversion that wrote them (`contract.DatasetInfo.source["job"]`).
    `shards`: the positions of the shards whose blocks are listed (and whose offsets alone
    are read); None lists every shard's. The index always names every shard of the split,
    so that `file_of` and the fingerprint do not depend on which were listed.
    """
    files = tuple(f"{path}/{s.filename}" for s in split.shards)
    listed = list(range(len(files)) if shards is None else shards)
    chosen = [split.shards[i] for i in listed]
    indexes = [None if s.index is None else f"{path}/{s.index}" for s in chosen]
    with ThreadPoolExecutor(max(1, min(threads, len(listed)))) as pool:
        offsets = list(
            pool.map(lambda j: _offsets(files[listed[j]], chosen[j], indexes[j], content), range(len(listed)))
        )
    counts = [s.blocks or 0 for s in chosen]
    empty = np.zeros(0, np.int64)
    return BlockIndex(
        files,
        np.repeat(np.asarray(listed, np.int64), counts),
        np.concatenate([o[:-1] for o in offsets]) if offsets else empty,
        np.concatenate([np.diff(o) for o in offsets]) if offsets else empty,
        np.concatenate([block_rows_of(s, block_rows) for s in chosen]) if chosen else empty,
        np.concatenate([np.arange(c, dtype=np.int64) for c in counts]) if chosen else empty,
        content,
    )


def pipeline_blocks(index: BlockIndex, *, num_pipelines: int, pipeline_id: int) -> BlockIndex:
    """The blocks input pipeline `pipeline_id` of `num_pipelines` reads.

    Whole shards, dealt round robin, when there are at least as many shards as pipelines
    (each pipeline opens only its own files); otherwise blocks dealt round robin.
    """
    mine = _tuning.dealt_files(len(index.files), num_pipelines=num_pipelines, pipeline_id=pipeline_id)
    if mine is not None:
        return index.take(np.flatnonzero(np.isin(index.file_of, np.asarray(mine, np.int64))))
    if num_pipelines <= 1:
        return index
    return index.take(np.arange(pipeline_id, len(index), num_pipelines))


def pipeline_index(
    path: str, split: contract.SplitInfo, block_rows: int, *, content: str = "", num_pipelines: int, pipeline_id: int
) -> BlockIndex:
    """`pipeline_blocks` of the split's index, reading the offsets of this pipeline's shards
    only: on a large dataset every trainer opens a few block indexes, not all of them."""
    mine = _tuning.dealt_files(len(split.shards), num_pipelines=num_pipelines, pipeline_id=pipeline_id)
    index = index_split(path, split, block_rows, content=content, shards=mine)
    return pipeline_blocks(index, num_pipelines=num_pipelines, pipeline_id=pipeline_id)
