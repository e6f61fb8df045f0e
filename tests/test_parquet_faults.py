"""Parquet input that must not be bent: values the stored types cannot hold, schemas that
differ across files, damaged pages. Every case runs the real job on real files."""

from __future__ import annotations

import datetime
import decimal
import math
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest
from beam_jobs.convert import ConversionError
from ingest import contract
from tests.conftest import convert_table, quarantine_lines, read_examples, run_convert

INT64_MAX = 2**63 - 1


def test_uint64_above_int64_max_is_quarantined_never_wrapped(tmp):
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4, 5]),
            "u": pa.array([7, INT64_MAX, INT64_MAX + 1, 2**64 - 1, None], pa.uint64()),
            "us": pa.array([[1], [2], [3], [4], [2**64 - 1, 5]], pa.list_(pa.uint64())),
        }
    )
    ds = convert_table(tmp, table, "--max_bad_fraction", "0.7")
    kept = {r["id"][0]: r for r in read_examples(ds)}
    assert set(kept) == {1, 2}
    assert kept[1]["u"] == [7] and kept[2]["u"] == [INT64_MAX] and kept[2]["us"] == [2]
    bad = {q["row"]: q for q in quarantine_lines(ds)}
    assert set(bad) == {3, 4, 5}
    assert all(q["kind"] == "type" and q["source"].endswith("a.parquet") for q in bad.values())
    assert "18446744073709551615" in bad[4]["reason"] and "column 'u'" in bad[4]["reason"]
    assert "column 'us'" in bad[5]["reason"]
    assert "--columns" in bad[3]["reason"] and str(INT64_MAX + 1) in bad[3]["reason"]


def test_wide_decimals_keep_every_value_exactly(tmp):
    cents = [decimal.Decimal(123456789012345678900 + i) / 100 for i in range(1000)]
    table = pa.table(
        {
            "id": pa.array(range(1000)),
            "money": pa.array(cents, pa.decimal128(38, 2)),
            "small": pa.array([decimal.Decimal(i) / 100 for i in range(999000, 1000000)], pa.decimal128(6, 2)),
            "whole": pa.array([decimal.Decimal(10**18 - 1 - i) for i in range(1000)], pa.decimal128(18, 0)),
        }
    )
    ds = convert_table(tmp, table)
    info = contract.DatasetInfo.from_json(open(os.path.join(ds, "dataset_info.json")).read())
    spec = {f.name: f.dtype for f in info.features}
    assert spec == {"id": "int64", "money": "bytes", "small": "float32", "whole": "int64"}
    assert info.feature("money").text is True
    rows = sorted(read_examples(ds), key=lambda r: r["id"][0])
    assert [decimal.Decimal(r["money"][0].decode()) for r in rows] == cents
    assert len({r["money"][0] for r in rows}) == 1000
    # Up to 6 significant digits, float32 gives back the exact decimal when rounded to its scale.
    small = [decimal.Decimal(f"{np.float32(r['small'][0]):.2f}") for r in rows]
    assert small == [decimal.Decimal(i) / 100 for i in range(999000, 1000000)]
    assert [r["whole"][0] for r in rows] == [10**18 - 1 - i for i in range(1000)]


def test_timestamp_ns_with_a_sub_microsecond_part_is_refused_naming_file_row_and_column(tmp):
    ns = pa.array([1_700_000_000_000_000_000, 1_700_000_000_000_000_001], pa.timestamp("ns"))
    table = pa.table({"id": pa.array([1, 2]), "t": ns})
    with pytest.raises(
        ValueError, match=r"a\.parquet, row 2: column 't': .*000000001 .*sub-microsecond part.*--columns"
    ):
        convert_table(tmp, table)
    convert_table(tmp, table, "--columns", "id", "--overwrite")
    assert sorted(r["id"][0] for r in read_examples(tmp / "ds")) == [1, 2]


def test_timestamp_ns_in_whole_microseconds_converts_exactly(tmp):
    table = pa.table({"t": pa.array([1_700_000_000_123_456_000, -1000], pa.timestamp("ns", tz="UTC"))})
    ds = convert_table(tmp, table)
    assert sorted(r["t"][0] for r in read_examples(ds)) == [-1, 1_700_000_000_123_456]


def test_float64_beyond_float32_range_is_quarantined_not_made_infinite(tmp):
    values = [1.5, 1e300, -3.5e38, math.inf, -math.inf, math.nan, None, 3.4e38]
    table = pa.table({"id": pa.array(range(1, 9)), "x": pa.array(values, pa.float64())})
    ds = convert_table(tmp, table, "--max_bad_fraction", "0.5")
    kept = {r["id"][0]: r.get("x") for r in read_examples(ds)}
    assert set(kept) == {1, 4, 5, 6, 7, 8}
    assert kept[1] == [1.5] and kept[4] == [math.inf] and kept[5] == [-math.inf] and math.isnan(kept[6][0])
    assert kept[7] is None and kept[8] == [pytest.approx(3.4e38, rel=1e-6)]
    bad = sorted((q["row"], q["kind"]) for q in quarantine_lines(ds))
    assert bad == [(2, "type"), (3, "type")]
    assert all("column 'x'" in q["reason"] and "float32" in q["reason"] for q in quarantine_lines(ds))


def _two_files(tmp, first: pa.Table, second: pa.Table) -> str:
    os.makedirs(tmp / "in", exist_ok=True)
    pq.write_table(first, tmp / "in" / "a.parquet")
    pq.write_table(second, tmp / "in" / "b.parquet")
    return str(tmp / "in" / "*.parquet")


def test_a_column_only_in_a_later_file_is_an_error_naming_the_file_and_the_fix(tmp):
    pattern = _two_files(tmp, pa.table({"x": [1], "y": ["a"]}), pa.table({"x": [2], "y": ["b"], "z": [3.5]}))
    with pytest.raises(
        ConversionError,
        match=r"b\.parquet has column\(s\) \['z'\] that the first file .*a\.parquet lacks.*--columns x,y",
    ):
        run_convert("--source", "parquet", "--input", pattern, "--output", tmp / "ds")
    info = run_convert("--source", "parquet", "--input", pattern, "--output", tmp / "ds", "--columns", "x,y")
    assert [f.name for f in info.features] == ["x", "y"] and info.split("train").records == 2


def test_a_column_missing_from_a_later_file_is_an_error_with_or_without_columns(tmp):
    pattern = _two_files(tmp, pa.table({"x": [1], "y": ["a"]}), pa.table({"x": [2]}))
    with pytest.raises(
        ConversionError, match=r"b\.parquet lacks column\(s\) \['y'\] that the first file .*a\.parquet has.*--columns x"
    ):
        run_convert("--source", "parquet", "--input", pattern, "--output", tmp / "ds")
    with pytest.raises(ConversionError, match=r"b\.parquet lacks column\(s\) \['y'\]"):
        run_convert("--source", "parquet", "--input", pattern, "--output", tmp / "ds", "--columns", "y")


def test_columns_selects_across_files_whose_other_columns_differ(tmp):
    struct = pa.array([{"a": 1}], pa.struct([("a", pa.int64())]))
    pattern = _two_files(tmp, pa.table({"x": [1], "w": ["a"]}), pa.table({"s": struct, "x": pa.array([2], pa.int32())}))
    info = run_convert("--source", "parquet", "--input", pattern, "--output", tmp / "ds", "--columns", "x")
    assert sorted(r["x"][0] for r in read_examples(tmp / "ds")) == [1, 2]
    assert info.feature("x").dtype == "int64"


def test_decimals_whose_stored_types_differ_across_files_are_reported(tmp):
    narrow = pa.table({"d": pa.array([decimal.Decimal("1.25")], pa.decimal128(5, 2))})
    wide = pa.table({"d": pa.array([decimal.Decimal("1.25")], pa.decimal128(20, 2))})
    pattern = _two_files(tmp, narrow, wide)
    with pytest.raises(
        ConversionError, match=r"b\.parquet has column types \{'d': 'bytes'\}, but the first file .*\{'d': 'float32'\}"
    ):
        run_convert("--source", "parquet", "--input", pattern, "--output", tmp / "ds")


def _corrupt_column_chunk(path, row_group: int, column: int) -> None:
    """Overwrites the second half of one column chunk's data with 0xFF bytes."""
    meta = pq.ParquetFile(path).metadata.row_group(row_group).column(column)
    start = meta.dictionary_page_offset or meta.data_page_offset
    end = start + meta.total_compressed_size
    middle = (meta.data_page_offset + end) // 2
    data = bytearray(open(path, "rb").read())
    data[middle : end - 8] = b"\xff" * (end - 8 - middle)
    open(path, "wb").write(bytes(data))


def test_a_corrupt_snappy_page_names_the_file_row_group_column_and_fix(tmp):
    os.makedirs(tmp / "in")
    path = tmp / "in" / "a.parquet"
    n = 20000
    table = pa.table({"a": pa.array(np.arange(n)), "s": pa.array([f"text {i} " * 5 for i in range(n)])})
    # Plain pages: the bytes overwritten are Snappy's own, not dictionary indices.
    pq.write_table(table, path, compression="snappy", row_group_size=5000, use_dictionary=False)
    _corrupt_column_chunk(path, row_group=2, column=1)
    with pytest.raises(
        ValueError,
        match=r"a\.parquet: row group 2 \(rows 10001-15000\), column 's': .*[Ss]nappy.*"
        r"damaged: re-create or re-download it, leave it out of --input, or leave the column out with --columns",
    ):
        run_convert("--source", "parquet", "--input", path, "--output", tmp / "ds")


def test_a_truncated_parquet_file_is_named_at_launch(tmp):
    os.makedirs(tmp / "in")
    pq.write_table(pa.table({"x": list(range(100))}), tmp / "in" / "a.parquet")
    data = open(tmp / "in" / "a.parquet", "rb").read()
    open(tmp / "in" / "b.parquet", "wb").write(data[: len(data) // 2])
    with pytest.raises(
        ValueError, match=r"cannot read Parquet file .*b\.parquet: .*re-download it, or leave it out of --input"
    ):
        run_convert("--source", "parquet", "--input", tmp / "in" / "*.parquet", "--output", tmp / "ds")


def test_lossless_mappings_of_the_other_wide_types(tmp):
    day = datetime.date(2000, 1, 1)
    table = pa.table(
        {
            "id": pa.array([1, 2]),
            "u": pa.array([0, INT64_MAX], pa.uint64()),
            "uuid": pa.array([b"\x00" * 16, b"\xff" * 16], pa.binary(16)),
            "d64": pa.array([day, None], pa.date64()),
            "f16": pa.array([np.float16(0.5), None], pa.float16()),
        }
    )
    ds = convert_table(tmp, table)
    rows = {r["id"][0]: r for r in read_examples(ds)}
    assert rows[1] == {"id": [1], "u": [0], "uuid": [b"\x00" * 16], "d64": [10957], "f16": [0.5]}
    assert rows[2] == {"id": [2], "u": [INT64_MAX], "uuid": [b"\xff" * 16]}


@pytest.mark.parametrize("layout", ["blocks", "rows"])
def test_null_elements_of_fixed_size_lists_are_quarantined_never_filled(tmp, layout):
    # Written as the type's zero, they read back as values the file does not hold.
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4, 5]),
            "i": pa.array([[1, 2], [3, None], [5, 6], [7, 8], [9, 10]], pa.list_(pa.int64(), 2)),
            "f": pa.array([[0.5], [1.5], [None], [3.5], [4.5]], pa.list_(pa.float64(), 1)),
            "s": pa.array([["a", "b"], ["c", "d"], ["e", "f"], [None, "h"], ["i", "j"]], pa.list_(pa.string(), 2)),
        }
    )
    ds = convert_table(tmp, table, "--layout", layout, "--max_bad_fraction", "0.7")
    kept = sorted(read_examples(ds), key=lambda r: r["id"][0])
    assert [r["id"] for r in kept] == [[1], [5]]
    assert kept[1]["i"] == [9, 10] and kept[1]["f"] == [4.5] and kept[1]["s"] == [b"i", b"j"]
    bad = {q["row"]: q for q in quarantine_lines(ds)}
    assert set(bad) == {2, 3, 4} and all(q["kind"] == "type" for q in bad.values())
    assert re.search(r"column 'i': element 2 of 2 of its list is null.*must not contain null", bad[2]["reason"])
    assert re.search(r"column 'f': element 1 of 1 .*--columns", bad[3]["reason"])
    assert re.search(r"column 's': element 1 of 2 ", bad[4]["reason"])
    info = contract.DatasetInfo.from_json(open(os.path.join(ds, "dataset_info.json")).read())
    assert info.statistics.of(None)["i"].min == 1  # over the kept rows only: no stored zero


def test_null_elements_of_lists_are_quarantined_naming_file_row_and_column(tmp):
    # The default conversion failed in its statistics with "cannot convert float NaN to integer".
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4]),
            "tags": pa.array([[1, 2, 3], [4, None], [], None], pa.list_(pa.int32())),
            "words": pa.array([["a"], ["b"], ["c", "d", None], ["e"]], pa.large_list(pa.string())),
        }
    )
    ds = convert_table(tmp, table, "--max_bad_fraction", "0.5")
    kept = sorted(read_examples(ds), key=lambda r: r["id"][0])
    assert [r["id"] for r in kept] == [[1], [4]] and kept[0]["tags"] == [1, 2, 3] and "tags" not in kept[1]
    bad = {q["row"]: q for q in quarantine_lines(ds)}
    assert set(bad) == {2, 3} and all(q["source"].endswith("a.parquet") for q in bad.values())
    assert re.search(r"^column 'tags': element 2 of its list is null.*must not contain null", bad[2]["reason"])
    assert re.search(r"^column 'words': element 3 of its list is null", bad[3]["reason"])
    with pytest.raises(ConversionError, match=r"a\.parquet.*column 'tags': element 2 of its list is null"):
        convert_table(tmp, table, "--overwrite")


def test_a_column_name_a_file_repeats_is_refused_naming_the_file(tmp):
    # Arrow's own error ('Field "a" exists 2 times in schema') named neither file nor fix.
    table = pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4]), pa.array([5, 6])], names=["a", "b", "a"])
    with pytest.raises(
        ValueError, match=r"input file .*a\.parquet has column\(s\) \['a'\] more than once.*--columns b"
    ):
        convert_table(tmp, table)
    convert_table(tmp, table, "--columns", "b")
    assert sorted(r["b"][0] for r in read_examples(tmp / "ds")) == [3, 4]


def _string_column(values) -> pa.Array:
    """A Parquet `string` column holding these bytes as they are: Arrow's writers do not
    check that a string column's bytes are UTF-8 (nor do pandas' or Spark's, from bytes)."""
    data = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(data), data.buffers())


def test_invalid_utf8_in_a_string_column_is_quarantined_and_a_later_schema_from_job_runs(tmp):
    # It was counted into the column's vocabulary as 'caf\udce9', which no later
    # --schema_from job could encode ('surrogates not allowed', naming no file or feature).
    table = pa.table(
        {
            "id": pa.array(range(6)),
            "city": _string_column([b"Paris", b"caf\xe9", b"Paris", b"Lyon", None, b"Nice"]),
            "tags": pa.ListArray.from_arrays(
                pa.array([0, 1, 2, 3, 4, 6, 7], pa.int32()),
                _string_column([b"a", b"b", b"c", b"d", b"ok", b"\xff\xfe", b"e"]),
            ),
        }
    )
    ds = convert_table(tmp, table, "--max_bad_fraction", "0.5")
    bad = {q["row"]: q for q in quarantine_lines(ds)}
    assert set(bad) == {2, 5} and all(q["kind"] == "utf8" and q["source"].endswith("a.parquet") for q in bad.values())
    assert re.search(
        r"column 'city': b'caf\\xe9' is not valid UTF-8 \(byte 0xe9 at offset 3\).*write the text as UTF-8",
        bad[2]["reason"],
    )
    assert "column 'tags'" in bad[5]["reason"] and "caf" in bad[2]["raw"]
    info = ingest.load_info(ds)
    assert info.vocabulary("city") == ("Paris", "Nice", "Lyon")
    assert sorted(r["id"][0] for r in read_examples(ds)) == [0, 2, 3, 5] and info.quarantine["records"] == 2
    pq.write_table(table.slice(0, 1), tmp / "day2.parquet")
    day2 = run_convert(
        "--source", "parquet", "--input", tmp / "day2.parquet", "--output", tmp / "day2", "--schema_from", ds
    )
    assert day2.split("train").records == 1
