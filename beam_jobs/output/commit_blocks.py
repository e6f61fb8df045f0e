"""Writing one shard of the blocks layout: its rows shuffled one by one, then cut into blocks.

A block holds K consecutive rows of the shard's final order (docs/block_format.md), so
rows must be shuffled before they are grouped: blocks cut earlier, chunk by chunk, would
keep each block's rows from one stretch of the input however the blocks were shuffled
after. Fragments of this layout therefore hold columns, not records: each chunk's share
of the shard as one Arrow IPC stream (a "frame" of the fragment index), its feature
dtypes in the field metadata. The commit shuffles their rows with the strategies of
`_commit`, restated for tables (in memory when the shard fits the budget, else through
random buckets on local disk), and encodes full blocks as rows arrive: only the shard's
last block is short.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs._errors import full_disk_named
from beam_jobs.encode.blocks import encode_blocks
from beam_jobs.encode.tfrecord import key_ranges
from beam_jobs.output.commit_rows import Budget, RunReader, coalesced, runs_in_input_order
from ingest import contract

__all__ = ["run_bytes", "write_block_shard", "write_block_index"]

_RAW = CompressionTypes.UNCOMPRESSED
_DTYPE_KEY = b"ingest.dtype"
_ROWS_PER_ENCODE = 64  # blocks encoded per call: bounds the encoder's working memory


def run_bytes(columns, rows: np.ndarray) -> pa.Buffer:
    """One chunk's rows of a shard (`rows`: their indices in `columns`, ascending: the
    commit shuffles the shard's rows whatever their order) as an Arrow IPC stream."""
    fields = [pa.field(name, arr.type, metadata={_DTYPE_KEY: dtype.encode()}) for name, dtype, arr in columns]
    whole = len(rows) == len(columns[0][2]) if columns else True  # ascending and all: every row, in order
    arrays = [arr if whole else arr.take(pa.array(rows)) for _, _, arr in columns]
    return _ipc(pa.Table.from_arrays(arrays, schema=pa.schema(fields)))


def _ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()  # not copied into bytes: writers take any buffer


def _tables(data, lengths):
    """The tables of IPC streams laid end to end in `data`, `lengths` bytes each."""
    at = 0
    for n in lengths:
        yield pa.ipc.open_stream(pa.py_buffer(data[at : at + int(n)])).read_all()
        at += int(n)


def _columns(table: pa.Table) -> list:
    return [
        (f.name, f.metadata[_DTYPE_KEY].decode(), table.column(i).combine_chunks()) for i, f in enumerate(table.schema)
    ]


def _concat(tables: list) -> pa.Table:
    # A column that is all null in one chunk has Arrow type null there; promote it.
    return pa.concat_tables(tables, promote_options="permissive")


class _BlockSink:
    """Encodes rows into framed blocks of `block_rows` as they come; writes them to `out`
    and keeps each block's frame length (the shard's block index)."""

    def __init__(self, out, block_rows: int, defaults: dict | None = None, vocabularies: dict | None = None):
        self._out, self._k, self._defaults, self._vocabularies = out, block_rows, defaults, vocabularies
        self._carry: list = []
        self._carried = 0
        self._lengths: list = []

    @property
    def frame_lengths(self) -> np.ndarray:
        return np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)

    def add(self, table: pa.Table) -> None:
        self._carry.append(table)
        self._carried += table.num_rows
        if self._carried >= self._k * _ROWS_PER_ENCODE:
            self._flush(final=False)

    def close(self) -> None:
        self._flush(final=True)

    def _flush(self, *, final: bool) -> None:
        if not self._carried:
            return
        table = _concat(self._carry)
        full = table.num_rows if final else table.num_rows // self._k * self._k
        for start in range(0, full, self._k * _ROWS_PER_ENCODE):
            part = table.slice(start, min(self._k * _ROWS_PER_ENCODE, full - start))
            data, offsets, _, _ = encode_blocks(
                _columns(part), part.num_rows, self._k, self._defaults, self._vocabularies
            )
            self._out.write(memoryview(data))
            self._lengths.append(np.diff(offsets).astype(np.int64))
        rest = table.slice(full)
        self._carry, self._carried = ([rest], rest.num_rows) if rest.num_rows else ([], 0)


def write_block_shard(
    fragments: list,
    out,
    *,
    rng,
    block_rows: int,
    budget: Budget = Budget(),
    on_rows=None,
    defaults=None,
    vocabularies=None,
) -> np.ndarray:
    """Writes the fragments' rows to `out` as blocks, shuffled row by row when `rng` is
    given (else in source order); returns each block's TFRecord frame length, in shard
    order: their count is the shard's blocks, their cumulative sums its block offsets
    (`contract.encode_block_index`). `on_rows(columns, n,
    index)` sees each run of rows ([(name, dtype, array)]) as it is read, before the
    shuffle: the statistics then run beside the permutation and encoding. `defaults`:
    {column: the value a missing one is written as} where not the dtype's natural one.
    `vocabularies`: {column: its vocabulary}, for each block dictionary's ids (`F/ids`)."""
    fragments = sorted(fragments, key=lambda f: f.path)
    sink = _BlockSink(out, block_rows, defaults, vocabularies)
    total_bytes = sum(f.bytes for f in fragments)
    with contextlib.closing(_seen(fragments, on_rows)) as runs:  # its files closed on an error too
        if rng is None:
            for table in runs:
                sink.add(table)
        elif total_bytes <= budget.in_memory_bytes:
            tables = list(runs)
            if tables:
                whole = _concat(tables)
                sink.add(whole.take(rng.permutation(whole.num_rows)))
        else:
            _through_buckets(runs, total_bytes, sink, rng, budget)
    sink.close()
    return sink.frame_lengths


def write_block_index(path: str, frame_lengths: np.ndarray) -> None:
    """Writes a shard's block index (`contract.encode_block_index`) to `path`, beside the
    shard in the job's temp dir: Finalize moves both into place before the metadata that
    names them, so neither is ever part of a dataset without the other."""
    with FileSystems.create(path, mime_type="application/octet-stream", compression_type=_RAW) as f:
        f.write(contract.encode_block_index(frame_lengths))


def _seen(fragments: list, on_rows):
    """The shard's runs as tables, in input order (`runs_in_input_order`: the same shard
    whichever bundles wrote them), each shown to `on_rows` first (if given)."""
    index = 0
    with RunReader(fragments) as reader:
        for run in coalesced(runs_in_input_order(fragments)):
            for table in _tables(reader.bytes_of(run), run.lengths):
                if on_rows is not None and table.num_rows:
                    on_rows(_columns(table), table.num_rows, index)
                    index += 1
                yield table


def _through_buckets(runs, total_bytes: int, sink: _BlockSink, rng, budget: Budget) -> None:
    """A random bucket per row, then each bucket permuted: a uniform shuffle in bounded memory.

    A bucket file holds IPC streams end to end (chunks may differ in their Arrow types,
    e.g. an all-null column), with their lengths kept aside, as fragments do.
    """
    buckets = max(1, -(-total_bytes // budget.bucket_bytes))
    with tempfile.TemporaryDirectory(prefix="ingest-commit-") as tmp, full_disk_named(tmp):
        files = [open(os.path.join(tmp, f"b{i}"), "w+b") for i in range(buckets)]
        lengths: list = [[] for _ in range(buckets)]
        try:
            for table in runs:
                bucket_of = rng.integers(0, buckets, size=table.num_rows)
                grouped = table.take(np.argsort(bucket_of, kind="stable"))
                for b, first, end in key_ranges(np.bincount(bucket_of, minlength=buckets)):
                    data = _ipc(grouped.slice(first, end - first))
                    files[b].write(data)
                    lengths[b].append(len(data))
            for b, file in enumerate(files):
                if not lengths[b]:
                    continue
                file.seek(0)
                table = _concat(list(_tables(file.read(), lengths[b])))
                sink.add(table.take(rng.permutation(table.num_rows)))
        finally:
            for file in files:
                file.close()
