"""Parquet: every file's schema checked at launch, Arrow types mapped without loss.

A double column is stored as float32 when float32 keeps each of its values
(`column_types.float32_changes`), else as float64: the values decide, so a job with
double columns reads them (only them) in a first pass, as CSV's inference does.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Iterator

import numpy as np

from beam_jobs.sources import carried_schema, column_types, readers
from beam_jobs.sources.base import Source, WorkItem, first_mismatch, match_files, select_columns

__all__ = ["ParquetSource", "type_arrow_chunk"]

_EXPANSION = 3.0  # TFRecord bytes per Parquet byte


@dataclasses.dataclass(frozen=True)
class ParquetSource(Source):
    files: tuple = ()
    arrow_types: tuple = ()  # ((name, dtype, shape), ...)
    doubles: tuple = ()  # the columns some file holds as doubles: float32 or float64, by their values

    format: ClassVar[str] = "parquet"

    @classmethod
    def open(cls, args) -> "ParquetSource":
        files = match_files(args.input)
        paths = [p for p, _ in files]
        columns = select_columns(list(readers.read_parquet_schema(paths[0]).names), args)
        # Every file's whole schema is checked: without --columns, a column that only some
        # files have would otherwise be left out of the records without a word.
        stored = {}  # path -> its columns' types
        first = first_mismatch(
            paths,
            lambda p: stored.setdefault(p, _column_types(p, columns)),
            "columns",
            lambda first, value, first_path: _schema_difference(
                first, value, first_path, columns, every=not args.columns
            ),
        )
        return cls(
            input_pattern=args.input,
            columns=tuple(columns),
            input_bytes=sum(s for _, s in files),
            input_count=len(paths),
            schema_origin="parquet",
            # Bytes are text only if no file holds them as binary.
            binary_columns=tuple(c for c in columns if any(s[c][2] for s in stored.values())),
            files=tuple(paths),
            arrow_types=tuple((c, *first[c][:2]) for c in columns),
            doubles=tuple(c for c in columns if any(s[c][3] for s in stored.values())),
        )

    def expansion(self) -> float:
        return _EXPANSION

    def work_items(self) -> list:
        return [(i, path, None) for i, path in enumerate(self.files)]

    @property
    def infer(self) -> bool:
        return self.schema is None and bool(self.doubles)

    def count_types(self, item: WorkItem, *, keep=None) -> Iterator[dict]:
        # Nothing is kept for the conversion pass: it reads the other columns anyway.
        for chunk in readers.iter_parquet_chunks(item[1], list(self.doubles)):
            yield {name: column_types.float32_changed(chunk.batch.column(name)) for name in self.doubles}

    def merge_type_counts(self, many) -> dict:
        total: dict = {}
        for counts in many:
            for name, n in counts.items():
                total[name] = total.get(name, 0) + n
        return total

    def decided_types(self, type_counts, *, tolerance: float) -> dict:
        wide = {name for name, n in (type_counts or {}).items() if n}
        return {name: ("float64" if name in wide else dtype, tuple(shape)) for name, dtype, shape in self.arrow_types}

    def read(self, item: WorkItem) -> tuple:
        return item[1], readers.iter_parquet_chunks(item[1], list(self.columns))

    def type_chunk(self, path: str, chunk, types: dict) -> tuple:
        return type_arrow_chunk(self, path, chunk, types)


def type_arrow_chunk(source: Source, path: str, chunk, types: dict) -> tuple:
    """Types a chunk of Arrow columns: each keeps its values exactly, or its row is quarantined."""
    batch, rows = chunk.batch, chunk.rows
    bad, bad_mask, cols = list(chunk.bad), np.zeros(batch.num_rows, bool), []
    for name in source.columns:
        dtype, shape = types[name]
        raw = batch.column(name)
        for i, reason in column_types.invalid_utf8(raw, name):
            if not bad_mask[i]:
                bad.append(readers.BadRow(path, int(rows[i]), reason, source.row_text(chunk, i), "utf8"))
            bad_mask[i] = True  # its row is set aside with its bytes: never a text value of a vocabulary
        unfit = []  # (row in chunk, reason): values the stored type cannot hold
        if dtype == "float32" and not source.infer and column_types.holds_float64(raw.type):
            # A float32 not decided from these doubles (carried, an image manifest's) may change them.
            bend = column_types.float32_bend(raw)
            if bend[0]:
                chunk.bent[name] = bend
        # Floats as doubles where the column is float64, or a carried schema fits them (its
        # float32 then warns of the values it changes, never quarantines them).
        float64 = dtype == "float64" or source.schema is not None
        try:
            got_dtype, got_shape, arr = column_types.canonical_arrow_column(raw, name, unfit=unfit, float64=float64)
        except column_types.UnstorableValue as e:
            row = "" if e.index is None else f", row {int(rows[e.index])}"
            raise ValueError(f"input file {path}{row}: {e}") from e
        if source.schema is not None:
            # Each file's columns are fitted to the carried schema, value by value.
            arr, misfits = carried_schema.fit_column(
                arr, name, (got_dtype, got_shape), (dtype, shape), dataset=source.schema.dataset
            )
            unfit.extend(misfits)
            got_dtype, got_shape = dtype, shape
        for i, reason in unfit:
            if not bad_mask[i]:
                bad.append(readers.BadRow(path, int(rows[i]), reason, source.row_text(chunk, i), "type"))
            bad_mask[i] = True
        if (got_dtype, got_shape) != (dtype, shape):
            raise ValueError(
                f"input file {path}: column {name!r} has type {raw.type} ({got_dtype}, shape {got_shape}), "
                f"but the first file has ({dtype}, shape {shape}); all files must share the schema"
            )
        cols.append((name, dtype, arr))
    return cols, bad, bad_mask


def _column_types(path: str, columns: list) -> dict:
    """Each column of a file -> (dtype, shape, holds binary, holds doubles) if it is in `columns`, else None."""
    schema = readers.read_parquet_schema(path)
    twice = sorted({n for n in schema.names if n in columns and schema.names.count(n) > 1})
    if twice:
        # Arrow reads neither of them by name ('Field "a" exists 2 times in schema').
        others = [c for c in columns if c not in twice]
        fix = f", or leave them out with --columns {','.join(others)}" if others else ""
        raise ValueError(
            f"input file {path} has column(s) {twice} more than once; column names must be unique: rename "
            f"them in the file{fix}"
        )
    out = {}
    for field in schema:
        if field.name not in columns:
            out[field.name] = None
            continue
        try:
            dtype, shape = column_types.arrow_dtype(field.name, field.type)
        except ValueError as e:
            raise ValueError(f"input file {path}: {e}") from e
        out[field.name] = (dtype, shape, column_types.holds_binary(field.type), column_types.holds_float64(field.type))
    return out


def _schema_difference(first: dict, value: dict, first_path: str, columns: list, *, every: bool):
    """How one file's columns differ from the first file's, and the fix; None if they agree.

    `every`: all columns must match (no --columns); else only the selected ones.
    """
    extra = [c for c in value if c not in first] if every else []
    missing = [c for c in (first if every else columns) if c not in value]
    if extra or missing:
        shared = ",".join(c for c in first if c in value)
        how = " and ".join(
            [f"has column(s) {extra} that the first file {first_path} lacks"] * bool(extra)
            + [f"lacks column(s) {missing} that the first file {first_path} has"] * bool(missing)
        )
        fix = (
            f"convert the columns they share by listing them, e.g. --columns {shared}"
            if shared
            else "they share none: convert them separately"
        )
        return f"{how}: all files of one input must have the same columns; {fix}"
    differ = [c for c in columns if value[c][:2] != first[c][:2]]
    if not differ:
        return None
    this = {c: _describe(*value[c][:2]) for c in differ}
    that = {c: _describe(*first[c][:2]) for c in differ}
    return (
        f"has column types {this}, but the first file {first_path} has {that}: all files of one input must "
        "agree; leave the column(s) out with --columns, or rewrite the files with one type per column"
    )


def _describe(dtype: str, shape: tuple) -> str:
    if shape == ():
        return dtype
    return f"list of {dtype}" if shape[0] is None else f"{dtype}[{shape[0]}]"
