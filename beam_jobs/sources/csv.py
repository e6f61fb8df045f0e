"""CSV: headers checked at launch, large files read as byte ranges, types inferred in a first pass."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beam_jobs._background import prefetched
from beam_jobs._errors import ConversionError, open_named
from beam_jobs.sources import carried_schema, column_types, csv_ranges, readers
from beam_jobs.sources.base import Source, WorkItem, first_mismatch, flag, match_files, select_columns

__all__ = ["CsvSource"]

# tf.Example spends bytes on feature keys and framing: a 21-column CSV row of ~120 bytes
# becomes ~330 bytes (measured on the benchmark corpus). Gzip input expands ~4x more.
_EXPANSION, _GZIP_EXPANSION = 2.8, 11.0


@dataclasses.dataclass(frozen=True)
class CsvSource(Source):
    files: tuple = ()
    file_sizes: tuple = ()  # bytes of each of `files`
    header: tuple = ()
    csv: readers.CsvFormat = readers.CsvFormat()
    given_types: tuple = ()  # ((name, dtype), ...) from --column and --schema
    split_bytes: int = 0  # read files larger than this as byte ranges (0: whole files)

    format: ClassVar[str] = "csv"
    statistics_while_reading: ClassVar[bool] = True  # the reader thread parses text: the DoFn's waits

    @classmethod
    def add_flags(cls, group) -> None:
        flag(
            group,
            "column",
            action="append",
            default=[],
            metavar="NAME:TYPE",
            help="column type: int64, float32, float64 (or double) or string (repeatable)",
        )
        flag(group, "schema", help="JSON file mapping column names to types")
        flag(
            group,
            "delimiter",
            default=None,  # ',' unless given: a header that reads as one column then names the one it holds
            help="CSV field delimiter: one character, or tab (also written \\t); default ','",
        )
        flag(
            group,
            "csv_split_mb",
            type=float,
            default=csv_ranges.DEFAULT_SPLIT_MB,
            help="read CSV files larger than this as byte ranges in parallel (0: always whole); with "
            "--allow_quoted_newlines, files with newlines inside quoted fields are detected and read whole",
        )
        group.add_argument(
            "--allow_quoted_newlines",
            "--allow-quoted-newlines",
            dest="allow_quoted_newlines",
            action="store_true",
            help="let quoted CSV fields span lines (default: a line whose quote does not close on it "
            "is quarantined as unterminated_quote, and the next line is read as a row)",
        )
        markers = ",".join(v for v in readers.DEFAULT_NULL_VALUES if v)
        flag(
            group,
            "null_values",
            default=markers,
            help=f"comma-separated unquoted cell values read as missing values (default: {markers}); given, "
            "they replace the default; '' for none, so that NA and null are text. Empty cells are always "
            'missing, quoted ones ("NA") never',
        )

    @classmethod
    def check_flags(cls, args) -> None:
        if args.schema_from is not None and (args.column or args.schema):
            given = "--column" if args.column else "--schema"
            raise ConversionError(
                f"{given} gives column types, and --schema_from {args.schema_from} gives every column's type: "
                f"use one of them (drop {given} to type the columns as the schema does)"
            )
        if args.csv_split_mb < 0:
            raise ConversionError(f"--csv_split_mb must be 0 (never split) or positive, got {args.csv_split_mb}")
        cls._format(args)

    @staticmethod
    def _format(args) -> readers.CsvFormat:
        nulls = tuple(dict.fromkeys([""] + [v for v in args.null_values.split(",")]))
        try:
            return readers.CsvFormat(
                delimiter=readers.delimiter_of(args.delimiter),
                null_values=nulls,
                allow_quoted_newlines=args.allow_quoted_newlines,
            )
        except ValueError as e:
            raise ConversionError(str(e)) from e

    @classmethod
    def open(cls, args) -> "CsvSource":
        files = match_files(args.input)
        paths = [p for p, _ in files]
        given: dict = {}
        if args.schema:
            with open_named("--schema", args.schema) as f:
                given.update(column_types.load_schema_file(f.read().decode("utf-8"), path=args.schema))
        given.update(column_types.parse_column_flags(args.column))
        csv = cls._format(args)
        names = first_mismatch(paths, lambda p: readers.read_csv_header(p, csv), "header")
        if args.delimiter is None:
            readers.refuse_other_delimiter(names, path=paths[0])
        unknown = [c for c in given if c not in names]
        if unknown:
            raise ConversionError(f"--column/--schema name {unknown}, which the input lacks; its columns: {names}")
        columns = select_columns(names, args)
        return cls(
            input_pattern=args.input,
            columns=tuple(columns),
            input_bytes=sum(s for _, s in files),
            input_count=len(paths),
            schema_origin="given" if all(c in given for c in columns) else ("mixed" if given else "inferred"),
            files=tuple(paths),
            file_sizes=tuple(s for _, s in files),
            header=tuple(names),
            csv=csv,
            given_types=tuple(sorted(given.items())),
            split_bytes=int(args.csv_split_mb * 2**20),
        )

    def carrying(self, schema, *, selected: bool) -> "CsvSource":
        lists = {f.name: carried_schema.describe(f.dtype, f.shape) for f in schema.features if f.shape != ()}
        if lists:
            raise ConversionError(
                f"--schema_from {schema.dataset} has list features {lists}, but a CSV cell holds one value: "
                "convert this input from Parquet or with WriteDataset, or without --schema_from"
            )
        return super().carrying(schema, selected=selected)

    def expansion(self) -> float:
        return _GZIP_EXPANSION if all(p.endswith(".gz") for p in self.files) else _EXPANSION

    def work_items(self) -> list:
        return [(i, path, None) for i, path in enumerate(self.files)]

    def expand_items(self, items: beam.PCollection) -> beam.PCollection:
        if self.split_bytes and any(size > self.split_bytes for size in self.file_sizes):
            return items | "SplitCsv" >> csv_ranges.SplitCsvFiles(
                self.file_sizes, self.split_bytes, self.csv.allow_quoted_newlines
            )
        return items

    @property
    def infer(self) -> bool:
        return self.schema is None and any(c not in dict(self.given_types) for c in self.columns)

    def _chunks(self, item: WorkItem) -> Iterator:
        _, path, byte_range = item
        return readers.iter_csv_chunks(path, list(self.header), self.csv, list(self.columns), byte_range)

    def count_types(self, item: WorkItem, *, keep=None) -> Iterator[dict]:
        for chunk in prefetched(self._chunks(item)):
            counts = column_types.count_types(chunk.batch, casts=chunk.casts if keep is not None else None)
            if keep is not None:
                keep(chunk)
            yield {k: dataclasses.asdict(v) for k, v in counts.items()}

    def merge_type_counts(self, many) -> dict:
        total = column_types.merge_counts({k: column_types.TypeCounts(**v) for k, v in c.items()} for c in many)
        return {k: dataclasses.asdict(v) for k, v in total.items()}

    def decided_types(self, type_counts, *, tolerance: float) -> dict:
        counts = {k: column_types.TypeCounts(**v) for k, v in (type_counts or {}).items()}
        types = column_types.decide_types(counts, self.columns, tolerance=tolerance, given=dict(self.given_types))
        return {name: (types[name], ()) for name in self.columns}

    def read(self, item: WorkItem, *, kept: list | None = None) -> tuple:
        return item[1], iter(kept) if kept is not None else self._chunks(item)

    def type_chunk(self, path: str, chunk, types: dict) -> tuple:
        batch, rows = chunk.batch, chunk.rows
        bad, bad_mask, cols = list(chunk.bad), np.zeros(batch.num_rows, bool), []
        whose = "" if self.schema is None else f", its type in --schema_from {self.schema.dataset}"
        for name in self.columns:
            dtype, _ = types[name]
            raw = batch.column(name)
            arr, bad_cells = column_types.convert_text_column(
                raw, dtype, exact_integers=self.schema is not None, casts=chunk.casts.get(name)
            )
            for i in np.flatnonzero(bad_cells & ~bad_mask):
                value = raw[i].as_py().decode("utf-8", "backslashreplace")
                bad.append(
                    readers.BadRow(
                        path,
                        int(rows[i]),
                        f"column {name!r}: {column_types.bad_cell_reason(value, dtype)}{whose}",
                        self.row_text(chunk, i),
                        "type",
                    )
                )
            bad_mask |= bad_cells
            if dtype == "float32" and (self.schema is not None or name in dict(self.given_types)):
                # A float32 the user chose (or carried) may change values: measured for the warning.
                exact, _ = column_types.convert_text_column(raw, "float64")
                bend = column_types.float32_bend(exact.filter(pa.array(~bad_cells)))
                if bend[0]:
                    chunk.bent[name] = bend
            cols.append((name, dtype, arr))
        return cols, bad, bad_mask

    def row_text(self, chunk, i: int) -> str:
        return readers.row_text(chunk.batch, i, self.csv)

    def recorded(self) -> dict:
        return {
            "delimiter": self.csv.delimiter,
            "null_values": list(self.csv.null_values),
            "allow_quoted_newlines": self.csv.allow_quoted_newlines,
            "given_types": dict(self.given_types),
        }

    def quality_hint(self) -> str:
        return "give column types with --column NAME:TYPE, "
