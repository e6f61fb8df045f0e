"""Readers that turn one input file into Arrow record batches plus quarantined rows.

Every file is opened through Beam's `FileSystems`, so local paths, `gs://` and
compressed inputs (`.gz`) all take the same path. A chunk carries the physical row
number of each record (header = row 1, as a spreadsheet shows it) so quarantine
entries point at the source.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jobs._csv_ranges import CsvRange, RangeFile

__all__ = ["CsvFormat", "Chunk", "BadRow", "CsvInput", "open_parquet", "read_csv_header", "iter_csv_chunks", "read_parquet_schema", "iter_parquet_chunks"]

DEFAULT_NULL_VALUES = ("", "NA", "N/A", "null", "NULL")


@dataclasses.dataclass(frozen=True)
class CsvFormat:
    delimiter: str = ","
    null_values: tuple = DEFAULT_NULL_VALUES
    block_size: int = 4 << 20  # bytes per parse block: ~28k rows of a 21-column file; smaller blocks add per-chunk overhead

    def __post_init__(self):
        if len(self.delimiter) != 1:
            raise ValueError(f"--delimiter must be one character, got {self.delimiter!r}")


@dataclasses.dataclass(frozen=True)
class BadRow:
    source: str
    row: int | None
    reason: str
    raw: str
    kind: str = "parse"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Chunk:
    batch: pa.RecordBatch
    rows: np.ndarray  # physical row number of each record
    bad: list  # BadRow found while reading this chunk
    counters: dict = dataclasses.field(default_factory=dict)  # summed into the metadata


class CsvInput:
    """Opens a CSV through Beam's filesystems; gzip is decoded by Arrow, in C++.

    With a `byte_range`, only the records that begin in it are read (`_csv_ranges`).
    """

    def __init__(self, path: str, byte_range: CsvRange | None = None):
        self._path = path
        self._range = byte_range
        self.first_row = 1  # physical row number of the first line read

    def __enter__(self):
        try:
            self._raw = FileSystems.open(self._path, compression_type=CompressionTypes.UNCOMPRESSED)
        except Exception as e:  # Beam raises several types; keep the path in the message.
            raise IOError(f"cannot open input file {self._path}: {e}") from e
        if self._range is not None:
            part = RangeFile(self._raw, self._range.start, self._range.end)
            self.first_row = self._range.newlines_before + 1 + part.skipped_partial_line
            return part
        if self._path.endswith(".gz"):
            return pa.CompressedInputStream(pa.PythonFile(self._raw, mode="r"), "gzip")
        return self._raw

    def __exit__(self, *exc):
        self._raw.close()


def _csv_reader(f, fmt: CsvFormat, path: str, handler=None, column_types=None, column_names=None):
    try:
        return pacsv.open_csv(
            f,
            read_options=pacsv.ReadOptions(block_size=fmt.block_size, use_threads=False, column_names=column_names),
            parse_options=pacsv.ParseOptions(
                delimiter=fmt.delimiter, newlines_in_values=True, invalid_row_handler=handler
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=column_types,
                null_values=list(fmt.null_values),
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            raise ValueError(f"input file {path} is empty: a CSV file needs a header row") from e
        raise ValueError(f"cannot parse CSV file {path}: {e}") from e


def read_csv_header(path: str, fmt: CsvFormat) -> list:
    with CsvInput(path) as f:
        # The reader parses its first block on opening: a small one is enough for names.
        reader = _csv_reader(f, dataclasses.replace(fmt, block_size=1 << 20), path, handler=lambda row: "skip")
        names = list(reader.schema.names)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"input file {path} repeats header column(s) {dupes}; column names must be unique")
    return names


def _utf8_bad_rows(col: pa.Array) -> np.ndarray:
    try:
        col.cast(pa.string())
        return np.zeros(len(col), bool)
    except pa.ArrowInvalid:
        out = np.zeros(len(col), bool)
        for i, v in enumerate(col.to_pylist()):
            if v is not None:
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError:
                    out[i] = True
        return out


def iter_csv_chunks(path: str, header: list, fmt: CsvFormat, columns: list, byte_range: CsvRange | None = None) -> Iterator[Chunk]:
    """Yields chunks of the selected `columns` as binary (text) arrays.

    Without a `byte_range`, or for a file's first range, the file's own header is read
    and checked; later ranges hold no header and take `header` as their column names.
    """
    headless = byte_range is not None and byte_range.index > 0
    pending: list = []  # invalid rows reported by pyarrow since the last chunk
    skipped: set = set()

    def on_invalid(row):
        pending.append(
            BadRow(
                path,
                None if row.number is None else row.number + row_offset,
                f"expected {row.expected_columns} fields, found {row.actual_columns}",
                row.text,
                "field_count",
            )
        )
        if row.number is not None:
            skipped.add(row.number + row_offset)
        return "skip"

    source = CsvInput(path, byte_range)
    with source as f:
        if headless and f.empty:
            return
        # pyarrow numbers rows from the start of what it reads.
        row_offset = source.first_row - 1 if headless else 0
        reader = _csv_reader(f, fmt, path, handler=on_invalid, column_types={c: pa.binary() for c in header},
                             column_names=header if headless else None)
        names = list(reader.schema.names)
        if names != header:
            raise ValueError(
                f"input file {path} has header {names}, but the first file has {header}: "
                "all files of one input must share the header"
            )
        next_row = source.first_row if headless else 2
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except pa.ArrowInvalid as e:
                raise ValueError(f"cannot parse CSV file {path} after row {next_row - 1}: {e}") from e
            n = batch.num_rows
            candidates = np.arange(next_row, next_row + n + len(skipped), dtype=np.int64)
            if skipped:
                candidates = candidates[~np.isin(candidates, np.fromiter(skipped, np.int64))]
            rows = candidates[:n]
            if n:
                next_row = int(rows[-1]) + 1
            skipped = {s for s in skipped if s >= next_row}
            batch = batch.select(columns)
            bad = pending[:]
            pending.clear()
            undecodable = np.zeros(n, bool)
            for name, col in zip(columns, batch.columns):
                m = _utf8_bad_rows(col)
                if m.any():
                    for i in np.flatnonzero(m & ~undecodable):
                        bad.append(BadRow(path, int(rows[i]), f"column {name!r}: text is not valid UTF-8", row_text(batch, i, fmt), "utf8"))
                    undecodable |= m
            if undecodable.any():
                keep = ~undecodable
                batch = batch.filter(pa.array(keep))
                rows = rows[keep]
            yield Chunk(batch, rows, bad)
        if pending:
            yield Chunk(pa.RecordBatch.from_arrays([pa.array([], pa.binary())] * len(columns), names=columns), np.zeros(0, np.int64), pending[:])


def row_text(batch: pa.RecordBatch, i: int, fmt: CsvFormat) -> str:
    """The row as delimiter-joined cells (as parsed: quoting is not reproduced)."""
    cells = []
    for col in batch.columns:
        v = col[i].as_py()
        cells.append("" if v is None else v.decode("utf-8", "backslashreplace"))
    return fmt.delimiter.join(cells)


def read_parquet_schema(path: str) -> pa.Schema:
    with open_parquet(path) as f:
        try:
            return pq.ParquetFile(f).schema_arrow
        except pa.ArrowException as e:
            raise ValueError(f"cannot read Parquet file {path}: {e}") from e


def open_parquet(path: str):
    try:
        # Parquet needs random access: no decompression wrapper.
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as e:
        raise IOError(f"cannot open input file {path}: {e}") from e


def iter_parquet_chunks(path: str, columns: list, batch_rows: int = 32768) -> Iterator[Chunk]:
    with open_parquet(path) as f:
        try:
            pf = pq.ParquetFile(f)
            missing = [c for c in columns if c not in pf.schema_arrow.names]
            if missing:
                raise ValueError(
                    f"input file {path} lacks column(s) {missing}; it has {pf.schema_arrow.names}"
                )
            next_row = 1
            for batch in pf.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
                n = batch.num_rows
                yield Chunk(batch.select(columns), np.arange(next_row, next_row + n, dtype=np.int64), [])
                next_row += n
        except pa.ArrowException as e:
            raise ValueError(f"cannot read Parquet file {path}: {e}") from e
