"""Column types: inference from text, explicit schemas, and text-to-typed conversion.

CSV cells arrive as bytes. Inference counts, per column, how many non-null cells look
like an int64, a (non-integer) float, or neither; `decide_types` then picks the
narrowest type that fits all but a tolerated fraction of cells (the rest are
quarantined, so one stray "n/a" does not turn a million-row int column into text), and
never one that would merge or bend the values the column holds (`decide_types`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "holds_binary",
    "TypeCounts",
    "count_types",
    "merge_counts",
    "decide_types",
    "parse_column_flags",
    "load_schema_file",
    "convert_text_column",
    "bad_cell_reason",
    "canonical_arrow_column",
    "invalid_utf8",
    "as_binary",
    "inexact_in_float32",
    "inexact_in_float",
    "inexact_integers",
    "float32_changes",
    "float32_changed",
    "float32_changed_values",
    "float32_bend",
    "holds_float64",
    "FLOAT_BITS",
]

_TYPE_ALIASES = {
    "int": "int64",
    "int64": "int64",
    "integer": "int64",
    "float": "float32",
    "float32": "float32",
    "float64": "float64",
    "double": "float64",
    "string": "bytes",
    "str": "bytes",
    "bytes": "bytes",
    "text": "bytes",
}
# Number syntax, matched against cells trimmed of surrounding whitespace.
_INT_RE = r"^[+-]?\d+$"
_FLOAT_RE = r"(?i)^[+-]?((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|inf|infinity|nan)$"
_INTEGRAL_RE = (
    r"^[+-]?\d+\.0*$"  # an integer with a zero fraction (123.0), as exports of int columns with gaps write them
)
_LEADING_ZERO_RE = r"^[+-]?0\d"
_NON_FINITE_RE = r"(?i)^\s*[+-]?(inf|infinity|nan)\s*$"
_INT64_LIMITS = ("9223372036854775807", "9223372036854775808")  # largest magnitudes: positive, negative
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_EXACT_BITS = 24  # float32 holds an integer exactly iff its odd part is below 2**24
FLOAT_BITS = {"float32": 24, "float64": 53}  # the significand's bits: integers exact below 2**bits
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # float32's smallest normal number
_FLOAT32_DIGITS = 6  # FLT_DIG: a decimal of up to 6 significant digits comes back from float32
_POWERS_OF_10 = np.array([float(10**i) for i in range(23)])  # exact in float64


@dataclasses.dataclass
class TypeCounts:
    """Of a column's non-null cells: how many are numbers of each kind (the rest are text)."""

    nonnull: int = 0
    ints: int = 0  # integers that int64 holds
    floats: int = 0  # other numbers that float32 holds (finite within its range, or inf/nan)
    wide: int = 0  # integers beyond int64
    zeros: int = 0  # integers written with a leading zero (ZIP codes, account numbers)
    inexact: int = 0  # integers, as 123 or 123.0, that float32 cannot hold exactly
    changed: int = 0  # of `floats`, those whose value float32 changes (`float32_changes`)
    inexact64: int = 0  # integers, as 123 or 123.0, that float64 cannot hold exactly

    def __add__(self, other: "TypeCounts") -> "TypeCounts":
        return TypeCounts(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


def normalize_type(name: str, *, column: str) -> str:
    try:
        return _TYPE_ALIASES[name.strip().lower()]
    except KeyError:
        raise ValueError(
            f"column {column!r}: unknown type {name!r}; use one of int64, float32, float64 (or double), string"
        ) from None


def count_types(batch: pa.RecordBatch, *, casts: dict | None = None) -> dict:
    """{column: TypeCounts} of a chunk of text columns. With `casts`, each column without
    missing cells that Arrow's strict parsers read whole leaves there what
    `convert_text_column` would compute from it ({column: {dtype: ...}}), for it to reuse."""
    out = {}
    for name, col in zip(batch.schema.names, batch.columns):
        kept = {} if casts is not None and not col.null_count else None
        out[name] = _count(col.drop_null(), kept)
        if kept:
            casts[name] = kept
    return out


def _count(valid: pa.Array, casts: dict | None = None) -> TypeCounts:
    n = len(valid)
    if not n:
        return TypeCounts()
    data, offsets = _text_buffers(valid)
    widest = _widest_class(data)
    if widest == _INT_CHARS:
        values = _cast_or_none(valid, pa.int64())
        if values is not None:  # the common all-integer column, without regexes
            if casts is not None:
                casts["int64"] = values  # `_convert_text_column`'s int64 fast path
            return TypeCounts(
                n,
                n,
                zeros=_leading_zeros(data, offsets),
                inexact=_inexact_in_float32(values),
                inexact64=int(np.count_nonzero(inexact_in_float(values, FLOAT_BITS["float64"]))),
            )
    # Only cells made of number characters can be numbers: all of them, if the widest is.
    candidates = valid
    if widest == _OTHER_CHARS:
        maybe = _number_like(valid, data, offsets)
        candidates = valid if maybe.all() else valid.filter(pa.array(maybe))
    if not len(candidates):
        return TypeCounts(n)
    nums = _numbers(candidates, count_changes=True)
    if casts is not None and widest <= _FLOAT_CHARS and nums.f64 is not None:
        casts["float64"] = nums.f64  # `_convert_text_column`'s float fast path
    return TypeCounts(
        n,
        int(nums.ints.sum()),
        int(nums.floats.sum()),
        int(nums.wide.sum()),
        nums.zeros,
        nums.inexact,
        nums.changed,
        nums.inexact64,
    )


@dataclasses.dataclass
class _Numbers:
    """Text cells read as numbers; masks and arrays are per cell."""

    ints: np.ndarray  # integers that int64 holds
    wide: np.ndarray  # integers beyond int64
    floats: np.ndarray  # other numbers that float32 holds
    overflow: np.ndarray  # finite numbers beyond float32's range (integers included)
    zeros: int  # integers with a leading zero
    inexact: int  # integers (123 or 123.0) that float32 cannot hold exactly
    int_values: pa.Array  # int64 of `ints`, else null
    float_values: pa.Array  # float32 of every number that float32 holds, else null
    double_values: pa.Array | None  # float64 of every number that float64 holds, else null (not when counting)
    f64: pa.Array | None = None  # every cell as float64, where Arrow's float parser read them all at once
    changed: int = 0  # of `floats`, those float32 changes (counted with `count_changes`)
    inexact64: int = 0  # integers (123 or 123.0) that float64 cannot hold exactly


def _numbers(cells: pa.Array, *, count_changes: bool = False) -> _Numbers:
    """Reads text cells, none null and each made of number characters only.

    Integers are told from other numbers by their text (no '.', exponent, inf or nan), so
    "1.0" is a float whatever its value; an integer counts for int64 only if int64 holds it.
    """
    f64 = _cast_or_none(cells, pa.float64())
    whole = f64 is not None
    if whole:  # every cell a number, with no spaces around it: no regex needed
        text = cells  # cast to string only where a string kernel needs it
        is_int = _integer_cells(cells, f64)
        is_num = np.ones(len(text), bool)
    else:
        text = pc.utf8_trim_whitespace(cells.cast(pa.string()))  # number characters are ASCII
        is_int = _mask(pc.match_substring_regex(text, _INT_RE))
        is_num = is_int | _mask(pc.match_substring_regex(text, _FLOAT_RE))
        f64 = pc.cast(_where(is_num, text), pa.float64())  # Arrow parses every match of both
    zeros = 0
    if is_int.any():
        int_text = _where(is_int, text)
        int_values = _int64_values(int_text)
        # On the integers alone: a regex over a column's nulls still costs ~40 ns a cell.
        zeros = int(pc.sum(pc.match_substring_regex(text.filter(pa.array(is_int)), _LEADING_ZERO_RE)).as_py() or 0)
    else:
        int_values = pa.nulls(len(text), pa.int64())
    fits = _mask(int_values.is_valid())
    f32 = pc.cast(f64, pa.float32(), safe=False)
    overflow = _beyond_float32(text, f32)
    inexact = _inexact_in_float32(int_values) + _inexact_integral_floats(text, f64, is_num & ~is_int)
    floats = is_num & ~is_int & ~overflow
    changed = inexact64 = 0
    if count_changes:
        changed = int(np.count_nonzero(float32_changes(f64.to_numpy(zero_copy_only=False)[floats])))
        inexact64 = int(np.count_nonzero(inexact_in_float(int_values, FLOAT_BITS["float64"])))
        inexact64 += _inexact_integral_floats(text, f64, is_num & ~is_int, FLOAT_BITS["float64"])
    return _Numbers(
        ints=fits,
        wide=is_int & ~fits,
        floats=floats,
        overflow=overflow,
        zeros=zeros,
        inexact=inexact,
        int_values=int_values,
        float_values=_where(is_num & ~overflow, f32),
        # Only conversion reads them (counting does not: a pass over the column saved).
        double_values=None if count_changes else _where(is_num & ~_beyond_float32(text, f64), f64),
        f64=f64 if whole else None,
        changed=changed,
        inexact64=inexact64,
    )


def _integer_cells(cells: pa.Array, f64: pa.Array) -> np.ndarray:
    """Which number cells (none null) are written as integers: no '.', exponent, inf or nan.

    A finite value with a fraction was not, so only the other cells' text is read (a
    column of decimals reads none of it).
    """
    v = f64.to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        maybe = ~(np.isfinite(v) & (v != np.floor(v)))
    is_int = np.zeros(len(v), bool)
    if maybe.any():
        rows = np.flatnonzero(maybe)
        data, offsets = _text_buffers(cells if len(rows) == len(v) else cells.take(pa.array(rows)))
        is_int[rows] = ~_cells_with(data, offsets, _NOT_INT)
    return is_int


def _int64_values(text: pa.Array) -> pa.Array:
    """Integer text (or null) -> int64, null where int64 cannot hold the value."""
    if not pa.types.is_string(text.type):
        text = text.cast(pa.string())
    unsigned = pc.utf8_ltrim(text, "+")  # Arrow's integer parser takes no '+'
    try:
        return pc.cast(unsigned, pa.int64())
    except pa.ArrowInvalid:
        pass
    # Some value is beyond int64: compare digits with its limits, as text.
    digits = pc.utf8_ltrim(pc.utf8_ltrim(text, "+-"), "0")
    width = pc.utf8_length(digits)
    limit = pc.if_else(pc.starts_with(text, "-"), pa.scalar(_INT64_LIMITS[1]), pa.scalar(_INT64_LIMITS[0]))
    fits = pc.or_(pc.less(width, 19), pc.and_(pc.equal(width, 19), pc.less_equal(digits, limit)))
    return pc.cast(pc.if_else(fits, unsigned, pa.scalar(None, pa.string())), pa.int64())


def _beyond_float32(text: pa.Array, f32: pa.Array) -> np.ndarray:
    """Cells that float32 (or float64, given its values) made infinite though their text is a finite number."""
    inf = _mask(pc.is_inf(f32))
    if inf.any():
        literal = _mask(
            pc.match_substring(text.filter(pa.array(inf)).cast(pa.string()), "n", ignore_case=True)
        )  # inf, infinity
        inf[np.flatnonzero(inf)[literal]] = False
    return inf


def _inexact_in_float32(values: pa.Array) -> int:
    return int(np.count_nonzero(inexact_in_float32(values)))


def inexact_in_float32(values: pa.Array) -> np.ndarray:
    """Per value of an int64 array, whether float32 cannot hold it exactly (a null: False).

    The rule of float32 columns: an integer is stored in one only if it comes back whole,
    that is if its odd part (the integer without its trailing zero bits) is below 2**24.
    """
    return inexact_in_float(values, _FLOAT32_EXACT_BITS)


def inexact_in_float(values: pa.Array, bits: int) -> np.ndarray:
    """Per value of an int64 array, whether a float of `bits` significand bits (FLOAT_BITS)
    cannot hold it exactly: its odd part is 2**bits or more (a null: False)."""
    v = pc.fill_null(values, 0).to_numpy(zero_copy_only=False) if values.null_count else values.to_numpy()
    if not len(v):
        return np.zeros(0, bool)
    magnitude = np.abs(v).astype(np.uint64)  # |-2**63| wraps to 2**63, as wanted
    if magnitude.max() <= 1 << bits:
        return np.zeros(len(v), bool)
    lowest_bit = magnitude & (~magnitude + np.uint64(1))
    odd = magnitude // np.maximum(lowest_bit, np.uint64(1))
    return (odd >> np.uint64(bits)) != 0


def float32_changes(values: np.ndarray) -> np.ndarray:
    """Per float64 value, whether float32 would change it: whether the shortest decimal that
    float32 gives back for it (what `str` of a float32 prints) reads as another float64.

    So "0.1" is kept (float32 prints 0.1) and "123456789.12" is not (123456790), and a
    value float32 holds exactly is kept (a float32 widened to float64 in a Parquet file).
    NaN and infinities are kept. Vectorized: values float32 holds exactly and decimals of
    at most 6 significant digits (FLT_DIG, which float32 always gives back) are found with
    numpy; only the others go through Arrow's shortest formatting and parsing. Measured on
    200k CSV cells (2 shared cores): short decimals ~1.5 ms with numpy alone, on
    count_types' ~5-7 ms; 16-digit doubles ~18 ms (~90 ns a value), on its ~10 ms: the
    columns that become float64.
    """
    v = np.asarray(values, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = v.astype(np.float32)
        kept = (f32.astype(np.float64) == v) | np.isnan(v)
    if not kept.all():
        kept |= _short_decimals(v)  # on every value: cheaper than gathering those left (~2x)
    rest = np.flatnonzero(~kept)
    if len(rest):
        shortest = pc.cast(pa.array(f32[rest]), pa.string())  # Arrow prints a float32's shortest decimal
        kept[rest] = pc.cast(shortest, pa.float64()).to_numpy(zero_copy_only=False) == v[rest]
    return ~kept


def _short_decimals(v: np.ndarray) -> np.ndarray:
    """Per float64 value, whether it is the float64 of a decimal of at most FLT_DIG
    significant digits in float32's normal range, below 10**6 (then float32 gives that
    decimal back): M / 10**k == v for an integer M < 10**6 and 0 <= k <= 22, a quotient
    of exact numbers, correctly rounded, so any such M proves it.

    k comes from log10, clipped: one off (log10 near a power of ten) gives no such M, and
    the value is left for the exact test, never wrongly kept. Values from 10**6 up (rare
    with a fraction) are left to it too: one multiply and one divide, no `np.where` of
    both directions, took 0.8 ms for 200k cells where the two-sided version took 4-8 ms.
    """
    a = np.abs(v)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ok = (a >= _FLOAT32_TINY) & (a < 10**_FLOAT32_DIGITS)
        k = (_FLOAT32_DIGITS - 1) - np.floor(np.log10(a)).astype(np.int64)
        np.clip(k, 0, len(_POWERS_OF_10) - 1, out=k)
        p = _POWERS_OF_10[k]
        m = np.rint(a * p)
        return ok & (m < 10**_FLOAT32_DIGITS) & (m / p == a)


def inexact_integers(cells: pa.Array, f32: pa.Array, bits: int = _FLOAT32_EXACT_BITS) -> np.ndarray:
    """Per text cell, whether it is an integer (123, or 123.0 as exports of int columns with
    gaps write it) that float32 cannot hold exactly: the cells the inference counts as
    `inexact`, found where a column's type is float32 already (`f32`: the cells as float32).
    With `bits` 53 and float64 cells, those float64 cannot hold exactly.

    Only a value of magnitude 2**bits or more can be one, so only those cells' text is read.
    """
    out = np.zeros(len(cells), bool)
    big = _mask(pc.and_(pc.is_finite(f32), pc.greater_equal(pc.abs(f32), pa.scalar(float(1 << bits)))))
    if not big.any():
        return out
    rows = np.flatnonzero(big)
    text = pc.utf8_trim_whitespace(cells.take(pa.array(rows)).cast(pa.string()))
    whole = _mask(pc.match_substring_regex(text, _INT_RE)) | _mask(pc.match_substring_regex(text, _INTEGRAL_RE))
    ints = _int64_values(pc.replace_substring_regex(_where(whole, text), r"\.0*$", ""))
    beyond_int64 = whole & ~_mask(ints.is_valid())  # inexact, as the inference counts them
    out[rows] = whole & (beyond_int64 | inexact_in_float(ints, bits))
    return out


def _inexact_integral_floats(text: pa.Array, f64: pa.Array, floats: np.ndarray, bits: int = _FLOAT32_EXACT_BITS) -> int:
    """Integers written with a zero fraction (123.0) that float32 (a float of `bits`) cannot hold exactly."""
    values = f64.to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        integral = floats & np.isfinite(values) & (values == np.floor(values)) & (np.abs(values) > 1 << bits)
    if not integral.any():
        return 0
    candidates = text.filter(pa.array(integral))
    whole = candidates.filter(pc.match_substring_regex(candidates, _INTEGRAL_RE))
    ints = _int64_values(pc.replace_substring_regex(whole, r"\.0*$", ""))
    return ints.null_count + int(np.count_nonzero(inexact_in_float(ints, bits)))


def _leading_zeros(data: np.ndarray, offsets: np.ndarray) -> int:
    """Cells, each an integer (-?digits), with a leading zero."""
    starts, ends = offsets[:-1], offsets[1:]
    first = starts + (data[starts] == ord("-"))
    return int(np.count_nonzero((first + 1 < ends) & (data[np.minimum(first, len(data) - 1)] == ord("0"))))


def _cells_with(data: np.ndarray, offsets: np.ndarray, chars: np.ndarray) -> np.ndarray:
    """Per cell, whether it holds one of the bytes marked in `chars`."""
    seen = np.concatenate([[0], np.cumsum(np.take(chars, data))])
    return seen[offsets[1:]] > seen[offsets[:-1]]


def _mask(arr) -> np.ndarray:
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), bool)


def _where(mask: np.ndarray, arr: pa.Array) -> pa.Array:
    return pc.if_else(pa.array(mask), arr, pa.scalar(None, arr.type))


# A failed Arrow cast costs ~2 ms (its error path), 40x a successful one, so casts are
# only tried on columns whose characters allow them.
_INT_CHARS, _FLOAT_CHARS, _OTHER_CHARS = 0, 1, 2
_CHAR_CLASS = np.full(256, _OTHER_CHARS, np.int8)
_CHAR_CLASS[np.frombuffer(b"+.eE \t\r\ninfatyINFATY", np.uint8)] = _FLOAT_CHARS
_CHAR_CLASS[np.frombuffer(b"0123456789-", np.uint8)] = _INT_CHARS
_DIGITS = np.zeros(256, np.int32)
_DIGITS[np.frombuffer(b"0123456789", np.uint8)] = 1
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
    if not data.size:
        return _INT_CHARS
    # Plain integers and decimals use bytes 45-57 only ('-', '.', '/', digits): their
    # extremes (a SIMD pass each) and two compares decide, not a table lookup per byte.
    if data.min() >= ord("-") and data.max() <= ord("9"):
        if (data == ord("/")).any():
            return _OTHER_CHARS
        return _FLOAT_CHARS if (data == ord(".")).any() else _INT_CHARS
    return int(np.take(_CHAR_CLASS, data).max())


def _cell_classes(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per cell, the widest character class it uses (empty cells: int chars)."""
    out = np.zeros(len(offsets) - 1, np.int8)
    nonempty = np.diff(offsets) > 0
    if data.size:
        out[nonempty] = np.maximum.reduceat(np.take(_CHAR_CLASS, data), offsets[:-1][nonempty])
    return out


def _number_like(cells: pa.Array, data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per cell of `cells` (none null; `data`, `offsets`: their `_text_buffers`), whether
    it may be a number: made of number characters, with a digit or spelling inf or nan.
    Words of those characters ("eta", "tea") would otherwise take `_numbers`' slow path."""
    maybe = _cell_classes(data, offsets) <= _FLOAT_CHARS
    rows = np.flatnonzero(maybe)
    if not len(rows):
        return maybe
    candidates = cells if len(rows) == len(cells) else cells.take(pa.array(rows))
    wordy = ~_cells_with(*_text_buffers(candidates), _DIGITS)
    if wordy.any():
        words = candidates.filter(pa.array(wordy))
        maybe[rows[wordy]] = _mask(pc.match_substring_regex(words.cast(pa.string()), _NON_FINITE_RE))
    return maybe


def _cast_or_none(col: pa.Array, to: pa.DataType):
    try:
        return pc.cast(col, to)
    except pa.ArrowInvalid:
        return None


def merge_counts(many) -> dict:
    total: dict = {}
    for counts in many:
        for name, c in counts.items():
            total[name] = total.get(name, TypeCounts()) + c
    return total


def decide_types(counts: Mapping, columns, *, tolerance: float, given: Mapping) -> dict:
    """Chooses a dtype per column: given types win; else int64 < float32 < float64 < bytes,
    but never one that would merge or bend the values the column holds:

    - an integer beyond int64, or written with a leading zero ("02134"), keeps the column text;
    - a column of numbers that are not all integers is float32 if float32 keeps every value
      (`float32_changes`: its shortest decimal reads back as the number written, so "0.1"
      stays float32) and holds each integer exactly; else float64 (123456789.12), if float64
      holds each integer exactly; else text;
    - cells that are no numbers, or finite numbers beyond float32, are tolerated up to
      `tolerance` of the cells (they are quarantined); more make the column text.
    """
    types = {}
    for name in columns:
        if name in given:
            types[name] = given[name]
            continue
        c = counts.get(name, TypeCounts())
        numeric = c.ints + c.floats
        others = c.nonnull - numeric
        if c.wide or c.zeros or numeric == 0 or others > tolerance * c.nonnull:
            types[name] = "bytes"
        elif c.floats == 0:
            types[name] = "int64"
        elif not (c.inexact or c.changed):
            types[name] = "float32"
        else:
            types[name] = "bytes" if c.inexact64 else "float64"
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


def convert_text_column(col: pa.Array, dtype: str, *, exact_integers: bool = False, casts: dict | None = None):
    """Text cells -> typed array. Returns `(array, bad_mask)`; bad cells become null.

    A cell is good if it is a number the type holds: int64 takes integers within its range
    (leading zeros, a sign and surrounding spaces allowed); float32 and float64 take any
    number except a finite one beyond their range (inf and nan stay). With `exact_integers`,
    they also refuse an integer they cannot hold exactly (`inexact_integers`): for a column
    whose type is fixed (carried from another dataset), which cannot turn text as an
    inferred one would.
    `casts`: what `count_types` left for this column, so that its numbers are not parsed
    twice (10 float columns of 200k cells: ~40 ms a pass).
    """
    values, bad = _convert_text_column(col, dtype, casts or {})
    if exact_integers and dtype in FLOAT_BITS:
        inexact = inexact_integers(col, values, FLOAT_BITS[dtype])
        if inexact.any():
            values, bad = _where(~inexact, values), bad | inexact
    return values, bad


def _convert_text_column(col: pa.Array, dtype: str, casts: dict):
    if dtype == "bytes":
        return col, np.zeros(len(col), bool)
    if dtype == "int64" and "int64" in casts:
        return casts["int64"], np.zeros(len(col), bool)
    if dtype in FLOAT_BITS and "float64" in casts:
        return _floats(col, casts["float64"], dtype)
    widest = _widest_class(_text_buffers(col)[0])
    # Arrow's strict parsers take clean columns whole, ~4x faster than reading cell by cell.
    if dtype == "int64" and widest == _INT_CHARS:
        values = _cast_or_none(col, pa.int64())
        if values is not None:
            return values, np.zeros(len(col), bool)
    if dtype in FLOAT_BITS and widest <= _FLOAT_CHARS:
        f64 = _cast_or_none(col, pa.float64())
        if f64 is not None:
            return _floats(col, f64, dtype)
    valid = _mask(col.is_valid())
    data, offsets = _text_buffers(col)
    maybe = np.zeros(len(col), bool)
    maybe[valid] = _number_like(col.filter(pa.array(valid)) if col.null_count else col, data, offsets)
    where = np.flatnonzero(maybe)
    ok = np.zeros(len(col), bool)
    slot = np.full(len(col), -1, np.int64)  # each cell's place among the number-like ones
    values = pa.nulls(0, {"int64": pa.int64(), "float32": pa.float32(), "float64": pa.float64()}[dtype])
    if len(where):
        nums = _numbers(col.filter(pa.array(maybe)))
        values = {"int64": nums.int_values, "float32": nums.float_values, "float64": nums.double_values}[dtype]
        ok[where] = _mask(values.is_valid())
        slot[where] = np.arange(len(where))
    return values.take(pa.array(slot, mask=~ok)), valid & ~ok


def _floats(text: pa.Array, f64: pa.Array, dtype: str) -> tuple:
    """A column that Arrow read whole as float64 -> (its values as `dtype`, the cells that
    are finite numbers beyond that type's range, null in the values)."""
    values = f64 if dtype == "float64" else pc.cast(f64, pa.float32(), safe=False)
    bad = _beyond_float32(text, values)
    return (_where(~bad, values) if bad.any() else values), bad


def bad_cell_reason(value: str, dtype: str) -> str:
    """Why a cell that `convert_text_column` (or `inexact_integers`) refused is not a valid `dtype`."""
    text = value.strip()
    if dtype == "int64" and re.fullmatch(_INT_RE, text, re.ASCII):
        return f"{value!r} is out of int64's range [-{_INT64_LIMITS[1]}, {_INT64_LIMITS[0]}]"
    if dtype in FLOAT_BITS and re.fullmatch(_FLOAT_RE, text, re.ASCII):
        integer = re.fullmatch(_INT_RE, text, re.ASCII) or re.fullmatch(_INTEGRAL_RE, text, re.ASCII)
        limit, about = (_FLOAT32_MAX, "3.4e38") if dtype == "float32" else (float(np.finfo(np.float64).max), "1.8e308")
        if integer and abs(float(text)) <= limit:
            return f"{value!r} is not exact in {dtype}"
        return f"{value!r} is a finite number beyond {dtype}'s range (about ±{about})"
    return f"{value!r} is not a valid {dtype}"


_UNSUPPORTED_HELP = (
    "supported: integers, floats, bool, decimal, string, binary, timestamp, date, dictionary, "
    "and lists of those; select other columns with --columns"
)
_INT64_MAX = 2**63 - 1
# Decimals map by their type, never by the values seen (all files must agree at launch):
# integral ones of up to 18 digits are exact in int64; float32 gives back every decimal of
# up to 6 significant digits (FLT_DIG) when rounded to its scale; others keep their exact text.
_DECIMAL_INT64_DIGITS = 18
_DECIMAL_FLOAT32_DIGITS = 6


class UnstorableValue(ValueError):
    """A value its column's stored type cannot hold exactly; `index`: its row, if known."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


def arrow_dtype(name: str, t: pa.DataType, *, float64: bool = False) -> tuple:
    """Maps an Arrow type to (dtype, shape) of the contract, or raises naming the column.

    Floats map to float32, or with `float64` to float64 (the job decides which from the
    values, `float32_changes`: a type alone does not say whether float32 keeps them).
    """
    if pa.types.is_dictionary(t):
        return arrow_dtype(name, t.value_type, float64=float64)
    if pa.types.is_fixed_size_list(t):
        dtype, shape = arrow_dtype(name, t.value_type, float64=float64)
        if shape != ():
            raise ValueError(f"column {name!r} has nested list type {t}: {_UNSUPPORTED_HELP}")
        return dtype, (t.list_size,)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        dtype, shape = arrow_dtype(name, t.value_type, float64=float64)
        if shape != ():
            raise ValueError(f"column {name!r} has nested list type {t}: {_UNSUPPORTED_HELP}")
        return dtype, (None,)
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "int64", ()
    if pa.types.is_decimal(t):
        return _decimal_dtype(t), ()
    if pa.types.is_floating(t):
        return ("float64" if float64 else "float32"), ()
    if _is_bytes_type(t) or pa.types.is_null(t):
        return "bytes", ()
    raise ValueError(f"column {name!r} has unsupported type {t}: {_UNSUPPORTED_HELP}")


def _decimal_dtype(t: pa.DataType) -> str:
    if t.scale <= 0 and t.precision - t.scale <= _DECIMAL_INT64_DIGITS:
        return "int64"
    if t.precision <= _DECIMAL_FLOAT32_DIGITS and t.scale <= 30:  # 1e-30: far inside float32's normal range
        return "float32"
    return "bytes"  # the exact decimal text, e.g. b"12345678901234567890.12"


def holds_float64(t: pa.DataType) -> bool:
    """Whether a column of this Arrow type holds float64 values (doubles), in lists too."""
    return pa.types.is_float64(_leaf_type(t))


def float32_changed(arr: pa.Array) -> int:
    """Of a float column's values (lists too), how many float32 would change
    (`float32_changes`), among those within float32's range: a finite value beyond it is
    refused by a float32 column (quarantined), not changed, as CSV's text is."""
    return float32_changed_values(_float_values(arr))


def float32_changed_values(v: np.ndarray) -> int:
    """`float32_changed` of float64 values (a numpy array)."""
    with np.errstate(over="ignore"):
        inside = np.isfinite(v.astype(np.float32)) | ~np.isfinite(v)
    return int(np.count_nonzero(float32_changes(v[inside])))


def float32_bend(arr: pa.Array) -> tuple:
    """(how many values float32 changes, the largest absolute change) of a column of
    numbers (lists too) stored as float32, among the values within float32's range: the
    warning of a column whose float32 type was given, not inferred."""
    v = _float_values(arr)
    with np.errstate(over="ignore", invalid="ignore"):
        back = v.astype(np.float32).astype(np.float64)
        inside = np.isfinite(back) | ~np.isfinite(v)
        v, back = v[inside], back[inside]
        changed = float32_changes(v)
        if not changed.any():
            return 0, 0.0
        return int(np.count_nonzero(changed)), float(np.max(np.abs(v[changed] - back[changed])))


def _float_values(arr: pa.Array) -> np.ndarray:
    """A column's values (lists flattened, nulls left out) as float64."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        arr = arr.flatten() if pa.types.is_fixed_size_list(arr.type) else pc.list_flatten(arr)
    return arr.drop_null().cast(pa.float64()).to_numpy(zero_copy_only=False)


def holds_binary(t: pa.DataType) -> bool:
    """Whether a column of this Arrow type holds binary data (not UTF-8 text), in lists too."""
    while (
        pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_dictionary(t)
    ):
        t = t.value_type
    return (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_binary_view(t)
    )


def _is_text_type(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _leaf_type(t: pa.DataType) -> pa.DataType:
    while (
        pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_dictionary(t)
    ):
        t = t.value_type
    return t


def as_binary(arr: pa.Array) -> pa.Array:
    """A column whose text (Arrow string types, in lists and dictionaries too) is seen as
    bytes: the same values, which `to_pylist` reads as bytes even when they are not UTF-8
    (it raises on such a string)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not _is_text_type(_leaf_type(arr.type)):
        return arr
    t = arr.type
    if pa.types.is_fixed_size_list(t):
        return arr.cast(pa.list_(pa.large_binary(), t.list_size))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return arr.cast(pa.large_list(pa.large_binary()))
    return arr.cast(pa.large_binary())  # a dictionary's too: decoded


def invalid_utf8(arr: pa.Array, name: str) -> list:
    """[(row, reason)] of the rows of a text column (an Arrow string type, in lists and
    dictionaries too) whose value is not valid UTF-8, which a string type promises but
    Parquet writers and `pa.Array.from_buffers` do not check. Such bytes, stored as text,
    became a vocabulary that no later job could encode (`--schema_from`).

    Arrow's full validation checks every string at once (C++, no Python per value); only
    a column that fails it is searched row by row.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not _is_text_type(_leaf_type(arr.type)):
        return []
    try:
        arr.validate(full=True)
        return []
    except pa.ArrowInvalid:
        pass
    out = []
    for row, value in enumerate(as_binary(arr).to_pylist()):
        for cell in value if isinstance(value, list) else [value]:
            if cell is None:
                continue
            try:
                cell.decode("utf-8")
            except UnicodeDecodeError as e:
                shown = repr(cell) if len(cell) <= 60 else repr(cell[:57]) + "..."
                out.append(
                    (
                        row,
                        f"column {name!r}: {shown} is not valid UTF-8 (byte 0x{cell[e.start]:02x} at offset "
                        f"{e.start}), though its type {arr.type} says it holds text: write the text as UTF-8, or "
                        "the column as binary if it holds bytes, not text",
                    )
                )
                break
    return out


def _is_bytes_type(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    )


def _scalar_to_canonical(arr: pa.Array, dtype: str, name: str) -> tuple:
    """-> (canonical array, mask of the values it cannot hold, which it holds as nulls, or None).

    Never wraps, rounds away or saturates a value silently: out-of-range numbers come back
    in the mask; a timestamp or date that would lose precision raises UnstorableValue.
    """
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_timestamp(t):
        # Timestamps become int64 microseconds since the Unix epoch (UTC).
        help_text = (
            _NS_HELP if t.unit == "ns" else "its microseconds overflow int64; leave the column out with --columns"
        )
        utc = pc.cast(arr, pa.timestamp(t.unit))  # the same instants, without the zone
        return _exact_cast(utc, pa.timestamp("us"), name, help_text).view(pa.int64()), None
    if pa.types.is_date(t):
        # Dates become int64 days since the Unix epoch.
        days = _exact_cast(arr, pa.date32(), name, "a date64 value must be a whole number of days (86400000 ms)")
        return pc.cast(days, pa.int32()).cast(pa.int64()), None
    if pa.types.is_null(t):
        return pa.nulls(len(arr), pa.large_binary()), None
    if pa.types.is_decimal(t) and dtype == "bytes":
        return pc.cast(pc.cast(arr, pa.string()), pa.large_binary()), None
    if pa.types.is_decimal(t) and dtype == "float32":
        arr = pc.cast(arr, pa.float64())  # exact for these few digits; then one rounding
    unfit = None
    if pa.types.is_uint64(t):
        unfit = pc.fill_null(pc.greater(arr, pa.scalar(_INT64_MAX, pa.uint64())), False)
    target = {"int64": pa.int64(), "float32": pa.float32(), "float64": pa.float64(), "bytes": pa.large_binary()}[dtype]
    out = pc.cast(arr if unfit is None else pc.if_else(unfit, pa.scalar(None, arr.type), arr), target, safe=False)
    if dtype == "float32" and pa.types.is_float64(arr.type):
        unfit = pc.fill_null(pc.and_(pc.is_inf(out), pc.is_finite(arr)), False)
    if unfit is None or not pc.any(unfit).as_py():
        return out, None
    return pc.if_else(unfit, pa.scalar(None, out.type), out), np.asarray(unfit.to_numpy(zero_copy_only=False), bool)


_NS_HELP = (
    "timestamps are stored as int64 microseconds since the epoch, so its sub-microsecond part "
    "would be lost; leave the column out with --columns, or store it in the Parquet file as "
    "int64 nanoseconds (or as timestamp[us] if the nanoseconds do not matter)"
)


def _exact_cast(arr: pa.Array, to: pa.DataType, name: str, help_text: str) -> pa.Array:
    try:
        return pc.cast(arr, to)
    except pa.ArrowInvalid:
        pass
    # Name the first value that does not survive the round trip.
    back = pc.cast(pc.cast(arr, to, safe=False), arr.type, safe=False)
    lost = np.asarray(pc.fill_null(pc.not_equal(back, arr), False).to_numpy(zero_copy_only=False), bool)
    i = int(np.flatnonzero(lost)[0]) if lost.any() else None
    value = "a value" if i is None else f"{arr.type} value {pc.cast(arr.slice(i, 1), pa.string())[0].as_py()}"
    raise UnstorableValue(f"column {name!r}: {value} does not convert to {to} exactly: {help_text}", i)


def _unfit_reason(name: str, value) -> str:
    if isinstance(value, float):
        return f"column {name!r}: {value!r} is a finite number beyond float32's range (about ±3.4e38)"
    return (
        f"column {name!r}: {value} is above int64's maximum {_INT64_MAX}; uint64 values are stored "
        "as int64 (leave the column out with --columns, or store it in the Parquet file as a string)"
    )


def canonical_arrow_column(arr: pa.Array, name: str, *, unfit: list | None = None, float64: bool = False) -> tuple:
    """Arrow column -> (dtype, shape, array of int64/float32/float64/large_binary or lists of them).

    A value the stored type cannot hold (uint64 above int64's maximum, a finite float64
    beyond float32's range) raises UnstorableValue naming the column and row; with an
    `unfit` list, its row is appended as (row, reason) instead and the column is returned
    with that row null, for the caller to quarantine. `float64`: floats become float64
    (`arrow_dtype`).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    dtype, shape = arrow_dtype(name, arr.type, float64=float64)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    holes: dict = {}  # row -> the position of its first null element, for lists
    size = None  # a fixed-size list's length
    if shape == ():
        out, bad = _scalar_to_canonical(arr, dtype, name)
        values, parents = arr, None
    elif pa.types.is_fixed_size_list(arr.type):
        size = arr.type.list_size
        # `flatten` drops null lists' slots; `from_arrays` needs every slot.
        values = arr.values.slice(arr.offset * size, len(arr) * size)
        parents = np.repeat(np.arange(len(arr)), size)
        flat, bad = _at_rows(lambda: _scalar_to_canonical(values, dtype, name), parents)
        if bad is not None:  # a null list's slots hold no value
            bad &= np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)[parents]
        out = pa.FixedSizeListArray.from_arrays(flat, size, mask=pc.is_null(arr))
        holes = _null_elements(values, parents, np.arange(len(arr)) * size, arr)
    else:
        arr = arr.cast(pa.large_list(arr.type.value_type))
        if arr.offset:  # rebuilding from sliced offsets with a null mask is not supported
            arr = arr.take(pa.array(np.arange(len(arr))))
        values = arr.values
        offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False))
        parents = np.repeat(np.arange(len(arr)), np.diff(offsets))
        flat, bad = _at_rows(lambda: _scalar_to_canonical(values, dtype, name), parents)
        out = pa.LargeListArray.from_arrays(arr.offsets, flat, mask=pc.is_null(arr))
        holes = _null_elements(values, parents, offsets[:-1], arr)
    if (bad is None or not bad.any()) and not holes:
        return dtype, shape, out
    which = np.flatnonzero(bad) if bad is not None else np.zeros(0, np.int64)
    rows = which if parents is None else np.asarray(parents)[which]
    found = {}  # first unfit value of each row
    for value_index, row in zip(which.tolist(), rows.tolist()):
        found.setdefault(row, _unfit_reason(name, values[value_index].as_py()))
    for row, position in holes.items():
        found.setdefault(row, _null_element_reason(name, position, len_of=size))
    if unfit is None:
        row, reason = next(iter(found.items()))
        raise UnstorableValue(reason, row)
    unfit.extend(found.items())
    rows_bad = np.zeros(len(out), bool)
    rows_bad[list(found)] = True
    return dtype, shape, pc.if_else(pa.array(rows_bad), pa.nulls(len(out), out.type), out)


def _null_elements(values: pa.Array, parents: np.ndarray, row_starts: np.ndarray, lists: pa.Array) -> dict:
    """Row -> the position in its list of its first null element, over the rows whose list
    is present (`row_starts[r]`: where row r's values start in `values`).

    A tf.train.Example list has no null: writing the type's zero instead would store a
    value the file does not hold, so the row is refused (a null list's slots hold nothing).
    """
    if not values.null_count:
        return {}
    present = np.asarray(lists.is_valid().to_numpy(zero_copy_only=False), bool)[parents]
    holes = np.flatnonzero(np.asarray(values.is_null().to_numpy(zero_copy_only=False), bool) & present)
    rows, first = np.unique(parents[holes], return_index=True)
    return dict(zip(rows.tolist(), (holes[first] - row_starts[rows]).tolist()))


def _null_element_reason(name: str, position: int, *, len_of: int | None) -> str:
    where = f"element {position + 1}" + ("" if len_of is None else f" of {len_of}")
    return (
        f"column {name!r}: {where} of its list is null, and lists must not contain null elements "
        "(a tf.train.Example list has no null): fill or drop the nulls in the input, or leave the "
        "column out with --columns"
    )


def _at_rows(convert, parents):
    """Runs a conversion of a list column's values, naming rows, not values, in its errors."""
    try:
        return convert()
    except UnstorableValue as e:
        if e.index is None:
            raise
        row = int(np.asarray(parents)[e.index])
        raise UnstorableValue(str(e), row) from e
