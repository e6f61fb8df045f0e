"""Parquet -> TFRecord conversion: every supported Arrow type, nulls, lists, errors."""

from __future__ import annotations

import datetime
import math
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jobs.convert import ConversionError
from tests.conftest import read_examples, run_convert

T0 = datetime.datetime(2024, 5, 17, 12, 30, 0)


def _table():
    return pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "i8": pa.array([-128, None, 127], pa.int8()),
            "u32": pa.array([0, 4_000_000_000, None], pa.uint32()),
            "f64": pa.array([1.25, None, -3.5], pa.float64()),
            "flag": pa.array([True, False, None], pa.bool_()),
            "name": pa.array(["ä", None, ""], pa.string()),
            "blob": pa.array([b"\x00\xff", b"", None], pa.binary()),
            "ints": pa.array([[1, 2], [], None], pa.list_(pa.int64())),
            "floats": pa.array([[0.5], [1.5, 2.5, 3.5], []], pa.large_list(pa.float32())),
            "words": pa.array([["a", "bb"], None, ["c"]], pa.list_(pa.string())),
            "xyz": pa.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], pa.list_(pa.float32(), 3)),
            "when": pa.array([T0, None, T0 + datetime.timedelta(seconds=1)], pa.timestamp("ms")),
            "day": pa.array([datetime.date(1970, 1, 2), None, datetime.date(2000, 1, 1)], pa.date32()),
            "color": pa.array(["red", "blue", None]).dictionary_encode(),
        }
    )


def test_parquet_round_trip_of_every_supported_type(tmp):
    os.makedirs(tmp / "in")
    pq.write_table(_table(), tmp / "in" / "a.parquet", row_group_size=2)
    info = run_convert("--source", "parquet", "--input", tmp / "in" / "a.parquet", "--output", tmp / "out")
    spec = {f.name: (f.dtype, f.shape) for f in info.features}
    assert spec == {
        "id": ("int64", ()),
        "i8": ("int64", ()),
        "u32": ("int64", ()),
        "f64": ("float32", ()),
        "flag": ("int64", ()),
        "name": ("bytes", ()),
        "blob": ("bytes", ()),
        "ints": ("int64", (None,)),
        "floats": ("float32", (None,)),
        "words": ("bytes", (None,)),
        "xyz": ("float32", (3,)),
        "when": ("int64", ()),
        "day": ("int64", ()),
        "color": ("bytes", ()),
    }
    assert info.feature("blob").text is False and info.feature("name").text is True
    assert info.feature("floats").min_length == 0 and info.feature("floats").max_length == 3
    assert info.feature("i8").missing == 1 and info.feature("ints").missing == 1
    rows = {r["id"][0]: r for r in read_examples(tmp / "out")}
    epoch_us = int((T0 - datetime.datetime(1970, 1, 1)).total_seconds() * 1_000_000)
    assert rows[1] == {
        "id": [1],
        "i8": [-128],
        "u32": [0],
        "f64": [1.25],
        "flag": [1],
        "name": ["ä".encode()],
        "blob": [b"\x00\xff"],
        "ints": [1, 2],
        "floats": [0.5],
        "words": [b"a", b"bb"],
        "xyz": [1.0, 2.0, 3.0],
        "when": [epoch_us],
        "day": [1],
        "color": [b"red"],
    }
    # Nulls are absent features; empty lists stay present and empty.
    assert set(rows[2]) == {
        "id",
        "u32",
        "flag",
        "blob",
        "ints",
        "floats",
        "xyz",
        "color",
    }  # xyz: no nulls (pyarrow cannot read back null fixed-size lists across row groups)
    assert rows[2]["u32"] == [4_000_000_000] and rows[2]["ints"] == [] and rows[2]["blob"] == [b""]
    assert rows[3]["floats"] == [] and rows[3]["when"] == [epoch_us + 1_000_000] and rows[3]["day"] == [10957]


def test_struct_column_is_rejected_naming_column_and_type(tmp):
    os.makedirs(tmp / "in")
    table = pa.table({"id": [1], "s": pa.array([{"a": 1}], pa.struct([("a", pa.int64())]))})
    pq.write_table(table, tmp / "in" / "a.parquet")
    with pytest.raises(ValueError, match=r"column 's' has unsupported type struct<a: int64>.*--columns"):
        run_convert("--source", "parquet", "--input", tmp / "in" / "a.parquet", "--output", tmp / "out")
    info = run_convert(
        "--source", "parquet", "--input", tmp / "in" / "a.parquet", "--output", tmp / "out", "--columns", "id"
    )
    assert [f.name for f in info.features] == ["id"]


def test_parquet_files_with_different_types_name_the_file(tmp):
    os.makedirs(tmp / "in")
    pq.write_table(pa.table({"x": pa.array([1], pa.int64())}), tmp / "in" / "a.parquet")
    pq.write_table(pa.table({"x": pa.array(["s"])}), tmp / "in" / "b.parquet")
    with pytest.raises(ConversionError, match=r"b\.parquet has column types .*bytes.*first file .*a\.parquet"):
        run_convert("--source", "parquet", "--input", tmp / "in" / "*.parquet", "--output", tmp / "out")


def test_parquet_multi_file_counts_and_label(tmp):
    os.makedirs(tmp / "in")
    for i in range(3):
        pq.write_table(
            pa.table(
                {
                    "x": pa.array([float(j) for j in range(i * 100, i * 100 + 100)]),
                    "y": pa.array([j % 3 for j in range(100)]),
                }
            ),
            tmp / "in" / f"p{i}.parquet",
        )
    info = run_convert(
        "--source",
        "parquet",
        "--input",
        tmp / "in" / "*.parquet",
        "--output",
        tmp / "out",
        "--label",
        "y",
        "--num_shards",
        "2",
    )
    assert info.split("train").records == 300 and len(info.split("train").shards) == 2
    xs = sorted(r["x"][0] for r in read_examples(tmp / "out"))
    assert xs == [float(j) for j in range(300)]
    assert not any(math.isnan(x) for x in xs)
