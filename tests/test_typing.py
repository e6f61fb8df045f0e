"""CSV type inference and text-to-number conversion against a cell-by-cell reference.

`column_types` reads whole columns with Arrow kernels and skips work it can prove useless
(the text of cells whose value has a fraction, words of number characters such as
"eta"); the reference below reads each cell on its own with Python's `re`, `int` and
`float`, so a shortcut that changes a count or a value fails here.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from beam_jobs.sources import column_types
from tests.conftest import examples

_INT = re.compile(r"[+-]?\d+", re.ASCII)
_FLOAT = re.compile(r"[+-]?((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|inf|infinity|nan)", re.ASCII | re.IGNORECASE)
_INTEGRAL = re.compile(r"[+-]?\d+\.0*", re.ASCII)


def _exact_in_float32(v: int, bits: int = 24) -> bool:
    m = abs(v)
    while m and m % 2 == 0:
        m //= 2
    return m < 1 << bits


def _float32_changes(v: float) -> bool:
    """Whether float32's shortest decimal (numpy's Dragon4, not Arrow's formatter) reads as another number."""
    with np.errstate(over="ignore"):
        f = np.float32(v)
    return not (math.isnan(v) or float(f) == v or float(str(f)) == v)


def _fits_int64(v: int) -> bool:
    return -(2**63) <= v < 2**63


def _read(cell: bytes):
    """-> ('int', value) | ('wide', None) | ('float', float32 value) | ('overflow', None) | None."""
    text = cell.decode("ascii").strip()
    if _INT.fullmatch(text):
        v = int(text)
        return ("int", v) if _fits_int64(v) else ("wide", None)
    if _FLOAT.fullmatch(text):
        with np.errstate(over="ignore"):
            f32 = np.float32(float(text))  # float(): correctly rounded, as Arrow's parser
        if np.isinf(f32) and "n" not in text.lower():  # finite text beyond float32
            return ("overflow", None)
        return ("float", f32)
    return None


def _reference_counts(cells: list) -> column_types.TypeCounts:
    c = column_types.TypeCounts()
    for cell in cells:
        if cell is None:
            continue
        c.nonnull += 1
        read = _read(cell)
        text = cell.decode("ascii").strip()
        kind = read[0] if read else None
        if kind == "int":
            c.ints += 1
            c.zeros += bool(re.match(r"[+-]?0\d", text))
            c.inexact += not _exact_in_float32(read[1])
            c.inexact64 += not _exact_in_float32(read[1], 53)
        elif kind == "wide":
            c.wide += 1
        elif kind == "float":
            c.floats += 1
            c.changed += _float32_changes(float(text))
        if kind in ("float", "overflow") and _INTEGRAL.fullmatch(text):
            whole = int(text.split(".")[0])
            c.inexact += abs(whole) > 1 << 24 and (not _fits_int64(whole) or not _exact_in_float32(whole))
            c.inexact64 += abs(whole) > 1 << 53 and (not _fits_int64(whole) or not _exact_in_float32(whole, 53))
    return c


_NUMBER_CHARS = "0123456789+-.eEinfatyINFATY \t"
_cells = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.builds(
        lambda s, z, v: f"{s}{'0' * z}{v}", st.sampled_from(["", "+", "-"]), st.integers(0, 2), st.integers(0, 10**6)
    ),
    st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
    st.floats(-1e40, 1e40).map(lambda f: f"{f:.6e}"),
    st.integers(-(2**40), 2**40).map(lambda i: f"{i}.0"),
    st.sampled_from(["inf", "-Infinity", "NaN", "+nan", " 7 ", "\t-3.5", "1e999", "3.4028236e38", "16777217"]),
    st.text(alphabet=_NUMBER_CHARS, max_size=6),
    st.sampled_from(["eta", "tea", "alpha", "n/a", "", "e", ".", "12abc", "1/2", "-", "-.", "--1", "1.2.3"]),
).map(str.encode)
_columns = st.lists(st.one_of(_cells, st.none()), min_size=1, max_size=40)
# Columns of one kind of cell, as real columns are: each takes one fast path whole.
_pure = st.one_of(
    st.lists(st.integers(-(10**9), 10**9).map(lambda i: str(i).encode()), min_size=1, max_size=40),
    st.lists(st.floats(-1e6, 1e6).map(lambda f: f"{f:.5f}".encode()), min_size=1, max_size=40),
    st.lists(st.sampled_from([b"alpha", b"eta", b"beta", b"tea"]), min_size=1, max_size=40),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(_columns, _pure))
@example([b"1.5", b"2", b"0.25"])  # a column of decimals with one integer among them
@example([b"eta", b"alpha", b"1"])
@example([b"007", b"1.25"])
@example([b"12/31", b"1"])  # a date among integers: text, though every byte is a digit, '-' or '/'
def test_inference_counts_every_cell_as_a_reference_reads_it(cells):
    batch = pa.RecordBatch.from_pydict({"c": pa.array(cells, pa.binary())})
    assert column_types.count_types(batch)["c"] == _reference_counts(cells)


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(_columns, _pure), st.sampled_from(["int64", "float32", "float64"]))
@example([b"eta", b"12", None], "int64")
@example([b" 1e3 ", b"tea", b"-0.0"], "float32")
def test_conversion_keeps_each_number_the_type_holds_and_refuses_the_rest(cells, dtype):
    values, bad = column_types.convert_text_column(pa.array(cells, pa.binary()), dtype)
    got = values.to_pylist()
    for i, cell in enumerate(cells):
        read = None if cell is None else _read(cell)
        kind = read and read[0]
        # float32 takes every number but a finite one beyond its range, integers too
        ok = kind == "int" if dtype == "int64" else kind in ("int", "wide", "float")
        if dtype == "float64" and kind == "overflow":  # beyond float32, but float64 may hold it
            text = cell.decode("ascii").strip()
            ok = not math.isinf(float(text))
        assert bool(bad[i]) == (cell is not None and not ok), cell
        if not ok:
            assert got[i] is None, cell
        elif dtype == "int64":
            assert got[i] == read[1], cell
        else:
            with np.errstate(over="ignore"):
                want = float(cell.decode("ascii").strip())
                want = want if dtype == "float64" else float(np.float32(want))
            assert (math.isnan(got[i]) and math.isnan(want)) or got[i] == want, cell


_float_values = st.one_of(
    st.floats(width=64),
    st.floats(width=32),
    # Decimals of up to 9 significant digits over float32's range, subnormals included.
    st.builds(lambda m, e: float(f"{m}e{e}"), st.integers(-(10**9), 10**9), st.integers(-48, 38)),
    st.sampled_from([0.1, 123456789.12, 123456790.0, 1e-45, 1.5e-45, 9.999995e-38, 1e-50, 3.4e38, 16777217.0]),
)


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(_float_values, min_size=1, max_size=40))
@example([0.1, 123456789.12, 0.100000001490116119384765625, 999999.0, 9999995.0, 1e-38, 1e6])
def test_float32_changes_a_value_when_its_shortest_float32_decimal_reads_as_another(values):
    got = column_types.float32_changes(np.array(values, np.float64))
    assert got.tolist() == [_float32_changes(v) for v in values]
