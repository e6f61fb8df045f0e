"""Fragments: the encoded records one bundle wrote for one (split, shard), on disk.

A fragment is a file of TFRecord frames plus an index of their lengths beside it
(little-endian int64), so the commit can cut and shuffle frames without parsing them.
Each chunk appends its share as one run, already in random order when shuffling.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs._background import BackgroundWriter
from beam_jobs.encode.tfrecord import TFRecordError

__all__ = ["INDEX_SUFFIX", "Fragment", "FragmentWriter", "read_index"]

INDEX_SUFFIX = ".index"
_RAW = CompressionTypes.UNCOMPRESSED


@dataclasses.dataclass(frozen=True)
class Fragment:
    """One fragment file, as sent to the commit (a small descriptor, never the records)."""

    split: int
    shard: int
    path: str
    records: int
    bytes: int
    order: tuple  # each run's place in the input, (file index, range, chunk): the commit's order
    segments: tuple  # frames per run, in the order written
    rows: int  # rows its frames hold: `records`, unless a frame is a block of rows

    @property
    def key(self) -> tuple:
        return (self.split, self.shard)


def read_index(f: Fragment) -> np.ndarray:
    """The fragment's frame lengths, checked against its descriptor."""
    with FileSystems.open(f.path + INDEX_SUFFIX, compression_type=_RAW) as idx:
        lengths = np.frombuffer(idx.read(), "<i8")
    if len(lengths) != f.records or int(lengths.sum()) != f.bytes:
        raise TFRecordError(f"fragment {f.path}: index holds {len(lengths)} frames, expected {f.records}")
    return lengths


class _Open:
    def __init__(self, path: str):
        self.path = path
        self.file = BackgroundWriter(FileSystems.create(path, compression_type=_RAW))
        self.index = FileSystems.create(path + INDEX_SUFFIX, compression_type=_RAW)
        self.records = self.bytes = self.rows = 0
        self.segments: list = []
        self.order: list = []


class FragmentWriter:
    """The open fragments of one bundle, one per (split, shard) it wrote to."""

    def __init__(self, tmp_dir: str, bundle: str):
        self._tmp_dir, self._bundle = tmp_dir, bundle
        self._open: dict = {}

    def append(self, split: int, shard: int, where: tuple, data, lengths, rows: int | None = None) -> None:
        """Appends one run of frames (`data`, their `lengths`) to the (split, shard) fragment;
        `rows`: the rows they hold, when frames are blocks."""
        w = self._open.get((split, shard))
        if w is None:
            name = "-".join(f"{i:06d}" for i in where)
            path = f"{self._tmp_dir}/fragments/{split:03d}-{shard:05d}/{name}-{self._bundle}.tfrecord"
            w = self._open[(split, shard)] = _Open(path)
        w.file.write(data)
        w.index.write(np.asarray(lengths, "<i8").tobytes())
        w.records += len(lengths)
        w.bytes += len(data)
        w.segments.append(len(lengths))
        w.order.append(tuple(where))
        w.rows += len(lengths) if rows is None else rows

    def close(self) -> list:
        """Closes every open fragment; returns their descriptors. A close that fails (a full
        disk) closes the rest before it raises: an open file would hold its device busy."""
        out = []
        try:
            for (split, shard), w in self._open.items():
                try:
                    w.file.close()
                finally:
                    w.index.close()
                out.append(
                    Fragment(split, shard, w.path, w.records, w.bytes, tuple(w.order), tuple(w.segments), w.rows)
                )
        except BaseException:
            self.abort()
            raise
        self._open = {}
        return out

    def abort(self) -> None:
        """Closes every open fragment, quietly: the bundle failed, and its temp dir is the
        next run's to remove."""
        for w in self._open.values():
            for f in (w.file, w.index):
                try:
                    f.close()
                except Exception:  # the failure being raised is the one that matters
                    pass
        self._open = {}
