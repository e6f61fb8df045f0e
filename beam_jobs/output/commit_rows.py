"""Writing one shard from its fragments: concatenated, or shuffled by one of three strategies.

Memory stays bounded whatever the shard and corpus size. Each chunk wrote its share of
the shard as a run in random order, so a shard of few runs is shuffled by interleaving
the runs at random (`interleave_runs`: sequential reads, one pass). With more runs, a
shard that fits a small budget is loaded and permuted whole (`permute_in_memory`); a
larger one is shuffled externally (`bucket_on_disk`): frames are streamed into local
temp files (a random bucket each), then each bucket is loaded, permuted and appended. A
random bucket per record plus a random order within each bucket is a uniformly random
order of the shard. Frames are cut by the fragments' length index and reordered by
Arrow's `take`, in C++. The budgets are small next to the job's ~250 MB base, so peak
RSS stays flat from small corpora to large ones.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs._errors import full_disk_named
from beam_jobs.encode.tfrecord import TFRecordError, frames_array, frames_data, grouped_frames, offsets_of
from beam_jobs.output.fragments import read_index

__all__ = [
    "Budget",
    "choose_strategy",
    "concatenate",
    "interleave_runs",
    "permute_in_memory",
    "bucket_on_disk",
    "write_shard",
    "read_exactly",
]

_RAW = CompressionTypes.UNCOMPRESSED


@dataclasses.dataclass(frozen=True)
class Budget:
    # Up to this many runs (chunks) in a shard, it is shuffled by interleaving them; each
    # output slice then reads from up to this many places, fine locally and on GCS.
    max_merged_runs: int = 64
    in_memory_bytes: int = 64 << 20
    bucket_bytes: int = 32 << 20
    read_bytes: int = 8 << 20  # frames read from a fragment at a time
    write_bytes: int = 16 << 20  # permuted frames gathered per write


def choose_strategy(fragments: list, budget: Budget):
    """The shuffle strategy for a shard of these fragments."""
    if sum(len(f.segments) for f in fragments) <= budget.max_merged_runs:
        return interleave_runs
    if sum(f.bytes for f in fragments) <= budget.in_memory_bytes:
        return permute_in_memory
    return bucket_on_disk


def write_shard(fragments: list, out, *, rng: np.random.Generator | None, budget: Budget = Budget()) -> int:
    """Writes the fragments' frames to `out`, shuffled when `rng` is given; returns the count.

    Fragments are taken in source order (their `order`), so without shuffling the
    shard keeps it.
    """
    fragments = sorted(fragments, key=lambda f: (tuple(f.order), f.path))
    if rng is None:
        return concatenate(fragments, out)
    return choose_strategy(fragments, budget)(fragments, out, rng, budget)


def concatenate(fragments: list, out) -> int:
    for f in fragments:
        copied = 0
        with FileSystems.open(f.path, compression_type=_RAW) as src:
            while block := src.read(8 << 20):
                out.write(block)
                copied += len(block)
        if copied != f.bytes:
            raise TFRecordError(f"fragment {f.path} is truncated: it holds {copied} bytes, {f.bytes} were written")
    return sum(f.records for f in fragments)


def interleave_runs(fragments: list, out, rng, budget: Budget) -> int:
    """Interleaves the shard's runs (each already in random order) at random.

    A uniformly random sequence of run labels, each run's label as often as it has
    records, says which run gives the next record: with every run in uniform random
    order, that is a uniform shuffle of the shard. Each output slice reads the next
    few frames of every run it draws from, so reading stays sequential per run and
    memory stays at a slice.
    """
    runs = []  # (fragment position, first byte, frame lengths)
    for i, f in enumerate(fragments):
        lengths, first, byte = read_index(f), 0, 0
        for count in f.segments:
            runs.append((i, byte, lengths[first : first + count]))
            byte += int(lengths[first : first + count].sum())
            first += count
    sizes = np.array([len(r[2]) for r in runs], np.int64)
    labels = rng.permutation(np.repeat(np.arange(len(runs), dtype=np.int32), sizes))
    bounds = [offsets_of(r[2]) for r in runs]
    taken = np.zeros(len(runs), np.int64)
    total_bytes = sum(f.bytes for f in fragments)
    step = max(1, len(labels) * budget.write_bytes // max(total_bytes, 1))
    files = [FileSystems.open(f.path, compression_type=_RAW) for f in fragments]
    try:
        for start in range(0, len(labels), step):
            drawn = labels[start : start + step]
            counts = np.bincount(drawn, minlength=len(runs))
            picked = np.flatnonzero(counts)
            spans = [(int(bounds[r][taken[r]]), int(bounds[r][taken[r] + counts[r]])) for r in picked]
            buf = np.empty(sum(b - a for a, b in spans), np.uint8)
            at = 0
            for r, (a, b) in zip(picked, spans):  # frames of each run, in run order
                src = files[runs[r][0]]
                src.seek(runs[r][1] + a)
                read_exactly(src, memoryview(buf)[at : at + b - a], fragments[runs[r][0]].path)
                at += b - a
            lengths = np.concatenate([runs[r][2][taken[r] : taken[r] + counts[r]] for r in picked])
            taken[picked] += counts[picked]
            # The k-th draw of run r is that run's k-th frame in this slice: a stable
            # sort of the labels lists the slice's frames in buffer order.
            where = np.empty(len(drawn), np.int64)
            where[np.argsort(drawn, kind="stable")] = np.arange(len(drawn))
            out.write(frames_data(frames_array(buf, offsets_of(lengths)).take(where))[0])
    finally:
        for f in files:
            f.close()
    return len(labels)


def permute_in_memory(fragments: list, out, rng, budget: Budget) -> int:
    frames = _loaded(fragments)
    _write_permuted(frames, out, rng, budget)
    return len(frames)


def bucket_on_disk(fragments: list, out, rng, budget: Budget) -> int:
    buckets = max(1, -(-sum(f.bytes for f in fragments) // budget.bucket_bytes))
    records = 0
    with tempfile.TemporaryDirectory(prefix="ingest-commit-") as tmp, full_disk_named(tmp):
        files = [open(os.path.join(tmp, f"b{i}"), "w+b") for i in range(buckets)]
        sizes = [[] for _ in range(buckets)]
        try:
            for piece in _pieces(fragments, budget.read_bytes):
                bucket_of = rng.integers(0, buckets, size=len(piece))
                grouped = piece.take(np.argsort(bucket_of, kind="stable"))
                for b, data, lengths in grouped_frames(grouped, np.bincount(bucket_of, minlength=buckets)):
                    files[b].write(data)
                    sizes[b].append(lengths)
            for b, f in enumerate(files):
                f.seek(0)
                lengths = np.concatenate(sizes[b]) if sizes[b] else np.zeros(0, np.int64)
                _write_permuted(frames_array(f.read(), offsets_of(lengths)), out, rng, budget)
                records += len(lengths)
        finally:
            for f in files:
                f.close()
    return records


def _pieces(fragments: list, read_bytes: int):
    """Yields the shard's frames as Arrow arrays of at most ~`read_bytes` each."""
    for f in fragments:
        lengths = read_index(f)
        ends = np.cumsum(lengths)
        with FileSystems.open(f.path, compression_type=_RAW) as src:
            first = 0
            while first < len(lengths):
                start = int(ends[first - 1]) if first else 0
                last = max(first + 1, int(np.searchsorted(ends, start + read_bytes, side="right")))
                data = np.empty(int(ends[last - 1]) - start, np.uint8)
                read_exactly(src, memoryview(data), f.path)
                yield frames_array(data, offsets_of(lengths[first:last]))
                first = last


def _loaded(fragments: list) -> pa.Array:
    """Every frame of the shard, read straight into one buffer."""
    buf = np.empty(sum(f.bytes for f in fragments), np.uint8)
    lengths, at = [], 0
    for f in fragments:
        lengths.append(read_index(f))
        with FileSystems.open(f.path, compression_type=_RAW) as src:
            read_exactly(src, memoryview(buf)[at : at + f.bytes], f.path)
        at += f.bytes
    lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    return frames_array(buf, offsets_of(lengths))


def _write_permuted(frames: pa.Array, out, rng, budget: Budget) -> None:
    n = len(frames)
    if not n:
        return
    perm = rng.permutation(n)
    step = max(1, n * budget.write_bytes // max(frames_data(frames)[0].nbytes, 1))
    for start in range(0, n, step):
        out.write(frames_data(frames.take(perm[start : start + step]))[0])


def read_exactly(src, view: memoryview, path: str) -> None:
    got = 0
    while got < len(view) and (n := src.readinto(view[got:])):
        got += n
    if got != len(view):
        raise TFRecordError(f"fragment {path} is truncated: wanted {len(view)} more bytes, got {got}")
