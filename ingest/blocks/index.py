"""Where every block of a split lives: shard, byte offset, rows; and which blocks each input pipeline reads.

The seekable block order (blocks.seekable) reads blocks one by one at their byte offsets,
so that an epoch's order can be any permutation and a restored iterator can start
anywhere. The offsets come from the shard files' TFRecord frame headers (8-byte length,
4-byte CRC, data, 4-byte CRC): one small read per block, in a thread pool, cached per
process by (file, size). Every block holds `block_rows` rows but the last of its shard
(docs/block_format.md); the parser checks that as it reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ingest import contract

__all__ = ["BlockIndex", "block_rows_of", "index_split", "pipeline_blocks"]

_FRAME_OVERHEAD = 16  # length (8), its CRC (4), the data's CRC (4)

_cache_lock = threading.Lock()
_offsets_cache: dict = {}


class ShardSizeError(ValueError):
    """A shard file whose frames do not add up to the blocks its metadata lists."""


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

    offsets = np.empty(blocks + 1, np.int64)
    with tf.io.gfile.GFile(path, "rb") as f:
        size = f.size()
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
        more = "holds more blocks than" if pos < size else "is shorter than"
        raise ShardSizeError(
            f"shard {path} {more} its metadata says: its {blocks} blocks end at byte {pos}, the file has {size}. "
            f"The shard was replaced or appended to after conversion, or {contract.METADATA_FILENAME} comes from "
            "another conversion. Reconvert the dataset."
        )
    offsets[blocks] = size
    return offsets


def _offsets(path: str, blocks: int, size_hint: int, content: str) -> np.ndarray:
    # A dataset reconverted in place may keep its shard names and sizes with other block
    # boundaries: the conversion's id is part of the key.
    key = (path, blocks, size_hint, content)
    with _cache_lock:
        hit = _offsets_cache.get(key)
    if hit is None:
        hit = _scan(path, blocks)
        with _cache_lock:
            _offsets_cache[key] = hit
    return hit


def index_split(
    path: str, split: contract.SplitInfo, block_rows: int, *, content: str = "", threads: int = 16
) -> BlockIndex:
    """Every block of `split`, shard by shard, with its byte offset (scanned) and rows (from the metadata).

    `content`: the id of the conversion that wrote them (`contract.DatasetInfo.source["job"]`).
    """
    shards = split.shards
    files = tuple(f"{path}/{s.filename}" for s in shards)
    with ThreadPoolExecutor(max(1, min(threads, len(shards)))) as pool:
        offsets = list(
            pool.map(lambda i: _offsets(files[i], shards[i].blocks or 0, shards[i].bytes, content), range(len(files)))
        )
    counts = [s.blocks or 0 for s in shards]
    empty = np.zeros(0, np.int64)
    return BlockIndex(
        files,
        np.repeat(np.arange(len(files), dtype=np.int64), counts),
        np.concatenate([o[:-1] for o in offsets]) if offsets else empty,
        np.concatenate([np.diff(o) for o in offsets]) if offsets else empty,
        np.concatenate([block_rows_of(s, block_rows) for s in shards]) if shards else empty,
        np.concatenate([np.arange(c, dtype=np.int64) for c in counts]) if shards else empty,
        content,
    )


def pipeline_blocks(index: BlockIndex, *, num_pipelines: int, pipeline_id: int) -> BlockIndex:
    """The blocks input pipeline `pipeline_id` of `num_pipelines` reads.

    Whole shards, dealt round robin, when there are at least as many shards as pipelines
    (each pipeline opens only its own files); otherwise blocks dealt round robin.
    """
    if num_pipelines <= 1:
        return index
    if not 0 <= pipeline_id < num_pipelines:
        raise ValueError(f"input pipeline id {pipeline_id} is out of range for {num_pipelines} pipelines")
    if len(index.files) >= num_pipelines:
        return index.take(np.flatnonzero(index.file_of % num_pipelines == pipeline_id))
    return index.take(np.arange(pipeline_id, len(index), num_pipelines))
