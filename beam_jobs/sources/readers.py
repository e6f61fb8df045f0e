"""Readers that turn one input file into Arrow record batches plus quarantined rows.

Every file is opened through Beam's `FileSystems`, so local paths, `gs://` and
compressed inputs (`.gz`) all take the same path. A chunk carries the physical row
number of each record (header = row 1, as a spreadsheet shows it) so quarantine
entries point at the source.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from beam_jobs._errors import open_named
from beam_jobs.sources.csv_ranges import CsvRange, RangeFile
from beam_jobs.sources.csv_records import RecordReader, Records

__all__ = [
    "CsvFormat",
    "Chunk",
    "BadRow",
    "CsvInput",
    "open_parquet",
    "read_csv_header",
    "iter_csv_chunks",
    "read_parquet_schema",
    "iter_parquet_chunks",
]

DEFAULT_NULL_VALUES = ("", "NA", "N/A", "null", "NULL")
# A CSV record over this many bytes is quarantined (`too_large`), not converted: a worker
# holds a few copies of a record while it parses, types and encodes it. Records up to it
# are converted whatever `block_size` is.
MAX_RECORD_BYTES = 64 << 20
_HEADER_BLOCK = 64 << 10  # read at launch for each file's header


@dataclasses.dataclass(frozen=True)
class CsvFormat:
    delimiter: str = ","
    null_values: tuple = DEFAULT_NULL_VALUES
    block_size: int = (
        4 << 20
    )  # bytes per parse block: ~28k rows of a 21-column file; smaller blocks add per-chunk overhead
    # Quoted fields may span lines (BigQuery's allowQuotedNewlines); off, as there and in
    # Spark, so that one stray quote cannot swallow the rest of a file.
    allow_quoted_newlines: bool = False

    def __post_init__(self):
        if len(self.delimiter) != 1 or not self.delimiter.isascii() or self.delimiter in '"\r\n':
            raise ValueError(
                f"--delimiter must be one ASCII character other than a quote or line end, got {self.delimiter!r}"
            )


_DELIMITER_NAMES = {"tab": "\t", "\\t": "\t"}  # a tab is awkward to type in a shell
# Delimiters CSV exports use besides ',' (';' where ',' is the decimal mark), by preference.
_OTHER_DELIMITERS = (";", "\t", "|")


def delimiter_of(flag: str | None) -> str:
    """--delimiter's value as one character: ',' when not given; 'tab' and '\\t' as a tab."""
    if flag is None:
        return ","
    return _DELIMITER_NAMES.get(flag.lower(), flag)


def refuse_other_delimiter(names: list, *, path: str) -> None:
    """Refuses a header that the default ',' reads as one column holding another common
    delimiter: converted, it would be one text column named 'a;b;c', each row one cell."""
    if len(names) != 1:
        return
    counts = {d: names[0].count(d) for d in _OTHER_DELIMITERS}
    found = max(_OTHER_DELIMITERS, key=lambda d: counts[d])  # the first of the most frequent
    if not counts[found]:
        return
    spelled = "tab" if found == "\t" else repr(found)
    raise ValueError(
        f"input file {path}: with the default --delimiter ',' its header is one column, {names[0]!r:.120}, "
        f"which holds {counts[found]} {spelled} character(s): pass --delimiter {spelled} to split it into "
        "columns (or --delimiter ',' if it really is one column)"
    )


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
    # CSV: what the type count computed that typing reuses ({column: {dtype: ...}},
    # `column_types.count_types`), when the chunk is kept from the inference pass
    casts: dict = dataclasses.field(default_factory=dict)
    # Typing: {column: (values float32 changed, the largest absolute change)} of a column
    # stored as float32 though float32 changes some value (a type given or carried).
    bent: dict = dataclasses.field(default_factory=dict)


class CsvInput:
    """Opens a CSV through Beam's filesystems; gzip is decoded by Arrow, in C++.

    With a `byte_range`, only the records that begin in it are read (`sources.csv_ranges`).
    """

    def __init__(self, path: str, byte_range: CsvRange | None = None):
        self._path = path
        self._range = byte_range
        self.first_row = 1  # physical row number of the first line read

    def __enter__(self):
        self._raw = open_named("--input", self._path)
        if self._range is not None:
            part = RangeFile(self._raw, self._range.start, self._range.end)
            self.first_row = self._range.newlines_before + 1 + part.skipped_partial_line
            return part
        if self._path.endswith(".gz"):
            return pa.CompressedInputStream(pa.PythonFile(self._raw, mode="r"), "gzip")
        return self._raw

    def __exit__(self, *exc):
        self._raw.close()


def _record_blocks(f, path: str, fmt: CsvFormat, *, first_line: int = 1, file_start: bool = True, block_size=None):
    return RecordReader(
        f,
        path=path,
        delimiter=fmt.delimiter,
        multiline=fmt.allow_quoted_newlines,
        block_size=block_size or fmt.block_size,
        max_record_bytes=MAX_RECORD_BYTES,
        first_line=first_line,
        file_start=file_start,
    )


def read_csv_header(path: str, fmt: CsvFormat) -> list:
    """The column names of a file, checked: run at launch for every input file."""
    with CsvInput(path) as f:
        names, line, _ = _read_header(iter(_record_blocks(f, path, fmt, block_size=_HEADER_BLOCK)), path, fmt)
    for i, name in enumerate(names):
        if not name.strip():
            raise ValueError(
                f"input file {path}: header column {i + 1} has no name (line {line} reads {names}): "
                "name every column in the header line"
            )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"input file {path} repeats header column(s) {dupes}; column names must be unique")
    return names


def _read_header(blocks, path: str, fmt: CsvFormat):
    """-> (column names, the header's line, the rest of the block that held it)."""
    for block in blocks:
        first_good = int(block.lines[0]) if len(block.lines) else None
        problem = next((b for b in block.bad if first_good is None or b.line < first_good), None)
        if problem is not None:
            raise ValueError(f"input file {path}: the header (line {problem.line}) {_BAD_RECORD[problem.kind]}")
        if first_good is None:
            continue
        end = int(block.starts[1]) if len(block.starts) > 1 else len(block.data)
        names = _header_names(block.data[int(block.starts[0]) : end], path, fmt, first_good)
        rest = Records(block.data[end:], block.starts[1:] - end, block.lines[1:], block.bad)
        return names, first_good, rest
    raise ValueError(f"input file {path} is empty: a CSV file needs a header row")


def _header_names(record: bytes, path: str, fmt: CsvFormat, line: int) -> list:
    if record.startswith(b"PAR1"):
        raise ValueError(f"input file {path} is a Parquet file (it starts with PAR1), not CSV: use --source parquet")
    if record.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in record:
        raise ValueError(
            f"input file {path} looks UTF-16 (or UTF-32) encoded: its header holds a UTF-16 byte-order mark or NUL "
            f"bytes. CSV input must be UTF-8: convert it, e.g. iconv -f UTF-16 -t UTF-8 {path} > utf8.csv"
        )
    try:
        record.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"input file {path}: the header (line {line}) is not UTF-8 (byte 0x{record[e.start]:02x} at offset "
            f"{e.start}). CSV input must be UTF-8; if the file is Latin-1 or Windows-1252, convert it, e.g. "
            f"iconv -f CP1252 -t UTF-8 {path} > utf8.csv"
        ) from e
    data = record if record.endswith((b"\n", b"\r")) else record + b"\n"
    try:
        table = pacsv.read_csv(
            pa.py_buffer(data),
            read_options=pacsv.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=pacsv.ParseOptions(delimiter=fmt.delimiter, newlines_in_values=True),
        )
    except UnicodeDecodeError as e:
        raise ValueError(
            f"input file {path}: its header (line {line}) is not valid UTF-8 ({e}). CSV input must be "
            f"UTF-8: convert it, e.g. iconv -f LATIN1 -t UTF-8 {path} > utf8.csv"
        ) from e
    except pa.ArrowInvalid as e:
        raise ValueError(f"cannot parse the header (line {line}) of CSV file {path}: {e}") from e
    return list(table.schema.names)


_BAD_RECORD = {
    "unterminated_quote": "opens a quoted field it does not close on that line; a quoted field may only span "
    "lines with --allow_quoted_newlines",
    "too_large": "is larger than a CSV record may be",
}


def _bad_record_row(path: str, r) -> BadRow:
    text = r.text.decode("utf-8", "backslashreplace")
    if r.kind == "too_large":
        reason = (
            f"line {r.line}: the record holds {r.size:,} bytes, over the {MAX_RECORD_BYTES / 2**20:g} MB "
            f"a CSV record may hold; raw holds its first {len(r.text):,} bytes"
        )
    else:
        reason = f"line {r.line}: {_BAD_RECORD[r.kind]}"
    return BadRow(path, r.line, reason, text, r.kind)


def _valid_utf8(col: pa.Array) -> bool:
    """Whether every value of a binary array is UTF-8: one vectorized check by Arrow."""
    try:
        col.cast(pa.string())
        return True
    except pa.ArrowInvalid:
        return False


def _utf8_bad_rows(col: pa.Array) -> np.ndarray:
    out = np.zeros(len(col), bool)
    if _valid_utf8(col):
        return out
    for i, v in enumerate(col.to_pylist()):
        if v is not None:
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                out[i] = True
    return out


def iter_csv_chunks(
    path: str, header: list, fmt: CsvFormat, columns: list, byte_range: CsvRange | None = None
) -> Iterator[Chunk]:
    """Yields chunks of the selected `columns` as binary (text) arrays.

    Without a `byte_range`, or for a file's first range, the file's own header is read
    and checked; later ranges hold no header and take `header` as their column names.
    Records are cut by `sources.csv_records` and parsed by pyarrow a block at a time; each row
    carries the physical line it starts on.
    """
    headless = byte_range is not None and byte_range.index > 0
    source = CsvInput(path, byte_range)
    with source as f:
        if headless and f.empty:
            return
        blocks = iter(_record_blocks(f, path, fmt, first_line=source.first_row, file_start=not headless))
        if not headless:
            names, _, rest = _read_header(blocks, path, fmt)
            if names != header:
                raise ValueError(
                    f"input file {path} has header {names}, but the first file has {header}: "
                    "all files of one input must share the header"
                )
            blocks = itertools.chain([rest], blocks)
        for block in blocks:
            yield _parse_block(block, path, header, fmt, columns)


def _parse_block(block: Records, path: str, header: list, fmt: CsvFormat, columns: list) -> Chunk:
    bad = [_bad_record_row(path, r) for r in block.bad]
    if not len(block.lines):
        empty = pa.RecordBatch.from_arrays([pa.array([], pa.binary())] * len(columns), names=columns)
        return Chunk(empty, np.zeros(0, np.int64), bad)
    invalid = []

    def on_invalid(row):
        invalid.append((row.number, row.expected_columns, row.actual_columns, row.text))
        return "skip"

    try:
        table = pacsv.read_csv(
            pa.py_buffer(block.data),
            read_options=pacsv.ReadOptions(use_threads=False, block_size=len(block.data) + 1, column_names=header),
            parse_options=pacsv.ParseOptions(
                delimiter=fmt.delimiter, newlines_in_values=True, invalid_row_handler=on_invalid
            ),
            convert_options=pacsv.ConvertOptions(
                column_types={c: pa.binary() for c in header},
                null_values=list(fmt.null_values),
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as e:
        raise ValueError(f"cannot parse CSV file {path} at lines {block.lines[0]}-{block.lines[-1]}: {e}") from e
    numbers = [number for number, *_ in invalid]
    if None in numbers or table.num_rows + len(invalid) != len(block.lines):
        raise ValueError(
            f"cannot number the rows of CSV file {path} at lines {block.lines[0]}-{block.lines[-1]}: "
            f"pyarrow read {table.num_rows + len(invalid)} records where {len(block.lines)} were found"
        )
    keep = np.ones(len(block.lines), bool)
    for number, expected, actual, text in invalid:
        keep[number - 1] = False
        bad.append(
            BadRow(
                path, int(block.lines[number - 1]), f"expected {expected} fields, found {actual}", text, "field_count"
            )
        )
    rows = block.lines[keep]
    batch = pa.RecordBatch.from_arrays([table.column(c).combine_chunks() for c in columns], names=columns)
    undecodable = np.zeros(len(rows), bool)
    # One check of the block's bytes clears every cell at once (21 per-column checks
    # cost 3x); only a block with a bad byte is searched column by column.
    for name, col in zip(columns, [] if _valid_utf8(pa.array([block.data], pa.binary())) else batch.columns):
        m = _utf8_bad_rows(col)
        if m.any():
            for i in np.flatnonzero(m & ~undecodable):
                bad.append(
                    BadRow(
                        path, int(rows[i]), f"column {name!r}: text is not valid UTF-8", row_text(batch, i, fmt), "utf8"
                    )
                )
            undecodable |= m
    if undecodable.any():
        batch = batch.filter(pa.array(~undecodable))
        rows = rows[~undecodable]
    return Chunk(batch, rows, bad)


def row_text(batch: pa.RecordBatch, i: int, fmt: CsvFormat) -> str:
    """The row as delimiter-joined cells (as parsed: quoting is not reproduced)."""
    cells = []
    for col in batch.columns:
        v = col[i].as_py()
        cells.append("" if v is None else v.decode("utf-8", "backslashreplace"))
    return fmt.delimiter.join(cells)


# pyarrow raises ArrowInvalid for bad metadata but a plain OSError for, e.g., a corrupt
# Snappy or gzip page.
_PARQUET_ERRORS = (pa.ArrowException, OSError)


def read_parquet_schema(path: str) -> pa.Schema:
    with open_parquet(path) as f:
        try:
            return pq.ParquetFile(f).schema_arrow
        except _PARQUET_ERRORS as e:
            raise ValueError(
                f"cannot read Parquet file {path}: {e}. Is it a whole Parquet file? Re-create or "
                "re-download it, or leave it out of --input"
            ) from e


def open_parquet(path: str):
    return open_named("--input", path)  # Parquet needs random access: no decompression wrapper


def iter_parquet_chunks(path: str, columns: list, batch_rows: int = 32768) -> Iterator[Chunk]:
    with open_parquet(path) as f:
        try:
            pf = pq.ParquetFile(f)
        except _PARQUET_ERRORS as e:
            raise ValueError(
                f"cannot read Parquet file {path}: {e}; re-create or re-download it, or leave it out of --input"
            ) from e
        missing = [c for c in columns if c not in pf.schema_arrow.names]
        if missing:
            raise ValueError(f"input file {path} lacks column(s) {missing}; it has {pf.schema_arrow.names}")
        next_row = 1
        batches = pf.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except _PARQUET_ERRORS as e:
                raise ValueError(_parquet_damage(pf, path, columns, next_row, batch_rows, e)) from e
            n = batch.num_rows
            yield Chunk(batch.select(columns), np.arange(next_row, next_row + n, dtype=np.int64), [])
            next_row += n


def _parquet_damage(pf, path: str, columns: list, next_row: int, batch_rows: int, error: Exception) -> str:
    """Says where a Parquet file failed to decode: the row group and column, found by
    rereading, column by column, the row groups of the batch that failed."""
    first = 1
    for group in range(pf.metadata.num_row_groups):
        rows = pf.metadata.row_group(group).num_rows
        if first + rows > next_row and first < next_row + batch_rows:
            for column in columns:
                try:
                    pf.read_row_group(group, columns=[column], use_threads=False)
                except _PARQUET_ERRORS as e:
                    return (
                        f"cannot read Parquet file {path}: row group {group} (rows {first}-{first + rows - 1}), "
                        f"column {column!r}: {str(e).rstrip('.')}. The file is damaged: re-create or re-download it, "
                        "leave it out of --input, or leave the column out with --columns"
                    )
        first += rows
    return (
        f"cannot read Parquet file {path} after row {next_row - 1}: {str(error).rstrip('.')}. If the file is "
        "damaged, re-create or re-download it, or leave it out of --input"
    )
