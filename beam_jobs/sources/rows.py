"""Rows from a PCollection: dicts (as ReadFromBigQuery yields them) or pyarrow RecordBatches.

Nothing is known before the data is seen, so types come from a first pass, as for CSV:
each column's values are counted by kind, and the decision keeps every value whole:

- one kind: that type (bool and int: int64, a bool as 0 or 1; float: float32, or float64
  when float32 would change some value, `column_types.float32_changes`; str and bytes:
  bytes; lists of one kind: variable-length lists of it);
- ints and floats, as values or within lists: float32 (float64) if float32 holds every
  int exactly (an int it does not hold quarantines its row);
- otherwise the most common kind, when the others are at most `max_bad_fraction` of the
  column's values (their rows are quarantined, `type`); else the job fails naming the
  column and its kinds.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Iterator

import numpy as np
import pyarrow as pa

from beam_jobs._errors import ConversionError
from beam_jobs.sources import carried_schema, column_types, readers
from beam_jobs.sources.base import Source, WorkItem, json_row

__all__ = ["RowsSource", "RowsChunk", "UnencodableText", "carried"]

_INT64 = (-(2**63), 2**63 - 1)
_FLOAT32_EXACT = 2**24  # every int of at most this magnitude is exact in float32
_DTYPE = {"int64": "int64", "float32": "float32", "text": "bytes", "binary": "bytes"}
_ARROW = {"int64": pa.int64(), "float32": pa.float64(), "float64": pa.float64(), "bytes": pa.large_binary()}
_BYTES_PER_VALUE = 12  # a tf.Example feature around a small value, for planning shard counts


@dataclasses.dataclass(frozen=True, repr=False)
class UnencodableText:
    """A str that UTF-8 cannot hold (it has a lone surrogate, as `errors="surrogateescape"`
    makes of each byte it cannot decode), as WriteDataset carries it to the quarantine:
    Beam's coders cannot encode the str itself (they fail the pipeline), pickle can."""

    text: str

    def __str__(self) -> str:
        return self.text.encode("utf-8", "backslashreplace").decode("utf-8")

    def __repr__(self) -> str:
        return repr(self.text)

    def reason(self) -> str:
        try:
            self.text.encode("utf-8")
        except UnicodeEncodeError as e:
            return (
                f"{self.text!r:.80} holds the lone surrogate U+{ord(self.text[e.start]):04X} at position {e.start}, "
                "which UTF-8 cannot store (errors='surrogateescape' makes one of each byte it cannot decode): "
                "decode the text with its real encoding, or pass the value as bytes, in a Map before WriteDataset"
            )
        return "its text is not valid UTF-8"


def carried(rows: list) -> list:
    """Dict rows as WriteDataset passes them between its steps: each str that UTF-8 cannot
    hold (alone or in a list) wrapped in an `UnencodableText`, to be quarantined. One
    encode of all the rows' text finds that there is none, without Python per value but
    the gathering."""
    try:
        "".join(
            x for row in rows for v in row.values() for x in (v if isinstance(v, list) else (v,)) if isinstance(x, str)
        ).encode("utf-8")
        return rows
    except UnicodeEncodeError:
        return [{k: _wrapped(v) for k, v in row.items()} for row in rows]


def _wrapped(v):
    if isinstance(v, list):
        return [_wrapped(x) for x in v]
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return UnencodableText(v)
    return v


def _scalar_kind(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, UnencodableText):
        return "text"
    if isinstance(v, (bool, np.bool_, int, np.integer)):
        return "int64"
    if isinstance(v, (float, np.floating)):
        return "float32"
    if isinstance(v, str):
        return "text"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "binary"
    return f"unsupported {type(v).__name__}"


def value_kind(v) -> str | None:
    """'int64', 'float32', 'text', 'binary', 'list of <kind>', 'list' (empty), or 'unsupported ...'."""
    if isinstance(v, (list, tuple, np.ndarray)):
        kinds = {_scalar_kind(x) for x in v} - {None}  # a None element quarantines its row (`_unfit`)
        if not kinds:
            return "list"
        if len(kinds) == 1 and None not in kinds and not next(iter(kinds)).startswith("unsupported"):
            return f"list of {next(iter(kinds))}"
        if kinds <= {"int64", "float32"}:
            return "list of float32"
        if kinds <= {"text", "binary"}:
            return "list of binary"  # both are bytes: str as UTF-8, the bytes as they are
        return "unsupported list of " + "/".join(sorted(str(k) for k in kinds))
    return _scalar_kind(v)


def _arrow_kind(t: pa.DataType, name: str) -> str:
    dtype, shape = column_types.arrow_dtype(name, t)
    kind = ("binary" if column_types.holds_binary(t) else "text") if dtype == "bytes" else dtype
    return kind if shape == () else f"list of {kind}"


def _family(kind: str) -> str:
    """Kinds stored alike: text and binary are both bytes."""
    return kind.replace("text", "bytes").replace("binary", "bytes")


@dataclasses.dataclass
class RowsChunk(readers.Chunk):
    records: list = dataclasses.field(default_factory=list)  # the dict rows, when the input gave dicts


@dataclasses.dataclass(frozen=True)
class RowsSource(Source):
    name: str = "WriteDataset"  # how bad rows name their source

    format: ClassVar[str] = "rows"

    def expansion(self) -> float:
        return 1.0

    def planned_bytes(self, type_counts) -> int:
        return int(type_counts["bytes"])

    @property
    def infer(self) -> bool:
        return True

    def count_types(self, item: WorkItem, *, keep=None) -> Iterator[dict]:
        payload = item[1]
        kinds: dict = {}
        inexact: dict = {}
        where: dict = {}  # column -> its earliest place in a row: columns keep the input's order
        changed: dict = {}  # column -> its floats that float32 would change
        size = 0
        if isinstance(payload, pa.RecordBatch):
            for i, (name, col) in enumerate(zip(payload.schema.names, payload.columns)):
                kinds[name] = {_arrow_kind(col.type, name): len(col) - col.null_count}
                where[name] = i
                if column_types.holds_float64(col.type):
                    changed[name] = column_types.float32_changed(col)
            size = payload.nbytes + _BYTES_PER_VALUE * payload.num_rows * payload.num_columns
        else:
            floats: dict = {}  # column -> its float values, checked at once
            for row in payload:
                for i, (name, v) in enumerate(row.items()):
                    where[name] = min(i, where.get(name, i))
                    kind = value_kind(v)
                    counts = kinds.setdefault(name, {})
                    if kind is not None:
                        counts[kind] = counts.get(kind, 0) + 1
                    if kind in _HOLDS_INTS and any(map(_inexact_int, v if kind.startswith("list") else [v])):
                        inexact[name] = inexact.get(name, 0) + 1
                    if kind == "float32":
                        floats.setdefault(name, []).append(v)
                    elif kind == "list of float32":
                        floats.setdefault(name, []).extend(x for x in v if isinstance(x, (float, np.floating)))
                    size += _BYTES_PER_VALUE + (len(v) if isinstance(v, (str, bytes)) else 8)
            for name, values in floats.items():
                changed[name] = column_types.float32_changed_values(np.array(values, np.float64))
        yield {"kinds": kinds, "inexact": inexact, "where": where, "bytes": size, "changed": changed}

    def merge_type_counts(self, many) -> dict:
        out = {"kinds": {}, "inexact": {}, "where": {}, "bytes": 0, "changed": {}}
        for c in many:
            out["bytes"] += c["bytes"]
            for name, n in c["changed"].items():
                out["changed"][name] = out["changed"].get(name, 0) + n
            for name, i in c["where"].items():
                out["where"][name] = min(i, out["where"].get(name, i))
            for name, n in c["inexact"].items():
                out["inexact"][name] = out["inexact"].get(name, 0) + n
            for name, kinds in c["kinds"].items():
                mine = out["kinds"].setdefault(name, {})
                for kind, n in kinds.items():
                    mine[kind] = mine.get(kind, 0) + n
        return out

    def decided_types(self, type_counts, *, tolerance: float) -> dict:
        counts = (type_counts or {}).get("kinds", {})
        rest = sorted((c for c in counts if c not in self.columns), key=lambda c: (type_counts["where"][c], c))
        order = [c for c in self.columns if c in counts] + rest
        if not order:
            raise ConversionError(f"{self.name}: the input PCollection holds no rows with columns")
        decided = {
            name: self._decide(name, counts[name], type_counts["inexact"].get(name, 0), tolerance) for name in order
        }
        # float32 where it keeps every value, else float64 (the rule of column_types.decide_types).
        return {
            name: ("float64", shape) if dtype == "float32" and type_counts["changed"].get(name) else (dtype, shape)
            for name, (dtype, shape) in decided.items()
        }

    def _decide(self, name: str, kinds: dict, inexact: int, tolerance: float) -> tuple:
        families: dict = {}
        for kind, n in kinds.items():
            if kind != "list":  # an empty list fits any list kind
                families[_family(kind)] = families.get(_family(kind), 0) + n
        if not families:
            families = {"list of int64" if "list" in kinds else "bytes": 0}
        lists = any(k.startswith("list") for k in families)
        numbers = {"list of int64", "list of float32"} if lists else {"int64", "float32"}
        if len(families) == 2 and set(families) == numbers and not inexact:
            families = {next(k for k in numbers if k.endswith("float32")): sum(families.values())}
        best = max(families, key=lambda k: (families[k], k))
        total = sum(families.values())
        if best.startswith("unsupported") or total - families[best] > tolerance * total:
            seen = ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items()))
            raise ConversionError(
                f"{self.name}: column {name!r} holds values of several kinds ({seen}), more mixed than "
                f"max_bad_fraction={tolerance} allows: give the column one type (convert its values in a Map "
                "before WriteDataset), or raise max_bad_fraction to quarantine the fewer"
                if not best.startswith("unsupported")
                else f"{self.name}: column {name!r} holds values no tf.train.Example feature can store ({best}); "
                "convert them (e.g. to str or int) in a Map before WriteDataset"
            )
        if best.startswith("list of "):
            return _DTYPE.get(best[len("list of ") :], "bytes"), (None,)
        return _DTYPE.get(best, "bytes"), ()

    def check_carried_columns(self, type_counts) -> None:
        where = (type_counts or {}).get("where", {})
        self.schema.check_columns(
            sorted(where, key=lambda c: (where[c], c)),
            of=f"the input of {self.name}",
            selected=False,
            drop_hint=f"drop them before {self.name}, e.g. beam.Map(lambda row: {{k: row[k] for k in "
            f"{list(self.schema.names)}}})",
        )

    def binary_of(self, type_counts) -> tuple:
        counts = (type_counts or {}).get("kinds", {})
        return tuple(name for name, kinds in counts.items() if any(k.endswith("binary") for k in kinds))

    def read(self, item: WorkItem) -> tuple:
        index, payload, _ = item
        where = f"{self.name} input batch {index}"
        if isinstance(payload, pa.RecordBatch):
            return where, iter([RowsChunk(payload, np.arange(payload.num_rows), [])])
        return where, iter([RowsChunk(None, np.arange(len(payload)), [], records=list(payload))])

    def row_text(self, chunk, i: int) -> str:
        return json_row(chunk.records[i]) if chunk.batch is None else super().row_text(chunk, i)

    def type_chunk(self, path: str, chunk, types: dict) -> tuple:
        bent = chunk.bent  # the caller's chunk's, whichever chunk is typed below
        if chunk.batch is not None:
            fits = all(
                name not in chunk.batch.schema.names
                or column_types.arrow_dtype(
                    name, chunk.batch.schema.field(name).type, float64=types[name][0] == "float64"
                )
                == types[name]
                for name in types
            )
            if not fits:  # some column of this batch has another type: value by value
                chunk = RowsChunk(None, chunk.rows, chunk.bad, records=chunk.batch.to_pylist())
        n = len(chunk.rows)
        bad, bad_mask, cols = list(chunk.bad), np.zeros(n, bool), []
        whose = "" if self.schema is None else f", its type in --schema_from {self.schema.dataset}"
        for name, (dtype, shape) in types.items():
            if chunk.batch is not None:
                arr = chunk.batch.column(name) if name in chunk.batch.schema.names else None
            else:
                values = [row.get(name) for row in chunk.records]
                for i, v in enumerate(values):
                    reason = None if v is None else _unfit(v, dtype, shape)
                    kind = "type"
                    if reason is None and dtype == "bytes" and isinstance(v, (UnencodableText, list)):
                        reason, kind = _unencodable(v), "utf8"
                    if reason is not None:
                        values[i] = None
                        if not bad_mask[i]:
                            bad.append(
                                readers.BadRow(
                                    path,
                                    int(chunk.rows[i]),
                                    f"column {name!r}: {reason}{whose if kind == 'type' else ''}",
                                    self.row_text(chunk, i),
                                    kind,
                                )
                            )
                        bad_mask[i] = True
                stored = [_stored(v, dtype) for v in values]
                arr = pa.array(stored, _arrow_type(dtype, shape))
            if arr is None:
                arr = pa.nulls(n, _arrow_type(dtype, shape))
            else:
                for i, reason in column_types.invalid_utf8(arr, name):  # a RecordBatch's string column
                    if not bad_mask[i]:
                        bad.append(readers.BadRow(path, int(chunk.rows[i]), reason, self.row_text(chunk, i), "utf8"))
                    bad_mask[i] = True
            unfit: list = []
            if dtype == "float32" and self.schema is not None and column_types.holds_float64(arr.type):
                bend = column_types.float32_bend(arr)  # a carried float32 may change values
                if bend[0]:
                    bent[name] = bend
            _, _, arr = column_types.canonical_arrow_column(arr, name, unfit=unfit, float64=dtype == "float64")
            for i, reason in unfit:
                if not bad_mask[i]:
                    bad.append(readers.BadRow(path, int(chunk.rows[i]), reason, self.row_text(chunk, i), "type"))
                bad_mask[i] = True
            cols.append((name, dtype, arr))
        return cols, bad, bad_mask


# Kinds whose values may hold Python ints (a list mixing ints and floats is 'list of float32').
_HOLDS_INTS = ("int64", "list of int64", "list of float32")


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _inexact_int(x) -> bool:
    return _is_int(x) and _not_exact_in_float32(x)


def _not_exact_in_float32(v) -> bool:
    v = int(v)
    if abs(v) <= _FLOAT32_EXACT:
        return False
    return not _INT64[0] <= v <= _INT64[1] or int(np.float32(v)) != v


def _arrow_type(dtype: str, shape: tuple) -> pa.DataType:
    if shape == ():
        return _ARROW[dtype]
    # Lists of k (a carried schema's) as Arrow's fixed-size lists, as Parquet's come.
    return pa.large_list(_ARROW[dtype]) if shape[0] is None else pa.list_(_ARROW[dtype], shape[0])


def _stored(v, dtype: str):
    """`v` as Arrow takes it for the column's type (`_unfit` has checked it fits exactly):
    bools as 0/1, ints of a float column as floats, text as UTF-8."""
    if v is None:
        return None
    as_type = _as_bytes if dtype == "bytes" else int if dtype == "int64" else float
    return [as_type(x) for x in v] if isinstance(v, (list, tuple, np.ndarray)) else as_type(v)


def _unencodable(v) -> str | None:
    """Why a value (or a list's) cannot be stored as UTF-8 text (`UnencodableText`), or None."""
    for x in v if isinstance(v, list) else [v]:
        if isinstance(x, UnencodableText):
            return x.reason()
    return None


def _as_bytes(x):
    return x.encode("utf-8") if isinstance(x, str) else bytes(x)


def _unfit(v, dtype: str, shape: tuple) -> str | None:
    """Why a value cannot be stored in the column's type, or None if it can, exactly."""
    kind = value_kind(v)
    is_list = kind.startswith("list")
    holds = carried_schema.describe(dtype, shape)
    if is_list != (shape != ()):
        return f"{v!r} is {'a list' if is_list else 'not a list'}, but the column holds {holds}"
    element = kind[len("list of ") :] if kind.startswith("list of ") else kind
    if is_list and any(x is None for x in v):
        where = next(i for i, x in enumerate(v) if x is None) + 1
        return (
            f"element {where} of its list is None, and lists must not contain null elements (a tf.train.Example "
            "list has no null): drop or replace it in a Map before WriteDataset"
        )
    if is_list and shape[0] is not None and len(v) != shape[0]:
        return f"{v!r:.80} holds {len(v)} value{'s' * (len(v) != 1)}, but the column holds {holds}"
    if kind == "list":
        return None
    floats = ("float32", "float64")
    if _family(element) != dtype and not (dtype in floats and element in ("int64", "float32")):
        return f"{v!r} is {element}, but the column holds {holds}"
    # Each int on its own: a list mixing ints and floats is 'list of float32' as a whole.
    for x in filter(_is_int, v if shape != () else [v]):
        if not _INT64[0] <= int(x) <= _INT64[1]:
            return f"{x} is beyond int64's range"
        if dtype == "float32" and _not_exact_in_float32(x):
            return f"{x} is not exact in float32, the column holds {holds}"
        if dtype == "float64" and int(float(x)) != int(x):
            return f"{x} is not exact in float64, the column holds {holds}"
    return None
