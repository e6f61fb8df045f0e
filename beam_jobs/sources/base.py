"""What every source adapter provides, and the launch-time helpers they share.

A source adapter owns everything that differs between input formats: its flags, its
launch-time planning (listing, headers or schemas, byte ranges), reading one work item
into Arrow chunks plus quarantined rows, typing those chunks, and what it records in
the metadata. The adapter object is frozen at launch and shipped to workers inside the
`JobConfig`; the pipeline only ever calls the methods below.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import json
import os
import posixpath
from typing import TYPE_CHECKING, ClassVar, Iterator

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jobs._errors import ConversionError, storage_error
from beam_jobs.sources import column_types
from beam_jobs.sources.readers import Chunk
from ingest.names import did_you_mean

if TYPE_CHECKING:
    from beam_jobs.sources.carried_schema import CarriedSchema

__all__ = ["Source", "WorkItem", "flag", "match_files", "first_mismatch", "select_columns", "json_row"]

# (item index, path or image entries, CsvRange or None): one unit of work for ConvertFiles.
WorkItem = tuple


@dataclasses.dataclass(frozen=True)
class Source:
    """A source's launch-time decisions and its worker-side behaviour."""

    input_pattern: str
    columns: tuple  # the features of every record, in order
    input_bytes: int
    input_count: int  # files, or images
    schema_origin: str  # "inferred" | "given" | "mixed" | "parquet" | "images" | "carried"
    binary_columns: tuple = ()  # bytes columns holding binary data, not UTF-8 text
    schema: CarriedSchema | None = None  # the features and label of --schema_from (`carrying`)

    format: ClassVar[str]
    unit: ClassVar[str] = "file"  # what input_count counts, for messages
    fixed_label: ClassVar[str | None] = None  # the label feature, when the source names it (images)
    # Record layouts it can be written in; the first is its default. Tabular sources default
    # to blocks: ~3x the read throughput of row records in a quarter of the bytes (BENCHMARKS.md).
    layouts: ClassVar[tuple] = ("blocks", "rows")
    # Where the blocks layout gathers statistics: beside the reading (ConvertFiles) for a
    # source whose reader is slower than the typing, so that the DoFn's thread waits for
    # it (CSV's text parsing); else in the commit, which encodes on one core of two.
    # Measured on the 500k-row corpus, alternating in one process (BENCHMARKS.md).
    statistics_while_reading: ClassVar[bool] = False

    # --- launch ------------------------------------------------------------------

    @classmethod
    def add_flags(cls, parser) -> None:
        """Adds the source's own flags to the job's parser (nothing by default)."""

    @classmethod
    def check_flags(cls, args) -> None:
        """Refuses bad values of the source's flags before any file is listed."""

    @classmethod
    def open(cls, args) -> "Source":
        """Lists and inspects the input named by the flags; raises ConversionError."""
        raise NotImplementedError

    def carrying(self, schema: CarriedSchema, *, selected: bool) -> "Source":
        """This source, typed by a schema carried from another dataset (--schema_from): its
        columns must be the schema's features, and are read in the schema's order.
        `selected`: whether --columns chose the columns (for the messages)."""
        schema.check_columns(
            self.columns,
            of=f"--input {self.input_pattern}",
            selected=selected,
            drop_hint=f"leave them out with --columns {','.join(schema.names)}",
        )
        return dataclasses.replace(self, columns=schema.names, schema=schema, schema_origin="carried")

    def check_carried_columns(self, type_counts) -> None:
        """Refuses, once the data has been seen, columns that are not the carried schema's
        features (for a source whose columns are only known then; others check at launch)."""

    def expansion(self) -> float:
        """Output bytes per input byte, for planning shard counts."""
        raise NotImplementedError

    def planned_bytes(self, type_counts) -> int:
        """The output's expected size, for planning shard counts."""
        return int(self.input_bytes * self.expansion())

    def binary_of(self, type_counts) -> tuple:
        """The bytes columns that hold binary data, not text."""
        return self.binary_columns

    def for_workers(self) -> "Source":
        """The part of the source workers need (launch-only data left out)."""
        return self

    # --- pipeline ----------------------------------------------------------------

    def work_items(self) -> list:
        """The units of work, listed at launch: [(index, path or entries, None)]."""
        raise NotImplementedError

    @property
    def infer(self) -> bool:
        """Whether column types are inferred from a first pass over the data."""
        return False

    def count_types(self, item: WorkItem, *, keep=None) -> Iterator[dict]:
        """The first pass's type counts of one work item, a dict per chunk; `keep`, when
        given, is called with each Chunk parsed on the way, which `read` may be given back."""
        raise NotImplementedError

    def merge_type_counts(self, many) -> dict:
        """One total of the first pass's counts (Beam combines them globally)."""
        raise NotImplementedError

    def decided_types(self, type_counts, *, tolerance: float) -> dict:
        """{column: (dtype, shape)} for every column, given the merged type counts."""
        raise NotImplementedError

    def read(self, item: WorkItem, *, kept: list | None = None) -> tuple:
        """(name of the input for bad rows, iterator of Chunks) for one work item; `kept`:
        the Chunks `count_types` gave to `keep` for it, to use instead of reading it again."""
        raise NotImplementedError

    def type_chunk(self, path: str, chunk: Chunk, types: dict) -> tuple:
        """Types a chunk's columns: ([(name, dtype, array)], [BadRow], bad-row mask)."""
        raise NotImplementedError

    def row_text(self, chunk, i: int) -> str:
        """Row `i` of a chunk as the quarantine shows it: JSON of its values (text that is
        not UTF-8 as bytes, escaped)."""
        row = chunk.batch.slice(i, 1)
        try:
            return json_row(row.to_pylist()[0])
        except UnicodeDecodeError:
            columns = zip(row.schema.names, row.columns)
            return json_row({name: column_types.as_binary(col).to_pylist()[0] for name, col in columns})

    def expand_items(self, items: beam.PCollection) -> beam.PCollection:
        """Work items as the pipeline reads them (CSV cuts large files into byte ranges)."""
        return items

    # --- metadata ----------------------------------------------------------------

    def recorded(self) -> dict:
        """The source's options, as recorded in the metadata's `options`."""
        return {}

    def metadata(self, counters: dict) -> dict:
        """The metadata's `image` block (only images have one)."""
        return {}

    @property
    def vocabulary(self) -> tuple:
        """Label names whose position is the label index (images)."""
        return ()

    def role(self, column: str, label: str | None) -> str | None:
        return "label" if column == label else None

    def quality_hint(self) -> str:
        """What besides fixing the input and raising --max_bad_fraction may help."""
        return ""


# --- shared launch-time helpers ---------------------------------------------------------


def flag(parser, name: str, **kwargs) -> None:
    """`--name`, with the dashed spelling (`--some-flag`) as an alias, as Beam's flags have."""
    dashed = "--" + name.replace("_", "-")
    names = ["--" + name] + ([dashed] if dashed != "--" + name else [])
    parser.add_argument(*names, dest=name, **kwargs)


def match_files(pattern: str) -> list:
    """[(path, size)] of the files matching `pattern`, sorted; at least one."""
    try:
        results = FileSystems.match([pattern])
    except Exception as e:
        raise storage_error("list", "--input", pattern, e) from e
    files = sorted((m.path, m.size_in_bytes) for r in results for m in r.metadata_list)
    _refuse_unlisted(pattern, files)
    if not files:
        raise ConversionError(f"no files match --input {pattern}" + _glob_hint(pattern, "; it is a directory"))
    folders = [path for path, _ in files if os.path.isdir(path)]  # a local directory matches itself
    if folders:
        raise ConversionError(f"--input {pattern} matches {folders[0]}, a directory" + _glob_hint(folders[0]))
    return files


def _refuse_unlisted(pattern: str, files: list) -> None:
    """Refuses a local pattern that matches what Beam's listing leaves out without a word:
    dangling symlinks (their size cannot be read), directories, sockets and pipes. Each
    was most likely meant as input (a link whose target moved) or matched by a glob too wide."""
    if "://" in pattern:
        return
    # A pattern that names a directory itself has its own error (match_files).
    listed = {os.path.abspath(p) for p, _ in files} | ({os.path.abspath(pattern)} if os.path.isdir(pattern) else set())
    skipped = [
        p for p in sorted(glob.glob(pattern, recursive=True)) if os.path.abspath(p) not in listed and not _is_file(p)
    ]
    if not skipped:
        return
    first = skipped[0]
    if os.path.islink(first) and not os.path.exists(first):
        what, fix = f"a dangling symlink (to {os.readlink(first)})", "repair or remove the link"
    elif os.path.isdir(first):
        what, fix = "a directory", "remove it from the pattern's folder"
    else:
        what, fix = "not a regular file", "remove it from the pattern's folder"
    ext = posixpath.splitext(files[0][0])[1] if files else ""
    narrower = f" (e.g. --input '{FileSystems.join(os.path.dirname(pattern) or '.', '*' + ext)}')" if ext else ""
    more = f" (and {len(skipped) - 1} other path(s) that are not files)" if len(skipped) > 1 else ""
    raise ConversionError(
        f"--input {pattern} matches {first}, {what}{more}, which the job would skip: {fix}, or give a pattern "
        f"that matches files only{narrower}"
    )


def _is_file(path: str) -> bool:
    try:
        return os.path.isfile(path) and os.path.getsize(path) >= 0
    except OSError:
        return False


def _glob_hint(pattern: str, prefix: str = "") -> str:
    """For an --input that names a directory: the pattern of the files in it."""
    try:
        listed = [m.path for r in FileSystems.match([FileSystems.join(pattern, "*")]) for m in r.metadata_list]
    except Exception:  # the plain message stands
        return ""
    if not listed:
        return ""
    ext = posixpath.splitext(listed[0])[1]
    return f"{prefix}; give a pattern of the files in it, e.g. --input '{FileSystems.join(pattern, '*' + ext)}'"


def first_mismatch(paths, read, what: str, explain=None):
    """Reads `what` of every file; raises naming the first file that disagrees with the first.

    `explain(first, value, first_path)` says how a file differs and what to do, or None
    when it agrees; by default any difference is reported whole.
    """
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        values = list(pool.map(read, paths))
    for path, value in zip(paths, values):
        if explain is not None:
            how = explain(values[0], value, paths[0])
        elif value != values[0]:
            how = (
                f"has {what} {value}, but the first file {paths[0]} has {values[0]}: all files of one input must agree"
            )
        else:
            how = None
        if how:
            raise ConversionError(f"input file {path} {how}")
    return values[0]


def select_columns(names: list, args) -> list:
    """The columns to convert: --columns (default all), plus --label and --split_key."""
    if args.columns:
        selected = [c.strip() for c in args.columns.split(",") if c.strip()]
        unknown = [c for c in selected if c not in names]
        if unknown:
            hints = "".join(did_you_mean(c, names) for c in unknown[:1])
            raise ConversionError(f"--columns names {unknown}{hints}, which the input lacks; its columns: {names}")
    else:
        selected = list(names)
    # --split_key '' splits by the record content: no column.
    for name, col in (("--label", args.label), ("--split_key", args.split_key or None)):
        if col is not None and col not in names:
            raise ConversionError(
                f"{name} {col!r}{did_you_mean(col, names)} is not a column of the input; its columns: {names}"
            )
        if col is not None and col not in selected:
            selected.append(col)
    return selected


def json_row(row: dict) -> str:
    """A row's values as JSON, bytes as text (undecodable bytes escaped), the rest as str."""
    return json.dumps(
        {k: (v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v) for k, v in row.items()}, default=str
    )
