"""The conversion's seams without Beam: per-chunk typing and routing, stats merging, and a
new source format added as one adapter plus one registry line."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pytest

from beam_jobs import _chunk
from beam_jobs.convert import ConversionError
from beam_jobs.encode.tfrecord import frames_array, offsets_of
from beam_jobs.sources import ADAPTER_FOR_FORMAT, Source, readers
from beam_jobs.sources.base import match_files, select_columns
from beam_jobs.sources.csv import CsvSource
from beam_jobs.sources.parquet import ParquetSource, type_arrow_chunk
from beam_jobs.stats.conversion import ConversionStats
from tests.conftest import read_examples, run_convert, write_text


def _csv_source(*columns) -> CsvSource:
    return CsvSource(
        input_pattern="in.csv",
        columns=columns,
        input_bytes=0,
        input_count=1,
        schema_origin="given",
        header=columns,
        files=("in.csv",),
    )


def _text_chunk(**columns) -> readers.Chunk:
    batch = pa.RecordBatch.from_pydict(
        {k: pa.array([None if v is None else v.encode() for v in vs], pa.binary()) for k, vs in columns.items()}
    )
    return readers.Chunk(batch, np.arange(2, 2 + batch.num_rows), [])


def test_typed_quarantines_bad_cells_and_missing_labels_and_keeps_the_rest():
    source = _csv_source("id", "y")
    chunk = _text_chunk(id=["1", "x", "3", "4"], y=["a", "b", None, "d"])
    done = _chunk.typed(source, "in.csv", chunk, {"id": ("int64", ()), "y": ("bytes", ())}, label="y")
    assert done.cols[0][2].to_pylist() == [1, 4] and done.cols[1][2].to_pylist() == [b"a", b"d"]
    assert done.rows.tolist() == [2, 5]
    assert [(b.row, b.kind) for b in done.bad] == [(3, "type"), (4, "missing_label")]
    assert done.bad[0].raw == "x,b" and "'x' is not a valid int64" in done.bad[0].reason


def test_arrow_typing_quarantines_values_the_stored_type_cannot_hold():
    source = ParquetSource(
        input_pattern="in.parquet", columns=("u",), input_bytes=0, input_count=1, schema_origin="parquet"
    )
    chunk = readers.Chunk(
        pa.RecordBatch.from_pydict({"u": pa.array([1, 2**64 - 1], pa.uint64())}), np.array([0, 1]), []
    )
    cols, bad, mask = type_arrow_chunk(source, "in.parquet", chunk, {"u": ("int64", ())})
    assert mask.tolist() == [False, True] and bad[0].kind == "type" and bad[0].row == 1


def _frames(n: int) -> pa.Array:
    return frames_array(np.arange(n, dtype=np.uint8), offsets_of(np.ones(n, np.int64)))


@pytest.mark.parametrize("shuffle", [True, False])
def test_routed_places_every_record_once_and_is_deterministic(shuffle):
    routing = _chunk.Routing(splits=(("train", 0.75), ("eval", 0.25)), num_shards=(3, 2), shuffle=shuffle, seed=7)
    hashes = np.arange(200, dtype=np.uint32) * np.uint32(2654435761)
    pieces = list(_chunk.routed(_frames(200), _chunk.splits_of(hashes, routing), routing, (0, 0, 0), {}))
    again = list(_chunk.routed(_frames(200), _chunk.splits_of(hashes, routing), routing, (0, 0, 0), {}))
    assert [(s, h, bytes(d)) for s, h, d, _ in pieces] == [(s, h, bytes(d)) for s, h, d, _ in again]
    seen = sorted(b for _, _, d, _ in pieces for b in bytes(d))
    assert seen == sorted(np.arange(200, dtype=np.uint8).tolist())
    assert {(s, h) for s, h, _, _ in pieces} <= {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)}
    train = sum(len(lengths) for s, _, _, lengths in pieces if s == 0)
    assert 120 < train < 180
    if not shuffle:  # source order within each shard
        for _, _, data, _ in pieces:
            assert list(bytes(data)) == sorted(bytes(data))


def test_stats_merge_adds_counts_and_keeps_the_extremes():
    a, b = ConversionStats(), ConversionStats()
    a.rows, b.rows = 3, 4
    a.add_bad(["type", "type"])
    b.add_bad(["missing_label"])
    a.add_records("train", 1)
    b.add_records("train", 2)
    a.add_features([("v", "int64", pa.array([[1, 2], None], pa.list_(pa.int64())))], 2)
    b.add_features([("v", "int64", pa.array([[1, 2, 3, 4], [5]], pa.list_(pa.int64())))], 2)
    m = ConversionStats.merge([a, b])
    assert (m.rows, m.bad, m.reasons, m.split_records) == (7, 3, {"type": 2, "missing_label": 1}, {"train": 3})
    assert (m.missing, m.min_len, m.max_len) == ({"v": 1}, {"v": 1}, {"v": 4})


def test_a_flag_of_another_source_is_refused(tmp):
    src = write_text(tmp / "a.csv", "a\n1\n")
    with pytest.raises(ConversionError, match=r"--max_side applies to --source images, not --source csv"):
        run_convert("--source", "csv", "--input", src, "--output", tmp / "out", "--max_side", "64")
    with pytest.raises(ConversionError, match=r"--delimiter applies to --source csv, not --source parquet"):
        run_convert("--source", "parquet", "--input", src, "--output", tmp / "out", "--delimiter", ";")


@dataclasses.dataclass(frozen=True)
class _JsonLinesSource(Source):
    """A whole new input format in a few lines: what the README's development section shows."""

    files: tuple = ()
    arrow_types: tuple = ()

    format: ClassVar[str] = "jsonl"

    @classmethod
    def open(cls, args):
        files = match_files(args.input)
        first = json.loads(open(files[0][0]).readline())
        columns = select_columns(list(first), args)
        types = tuple((c, "int64" if isinstance(first[c], int) else "bytes", ()) for c in columns)
        return cls(
            input_pattern=args.input,
            columns=tuple(columns),
            input_bytes=sum(s for _, s in files),
            input_count=len(files),
            schema_origin="jsonl",
            files=tuple(p for p, _ in files),
            arrow_types=types,
        )

    def expansion(self):
        return 2.0

    def work_items(self):
        return [(i, path, None) for i, path in enumerate(self.files)]

    def decided_types(self, type_counts, *, tolerance):
        return {name: (dtype, shape) for name, dtype, shape in self.arrow_types}

    def read(self, item):
        import pyarrow.json as pj

        table = pj.read_json(item[1])
        return item[1], iter([readers.Chunk(b, np.arange(1, 1 + b.num_rows), []) for b in table.to_batches()])

    def type_chunk(self, path, chunk, types):
        return type_arrow_chunk(self, path, chunk, types)


def test_a_new_source_is_one_adapter_and_one_registry_line(tmp, monkeypatch):
    monkeypatch.setitem(ADAPTER_FOR_FORMAT, "jsonl", _JsonLinesSource)
    src = write_text(tmp / "in" / "a.jsonl", "".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(5)))
    info = run_convert("--source", "jsonl", "--input", src, "--output", tmp / "out", "--label", "id")
    assert info.source["format"] == "jsonl" and [f.name for f in info.features] == ["id", "name"]
    assert sorted((r["id"][0], r["name"][0]) for r in read_examples(tmp / "out")) == [
        (i, f"n{i}".encode()) for i in range(5)
    ]
