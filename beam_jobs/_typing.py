"""Column types: inference from text, explicit schemas, and text-to-typed conversion.

CSV cells arrive as bytes. Inference counts, per column, how many non-null cells look
like an int64, a (non-integer) float, or neither; `decide_types` then picks the
narrowest type that fits all but a tolerated fraction of cells (the rest are
quarantined, so one stray "n/a" does not turn a million-row int column into text).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "TypeCounts",
    "count_types",
    "merge_counts",
    "decide_types",
    "parse_column_flags",
    "load_schema_file",
    "convert_text_column",
    "canonical_arrow_column",
]

_TYPE_ALIASES = {
    "int": "int64", "int64": "int64", "integer": "int64",
    "float": "float32", "float32": "float32", "double": "float32",
    "string": "bytes", "str": "bytes", "bytes": "bytes", "text": "bytes",
}
_INT_RE = r"^\s*[+-]?\d{1,18}\s*$"
_FLOAT_RE = r"(?i)^\s*[+-]?((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|inf|infinity|nan)\s*$"


@dataclasses.dataclass
class TypeCounts:
    nonnull: int = 0
    ints: int = 0
    floats: int = 0  # numeric cells that are not int64

    def __add__(self, other: "TypeCounts") -> "TypeCounts":
        return TypeCounts(self.nonnull + other.nonnull, self.ints + other.ints, self.floats + other.floats)


def normalize_type(name: str, *, column: str) -> str:
    try:
        return _TYPE_ALIASES[name.strip().lower()]
    except KeyError:
        raise ValueError(
            f"column {column!r}: unknown type {name!r}; use one of int64, float32, string"
        ) from None


def count_types(batch: pa.RecordBatch) -> dict:
    return {name: _count(col.drop_null()) for name, col in zip(batch.schema.names, batch.columns)}


def _count(valid: pa.Array) -> TypeCounts:
    n = len(valid)
    data, offsets = _text_buffers(valid)
    widest = _widest_class(data)
    if n and widest == _INT_CHARS and _casts(valid, pa.int64()):
        return TypeCounts(n, n, 0)
    if n and widest <= _FLOAT_CHARS and _casts(valid, pa.float64()):
        # A cell that parses as a float is an integer unless it has a '.', an exponent
        # or is inf/nan, all of which contain one of '.', 'e', 'n'.
        seen = np.concatenate([[0], np.cumsum(np.take(_NOT_INT, data))])
        floats = int(np.count_nonzero(seen[offsets[1:]] > seen[offsets[:-1]]))
        return TypeCounts(n, n - floats, floats)
    # Only cells made of number characters can match: the regexes run on those alone.
    maybe = _cell_classes(data, offsets) <= _FLOAT_CHARS
    candidates = valid if maybe.all() else valid.filter(pa.array(maybe))
    if not len(candidates):
        return TypeCounts(n, 0, 0)
    ints = pc.sum(pc.match_substring_regex(candidates, _INT_RE)).as_py() or 0
    nums = pc.sum(pc.match_substring_regex(candidates, _FLOAT_RE)).as_py() or 0
    return TypeCounts(n, ints, nums - ints)


# A failed Arrow cast costs ~2 ms (its error path), 40x a successful one, so casts are
# only tried on columns whose characters allow them.
_INT_CHARS, _FLOAT_CHARS, _OTHER_CHARS = 0, 1, 2
_CHAR_CLASS = np.full(256, _OTHER_CHARS, np.int8)
_CHAR_CLASS[np.frombuffer(b"+.eE \t\r\ninfatyINFATY", np.uint8)] = _FLOAT_CHARS
_CHAR_CLASS[np.frombuffer(b"0123456789-", np.uint8)] = _INT_CHARS
_NOT_INT = np.zeros(256, np.int32)
_NOT_INT[np.frombuffer(b".eEnN", np.uint8)] = 1


def _text_buffers(col: pa.Array):
    """The bytes of a binary column's non-null cells and their offsets into them."""
    if col.null_count:
        col = col.drop_null()
    if not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        col = col.cast(pa.large_binary())
    n = len(col)
    if n == 0 or col.buffers()[2] is None:
        return np.zeros(0, np.uint8), np.zeros(n + 1, np.int64)
    width = np.int64 if pa.types.is_large_binary(col.type) else np.int32
    offsets = np.frombuffer(col.buffers()[1], width)[col.offset : col.offset + n + 1].astype(np.int64)
    return np.frombuffer(col.buffers()[2], np.uint8)[offsets[0] : offsets[-1]], offsets - offsets[0]


def _widest_class(data: np.ndarray) -> int:
    return int(np.take(_CHAR_CLASS, data).max()) if data.size else _INT_CHARS


def _cell_classes(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per cell, the widest character class it uses (empty cells: int chars)."""
    out = np.zeros(len(offsets) - 1, np.int8)
    nonempty = np.diff(offsets) > 0
    if data.size:
        out[nonempty] = np.maximum.reduceat(np.take(_CHAR_CLASS, data), offsets[:-1][nonempty])
    return out


def _casts(col: pa.Array, to: pa.DataType) -> bool:
    try:
        pc.cast(col, to)
        return True
    except pa.ArrowInvalid:
        return False


def merge_counts(many) -> dict:
    total: dict = {}
    for counts in many:
        for name, c in counts.items():
            total[name] = total.get(name, TypeCounts()) + c
    return total


def decide_types(counts: Mapping, columns, *, tolerance: float, given: Mapping) -> dict:
    """Chooses a dtype per column: given types win; else int64 < float32 < bytes."""
    types = {}
    for name in columns:
        if name in given:
            types[name] = given[name]
            continue
        c = counts.get(name, TypeCounts())
        numeric = c.ints + c.floats
        others = c.nonnull - numeric
        if numeric == 0 or others > tolerance * c.nonnull:
            types[name] = "bytes"
        elif c.floats == 0:
            types[name] = "int64"
        else:
            types[name] = "float32"
    return types


def parse_column_flags(flags) -> dict:
    """`["age:int64", "name:string"]` -> {"age": "int64", "name": "bytes"}."""
    out = {}
    for flag in flags or ():
        name, sep, typ = flag.rpartition(":")
        if not sep or not name:
            raise ValueError(f"--column expects NAME:TYPE (e.g. age:int64), got {flag!r}")
        out[name] = normalize_type(typ, column=name)
    return out


def load_schema_file(text: str, *, path: str) -> dict:
    """A schema file is JSON: {"columns": {"name": "int64", ...}} or {"name": "int64"}."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"schema file {path} is not valid JSON: {e}") from e
    cols = d.get("columns", d) if isinstance(d, dict) else None
    if not isinstance(cols, dict):
        raise ValueError(f'schema file {path} must map column names to types, e.g. {{"columns": {{"age": "int64"}}}}')
    return {name: normalize_type(str(t), column=name) for name, t in cols.items()}


def convert_text_column(col: pa.Array, dtype: str):
    """Text cells -> typed array. Returns `(array, bad_mask)`; bad cells become null."""
    if dtype == "bytes":
        return col, np.zeros(len(col), bool)
    widest = _widest_class(_text_buffers(col)[0])
    if widest <= (_INT_CHARS if dtype == "int64" else _FLOAT_CHARS):
        try:  # Arrow's strict parser takes clean columns whole, ~4x faster than the regex
            if dtype == "int64":
                return pc.cast(col, pa.int64()), np.zeros(len(col), bool)
            return pc.cast(pc.cast(col, pa.float64()), pa.float32(), safe=False), np.zeros(len(col), bool)
        except pa.ArrowInvalid:
            pass
    pattern = _INT_RE if dtype == "int64" else _FLOAT_RE
    ok = pc.fill_null(pc.match_substring_regex(col, pattern), True)
    bad = ~np.asarray(ok.to_numpy(zero_copy_only=False), bool)
    clean = pc.if_else(ok, col, pa.scalar(None, col.type))
    trimmed = pc.utf8_trim_whitespace(clean.cast(pa.string()))  # matched cells are ASCII
    if dtype == "int64":
        return pc.cast(trimmed, pa.int64()), bad
    return pc.cast(pc.cast(trimmed, pa.float64()), pa.float32(), safe=False), bad


_UNSUPPORTED_HELP = (
    "supported: integers, floats, bool, string, binary, timestamp, date, dictionary, "
    "and lists of those; select other columns with --columns"
)


def arrow_dtype(name: str, t: pa.DataType) -> tuple:
    """Maps an Arrow type to (dtype, shape) of the contract, or raises naming the column."""
    if pa.types.is_dictionary(t):
        return arrow_dtype(name, t.value_type)
    if pa.types.is_fixed_size_list(t):
        dtype, shape = arrow_dtype(name, t.value_type)
        if shape != ():
            raise ValueError(f"column {name!r} has nested list type {t}: {_UNSUPPORTED_HELP}")
        return dtype, (t.list_size,)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        dtype, shape = arrow_dtype(name, t.value_type)
        if shape != ():
            raise ValueError(f"column {name!r} has nested list type {t}: {_UNSUPPORTED_HELP}")
        return dtype, (None,)
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "int64", ()
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "float32", ()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes", ()
    if pa.types.is_null(t):
        return "bytes", ()
    raise ValueError(f"column {name!r} has unsupported type {t}: {_UNSUPPORTED_HELP}")


def _scalar_to_canonical(arr: pa.Array, dtype: str) -> pa.Array:
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_timestamp(t):
        # Timestamps become int64 microseconds since the Unix epoch (UTC).
        return pc.cast(pc.cast(arr, pa.timestamp("us", tz=t.tz)), pa.int64())
    if pa.types.is_date(t):
        # Dates become int64 days since the Unix epoch.
        return pc.cast(pc.cast(arr, pa.date32()), pa.int32()).cast(pa.int64())
    if pa.types.is_null(t):
        return pa.nulls(len(arr), pa.large_binary())
    target = {"int64": pa.int64(), "float32": pa.float32(), "bytes": pa.large_binary()}[dtype]
    return pc.cast(arr, target, safe=False)


def canonical_arrow_column(arr: pa.Array, name: str) -> tuple:
    """Arrow column -> (dtype, shape, array of int64/float32/large_binary or lists of them)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    dtype, shape = arrow_dtype(name, arr.type)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if shape == ():
        return dtype, shape, _scalar_to_canonical(arr, dtype)
    if pa.types.is_fixed_size_list(arr.type):
        values = _scalar_to_canonical(arr.flatten(), dtype)
        out = pa.FixedSizeListArray.from_arrays(values, arr.type.list_size, mask=pc.is_null(arr))
        return dtype, shape, out
    arr = arr.cast(pa.large_list(arr.type.value_type))
    if arr.offset:  # rebuilding from sliced offsets with a null mask is not supported
        arr = arr.take(pa.array(np.arange(len(arr))))
    values = _scalar_to_canonical(arr.values, dtype)
    out = pa.LargeListArray.from_arrays(arr.offsets, values, mask=pc.is_null(arr))
    return dtype, shape, out
