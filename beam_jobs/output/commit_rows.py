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

import contextlib
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
    "Run",
    "runs_in_input_order",
    "RunReader",
    "coalesced",
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


@dataclasses.dataclass(frozen=True)
class Run:
    """One chunk's share of a shard, as it lies in a fragment."""

    fragment: int  # position of its fragment in the shard's list
    byte: int  # its first byte in that fragment
    lengths: np.ndarray  # its frames' lengths


def runs_in_input_order(fragments: list) -> list:
    """Every run of the shard's fragments, in the input order of the chunks that wrote them.

    A fragment holds the runs of one bundle, and which chunks share a bundle depends on
    the runner (one in-process worker reads them in order; two workers take turns). The
    runs' own order does not: (file index, range, chunk) of each. So a shard, shuffled or
    not, is the same bytes from any number of workers.
    """
    keyed = []
    for i, f in enumerate(fragments):
        lengths, first, byte = read_index(f), 0, 0
        for place, count in zip(f.order, f.segments, strict=True):
            run = lengths[first : first + count]
            keyed.append(((tuple(place), f.path), Run(i, byte, run)))
            byte += int(run.sum())
            first += count
    keyed.sort(key=lambda k: k[0])
    return [run for _, run in keyed]


# Fragment files a reader keeps open at once. Runs are read in input order, and with several
# workers consecutive runs come from different bundles' fragments; a shard of a job with
# thousands of input files would otherwise hold a file (and, on GCS, a 16 MB read buffer)
# open for each fragment.
_OPEN_FILES = 16


class RunReader:
    """Reads runs (or stretches of them) from the shard's fragments. A file is opened when
    first read; at most `max_open` stay open, the least recently read closed first (and
    opened again if read again), and all close with the reader."""

    def __init__(self, fragments: list, max_open: int | None = None):
        self._fragments, self._max_open = fragments, max_open or _OPEN_FILES
        self._files: dict = {}  # fragment position -> open file, least recently read first

    def read(self, run: Run, view: memoryview, skip: int = 0) -> None:
        """Fills `view` from `run`'s bytes, `skip` bytes in."""
        src = self._files.pop(run.fragment, None)
        if src is None:
            while len(self._files) >= self._max_open:
                self._files.pop(next(iter(self._files))).close()
            src = FileSystems.open(self._fragments[run.fragment].path, compression_type=_RAW)
        self._files[run.fragment] = src  # now the most recently read
        src.seek(run.byte + skip)
        read_exactly(src, view, self._fragments[run.fragment].path)

    def bytes_of(self, run: Run) -> np.ndarray:
        buf = np.empty(int(run.lengths.sum()), np.uint8)
        self.read(run, memoryview(buf))
        return buf

    def close(self) -> None:
        files, self._files = self._files, {}
        for f in files.values():
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def coalesced(runs: list) -> list:
    """The runs with each one that continues the one before in the same fragment (the
    next chunk of one work item, as one worker wrote them) merged into it: fewer, larger
    reads."""
    out: list = []
    for run in runs:
        last = out[-1] if out else None
        if last is not None and last.fragment == run.fragment and last.byte + int(last.lengths.sum()) == run.byte:
            out[-1] = Run(last.fragment, last.byte, np.concatenate([last.lengths, run.lengths]))
        else:
            out.append(run)
    return out


def write_shard(fragments: list, out, *, rng: np.random.Generator | None, budget: Budget = Budget()) -> int:
    """Writes the fragments' frames to `out`, shuffled when `rng` is given; returns the count.

    Runs are taken in input order (`runs_in_input_order`), so without shuffling the
    shard keeps it, and a seed gives one shard whichever bundles wrote the runs.
    """
    fragments = sorted(fragments, key=lambda f: f.path)
    if rng is None:
        return concatenate(fragments, out, budget)
    return choose_strategy(fragments, budget)(fragments, out, rng, budget)


def concatenate(fragments: list, out, budget: Budget = Budget()) -> int:
    records = 0
    with RunReader(fragments) as reader:
        for run in coalesced(runs_in_input_order(fragments)):
            for part in _stretches(run, budget.read_bytes):
                out.write(reader.bytes_of(part))
            records += len(run.lengths)
    return records


def interleave_runs(fragments: list, out, rng, budget: Budget) -> int:
    """Interleaves the shard's runs (each already in random order) at random.

    A uniformly random sequence of run labels, each run's label as often as it has
    records, says which run gives the next record: with every run in uniform random
    order, that is a uniform shuffle of the shard. Each output slice reads the next
    few frames of every run it draws from, so reading stays sequential per run and
    memory stays at a slice.
    """
    runs = runs_in_input_order(fragments)
    sizes = np.array([len(r.lengths) for r in runs], np.int64)
    labels = rng.permutation(np.repeat(np.arange(len(runs), dtype=np.int32), sizes))
    bounds = [offsets_of(r.lengths) for r in runs]
    taken = np.zeros(len(runs), np.int64)
    total_bytes = sum(f.bytes for f in fragments)
    step = max(1, len(labels) * budget.write_bytes // max(total_bytes, 1))
    # Every slice reads from every run: all their files stay open (max_merged_runs bounds them).
    with RunReader(fragments, max_open=len(fragments)) as reader:
        for start in range(0, len(labels), step):
            drawn = labels[start : start + step]
            counts = np.bincount(drawn, minlength=len(runs))
            picked = np.flatnonzero(counts)
            spans = [(int(bounds[r][taken[r]]), int(bounds[r][taken[r] + counts[r]])) for r in picked]
            buf = np.empty(sum(b - a for a, b in spans), np.uint8)
            at = 0
            for r, (a, b) in zip(picked, spans):  # frames of each run, in run order
                reader.read(runs[r], memoryview(buf)[at : at + b - a], skip=a)
                at += b - a
            lengths = np.concatenate([runs[r].lengths[taken[r] : taken[r] + counts[r]] for r in picked])
            taken[picked] += counts[picked]
            # The k-th draw of run r is that run's k-th frame in this slice: a stable
            # sort of the labels lists the slice's frames in buffer order.
            where = np.empty(len(drawn), np.int64)
            where[np.argsort(drawn, kind="stable")] = np.arange(len(drawn))
            out.write(frames_data(frames_array(buf, offsets_of(lengths)).take(where))[0])
    return len(labels)


def permute_in_memory(fragments: list, out, rng, budget: Budget) -> int:
    frames = _loaded(fragments)
    _write_permuted(frames, out, rng, budget)
    return len(frames)


def bucket_on_disk(fragments: list, out, rng, budget: Budget) -> int:
    buckets = max(1, -(-sum(f.bytes for f in fragments) // budget.bucket_bytes))
    records = 0
    pieces = _pieces(fragments, budget.read_bytes)
    with contextlib.closing(pieces), tempfile.TemporaryDirectory(prefix="ingest-commit-") as tmp, full_disk_named(tmp):
        files = [open(os.path.join(tmp, f"b{i}"), "w+b") for i in range(buckets)]
        sizes = [[] for _ in range(buckets)]
        try:
            for piece in pieces:
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


def _stretches(run: Run, read_bytes: int):
    """`run` cut into consecutive parts (Runs) of ~`read_bytes` (at least one frame each).

    Each part's byte offset comes from the one running sum: summing the frames before each
    part anew was quadratic in the parts of a run (a shard's run at a small read budget).
    """
    ends = np.cumsum(run.lengths)
    first = 0
    while first < len(run.lengths):
        start = int(ends[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(ends, start + read_bytes, side="right")))
        yield Run(run.fragment, run.byte + start, run.lengths[first:last])
        first = last


def _pieces(fragments: list, read_bytes: int):
    """Yields the shard's frames, in input order, as Arrow arrays of at most ~`read_bytes` each."""
    with RunReader(fragments) as reader:
        for run in coalesced(runs_in_input_order(fragments)):
            for part in _stretches(run, read_bytes):
                yield frames_array(reader.bytes_of(part), offsets_of(part.lengths))


def _loaded(fragments: list) -> pa.Array:
    """Every frame of the shard, in input order, read straight into one buffer: each
    fragment front to back (its runs in the order they lie in it: one sequential read,
    one file open at a time), each run into its place in input order."""
    runs = runs_in_input_order(fragments)
    at = np.cumsum([0] + [int(r.lengths.sum()) for r in runs])
    buf = np.empty(int(at[-1]), np.uint8)
    by_fragment: dict = {}
    for place, run in enumerate(runs):
        by_fragment.setdefault(run.fragment, []).append((run.byte, place))
    for i, placed in sorted(by_fragment.items()):
        with FileSystems.open(fragments[i].path, compression_type=_RAW) as src:
            for byte, place in sorted(placed):
                src.seek(byte)
                read_exactly(src, memoryview(buf)[at[place] : at[place + 1]], fragments[i].path)
    lengths = np.concatenate([r.lengths for r in runs]) if runs else np.zeros(0, np.int64)
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
