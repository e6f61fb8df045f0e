"""--schema_from DATASET (WriteDataset(schema_from=...)): a schema carried from span to span.

The spans are months of Seattle's daily weather 2012-2015 (`real_csv`): the first half of
2012 is converted with inferred types, and later months with its schema. August 2012 is
the month to watch: not a drop of rain with a fraction all month (precipitation 0.0 every
day, written "0" by an exporter that drops a zero fraction), and neither fog nor snow.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import pathlib
import re
import shutil

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing import test_pipeline

import ingest
from beam_jobs import WriteDataset, convert
from beam_jobs._job_options import RECORDED, JobOptions
from beam_jobs.convert import ConversionError
from beam_jobs.sources import carried_schema, column_types
from tests.conftest import convert_table, quarantine_lines, read_examples, real_csv, run_convert, write_text

_COLUMNS = ["date", "precipitation", "temp_max", "temp_min", "wind", "weather"]
_CLASSES = ("drizzle", "fog", "rain", "snow", "sun")  # the weather of January to July 2012, sorted


def _days(first: str, last: str) -> list:
    """The days of the months `first` to `last` ("2012/01"), as the CSV has them."""
    with open(real_csv("seattle-weather.csv"), newline="") as f:
        return [row for row in csv.DictReader(f) if first <= row["date"][:7] <= last]


def _span(path, days: list, *, whole_numbers=(), columns=_COLUMNS) -> str:
    """Writes `days` as a CSV of `columns` (a column no day has is left empty); the
    `whole_numbers` columns as an exporter that drops a zero fraction writes them ("0")."""
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        out.writeheader()
        for day in days:
            day = dict(day)
            for name in whole_numbers:
                if float(day[name]).is_integer():
                    day[name] = str(int(float(day[name])))
            out.writerow(day)
    return str(path)


def _csv(src, out, *args) -> ingest.DatasetInfo:
    return run_convert("--source", "csv", "--input", src, "--output", out, *args)


def _schema(info) -> list:
    """What a span must share with the others: each feature's name, dtype, shape, default, text, role."""
    return [(f.name, f.dtype, f.shape, f.default, f.text, f.role) for f in info.features]


@pytest.fixture(scope="module")
def first_span(tmp_path_factory) -> str:
    """January to July 2012, types and classes inferred: the schema later spans carry."""
    root = tmp_path_factory.mktemp("first")
    days = _days("2012/01", "2012/07")
    assert tuple(sorted({d["weather"] for d in days})) == _CLASSES
    _csv(_span(root / "in.csv", days), root / "ds", "--label", "weather")
    return str(root / "ds")


def _august() -> list:
    days = _days("2012/08", "2012/08")
    assert len(days) == 31 and all(float(d["precipitation"]) == 0 for d in days)
    assert {d["weather"] for d in days} == {"drizzle", "rain", "sun"}
    return days


def test_a_month_of_whole_numbers_keeps_the_first_spans_types_classes_and_order(tmp, first_span):
    src = _span(tmp / "aug.csv", _august(), whole_numbers=["precipitation"])
    info = _csv(src, tmp / "aug", "--schema_from", first_span)  # no --label: the schema's
    first = ingest.load_info(first_span)
    assert [f.name for f in first.features] == _COLUMNS and first.feature("precipitation").dtype == "float32"
    assert _schema(info) == _schema(first)
    assert (info.label, info.labels) == ("weather", _CLASSES) == (first.label, first.labels)
    rows = read_examples(tmp / "aug")
    assert len(rows) == 31 and info.quarantine["records"] == 0
    assert all(type(r["precipitation"][0]) is float and r["precipitation"] == [0.0] for r in rows)
    # The metadata records where the schema came from: the dataset and the job that wrote it.
    assert info.options["schema_from"] == first_span and info.source["schema"] == "carried"
    assert info.source["schema_from"] == {"dataset": first_span, "job": first.source["job"]}
    # A third span carries it on, from the second: the chain is traced job by job.
    sep = _csv(_span(tmp / "sep.csv", _days("2012/09", "2012/09")), tmp / "sep", "--schema_from", tmp / "aug")
    assert _schema(sep) == _schema(first) and sep.labels == _CLASSES
    assert sep.source["schema_from"] == {"dataset": str(tmp / "aug"), "job": info.source["job"]}


def _label_ids(dataset) -> dict:
    """{date: the label id make_dataset yields} of every row."""
    features, labels = next(iter(ingest.make_dataset(str(dataset), batch_size=256, shuffle=False)))
    return dict(zip((d.decode() for d in features["date"].numpy()), labels.numpy().tolist()))


@pytest.mark.slow
def test_inferred_spans_disagree_where_carried_ones_agree(tmp, first_span):
    src = _span(tmp / "aug.csv", _august(), whole_numbers=["precipitation"])
    inferred = _csv(src, tmp / "inferred", "--label", "weather")
    carried = _csv(src, tmp / "carried", "--schema_from", first_span)
    # Inferred from August alone: its whole numbers are int64, its three classes renumbered.
    assert inferred.feature("precipitation").dtype == "int64" and inferred.labels == ("drizzle", "rain", "sun")
    assert carried.feature("precipitation").dtype == "float32" and carried.labels == _CLASSES
    # So a rainy day is class 1 inferred, but class 2 ("rain" in the first span) carried.
    rainy = next(d["date"] for d in _august() if d["weather"] == "rain")
    assert _label_ids(tmp / "inferred")[rainy] == 1
    assert _label_ids(tmp / "carried")[rainy] == 2 == _label_ids(first_span)["2012/01/02"]  # a rainy day
    # The runtime reads carried spans as one, and refuses inferred ones, naming what differs.
    both = ingest.load_info([first_span, str(tmp / "carried")])
    assert both.split("train").records == 213 + 31 and both.labels == _CLASSES
    features, labels = next(iter(ingest.make_dataset([first_span, str(tmp / "carried")], batch_size=300)))
    assert features["precipitation"].dtype.name == "float32" and labels.shape == (244,)
    with pytest.raises(
        ValueError,
        match=r"feature .precipitation. is int64 scalar, default 0 in .*inferred but float32 scalar.*--schema_from",
    ):
        ingest.load_info([first_span, str(tmp / "inferred")])


def test_values_that_do_not_fit_the_carried_schema_are_quarantined_with_a_reason(tmp, first_span):
    days = _august()
    days[3]["precipitation"] = "16777217"  # an integer float32 cannot hold exactly
    days[5]["weather"] = "hail"  # none of the first span's classes
    days[7]["temp_max"] = "warm"
    src = _span(tmp / "aug.csv", days)
    info = _csv(src, tmp / "aug", "--schema_from", first_span, "--max_bad_fraction", "0.2")
    bad = {q["row"]: q for q in quarantine_lines(tmp / "aug")}
    assert sorted(bad) == [5, 7, 9] and {q["source"] for q in bad.values()} == {src}  # the header is row 1
    assert bad[5]["kind"] == "type"
    assert (
        bad[5]["reason"]
        == f"column 'precipitation': '16777217' is not exact in float32, its type in --schema_from {first_span}"
    )
    assert bad[7]["kind"] == "unknown_label" and bad[7]["reason"].startswith(
        f"label column 'weather': 'hail' is not one of the classes of --schema_from {first_span}: {list(_CLASSES)}"
    )
    assert bad[9]["kind"] == "type" and bad[9]["reason"].startswith("column 'temp_max': 'warm' is not a valid float32")
    assert "hail" in bad[7]["raw"] and info.quarantine["records"] == 3 and info.split("train").records == 28
    assert info.labels == _CLASSES  # hail got no class of its own


def test_a_fraction_in_a_carried_int64_column_is_quarantined_and_ints_fill_a_float32_one(tmp):
    first = _csv(write_text(tmp / "d1.csv", "id,count,level\n1,3,1.5\n2,4,2.25\n"), tmp / "d1")
    assert [(f.name, f.dtype) for f in first.features] == [("id", "int64"), ("count", "int64"), ("level", "float32")]
    src = write_text(tmp / "d2.csv", "id,count,level\n3,2.5,1\n4,5,2\n5,6,\n")
    with pytest.raises(
        Exception, match=r"1 of 3 rows .* Fix the input, start a new schema \(convert without --schema_from\), or"
    ):
        _csv(src, tmp / "d2", "--schema_from", tmp / "d1")  # the --column hint would be refused here
    info = _csv(src, tmp / "d2", "--schema_from", tmp / "d1", "--max_bad_fraction", "0.5", "--layout", "rows")
    (bad,) = quarantine_lines(tmp / "d2")
    assert (bad["source"], bad["row"], bad["kind"]) == (src, 2, "type")
    assert bad["reason"] == f"column 'count': '2.5' is not a valid int64, its type in --schema_from {tmp / 'd1'}"
    assert _schema(info) == _schema(first)
    rows = sorted(read_examples(tmp / "d2"), key=lambda r: r["id"])
    assert rows == [
        {"id": [4], "count": [5], "level": [2.0]},
        {"id": [5], "count": [6]},
    ]  # a missing value stays missing


def test_parquet_columns_are_fitted_to_the_carried_types(tmp):
    first = pa.table(
        {
            "id": pa.array(range(6), pa.int64()),
            "x": pa.array([0.5] * 6, pa.float64()),
            "v": pa.array([[0.5]] * 6, pa.list_(pa.float64())),
            "pair": pa.array([[1, 2]] * 6, pa.list_(pa.int64(), 2)),
            "name": pa.array(["a"] * 6),
        }
    )
    schema = ingest.load_info(convert_table(tmp / "d1", first))
    assert [(f.dtype, f.shape) for f in schema.features][1:4] == [
        ("float32", ()),
        ("float32", (None,)),
        ("int64", (2,)),
    ]
    # The next day's writer stored whole numbers as integers, and the pairs as plain lists.
    second = pa.table(
        {
            "x": pa.array([1, 2, 16777217, 4, 5, None], pa.int64()),
            "id": pa.array(range(10, 16), pa.int32()),
            "v": pa.array([[1], [2, 3], [], [4], None, [5]], pa.list_(pa.int64())),
            "pair": pa.array([[1, 2], [3], [4, 5], [6, 7], [8, 9], None], pa.list_(pa.int64())),
            "name": pa.array(["b"] * 6),
        }
    )
    day = convert_table(tmp / "d2", second, "--schema_from", tmp / "d1" / "ds", "--max_bad_fraction", "0.5")
    info = ingest.load_info(day)
    assert _schema(info) == _schema(schema) and [f.name for f in info.features] == ["id", "x", "v", "pair", "name"]
    bad = {q["row"]: q["reason"] for q in quarantine_lines(day)}
    dataset = re.escape(str(tmp / "d1" / "ds"))
    assert sorted(bad) == [2, 3]  # Parquet rows count from 1
    assert re.fullmatch(
        rf"column 'pair': \[3\] holds 1 value, but its type in --schema_from {dataset} is lists of 2 int64", bad[2]
    )
    assert re.fullmatch(rf"column 'x': 16777217 is not exact in float32, its type in --schema_from {dataset}", bad[3])
    rows = {r["id"][0]: r for r in read_examples(day)}
    assert sorted(rows) == [10, 13, 14, 15]
    assert rows[10] == {"id": [10], "x": [1.0], "v": [1.0], "pair": [1, 2], "name": [b"b"]}
    assert type(rows[13]["x"][0]) is float and rows[13]["v"] == [4.0] and "v" not in rows[14]
    assert "pair" not in rows[15] and "x" not in rows[15]


def test_fit_column_refuses_what_is_not_the_carried_type_value_by_value():
    def fit(values, arrow_type, want):
        arr = pa.array(values, arrow_type)
        dtype, shape, canonical = column_types.canonical_arrow_column(arr, "c")
        return carried_schema.fit_column(canonical, "c", (dtype, shape), want, dataset="DS")

    out, bad = fit([2.5, None, 3.0], pa.float64(), ("int64", ()))  # a float is no int64, whole or not
    assert out.type == pa.int64() and out.null_count == 3
    assert bad == [
        (0, "column 'c': 2.5 is float32, but its type in --schema_from DS is int64"),
        (2, "column 'c': 3.0 is float32, but its type in --schema_from DS is int64"),
    ]
    out, bad = fit([[1, 2], None], pa.list_(pa.int64()), ("int64", ()))
    assert bad == [(0, "column 'c': [1, 2] is lists of int64, but its type in --schema_from DS is int64")]
    out, bad = fit([7, -(2**24), 2**40, 2**24 + 1], pa.int64(), ("float32", ()))
    assert out.to_pylist() == [7.0, -16777216.0, 2.0**40, None] and [i for i, _ in bad] == [3]
    out, bad = fit([[1, 2], None], pa.list_(pa.int64(), 2), ("int64", (None,)))  # lists of k are lists
    assert out.type == pa.large_list(pa.int64()) and out.to_pylist() == [[1, 2], None] and not bad
    out, bad = fit([b"x"], pa.binary(), ("bytes", ()))  # text and binary are both bytes
    assert out.to_pylist() == [b"x"] and not bad


def test_inexact_integers_are_found_in_text_as_the_inference_counts_them():
    cells = pa.array([b"16777217", b"16777217.0", b"16777216", b"1.6777217e7", b" 16777219 ", None, b"2.5"])
    f32, bad = column_types.convert_text_column(cells, "float32")
    assert not bad.any()
    # An integer (or one with a zero fraction) float32 rounds; not a number in exponent form.
    assert column_types.inexact_integers(cells, f32).tolist() == [True, True, False, False, True, False, False]
    exact, bad = column_types.convert_text_column(cells, "float32", exact_integers=True)
    assert bad.tolist() == [True, True, False, False, True, False, False] and exact.to_pylist()[2:4] == [2**24] * 2
    assert column_types.bad_cell_reason("16777217", "float32") == "'16777217' is not exact in float32"
    inferred = column_types.count_types(pa.record_batch([cells], names=["c"]))["c"]
    assert inferred.inexact == 3  # the same three make an inferred column text


def test_a_feature_the_input_lacks_is_an_error_naming_it(tmp, first_span):
    src = _span(tmp / "aug.csv", _august(), columns=[c for c in _COLUMNS if c != "wind"])
    with pytest.raises(
        ConversionError,
        match=rf"--input {re.escape(src)} lacks column\(s\) \['wind'\], feature\(s\) of --schema_from "
        rf"{re.escape(first_span)} \(its features: \[.*\]\)",
    ):
        _csv(src, tmp / "aug", "--schema_from", first_span)
    assert not os.path.exists(tmp / "aug")
    with pytest.raises(ConversionError, match=r"--columns leaves out column\(s\) \['wind'\].*add them to --columns"):
        _csv(
            _span(tmp / "all.csv", _august()),
            tmp / "aug",
            "--schema_from",
            first_span,
            "--columns",
            "date,precipitation,temp_max,temp_min,weather",
        )


def test_a_column_the_schema_lacks_is_an_error_and_columns_leaves_it_out(tmp, first_span):
    days = [{**d, "humidity": "80"} for d in _august()]
    src = _span(tmp / "aug.csv", days, columns=["humidity", *_COLUMNS])
    with pytest.raises(
        ConversionError,
        match=rf"--input {re.escape(src)} has column\(s\) \['humidity'\] that --schema_from {re.escape(first_span)} "
        r"lacks \(its features: .*\): leave them out with --columns date,precipitation,temp_max,temp_min,wind,weather",
    ):
        _csv(src, tmp / "aug", "--schema_from", first_span)
    # --columns leaves it out; in any order, the features keep the schema's.
    info = _csv(
        src, tmp / "aug", "--schema_from", first_span, "--columns", "weather,wind,date,precipitation,temp_max,temp_min"
    )
    assert _schema(info) == _schema(ingest.load_info(first_span)) and "humidity" not in read_examples(tmp / "aug")[0]


def test_a_label_other_than_the_schemas_is_an_error_naming_both(tmp, first_span):
    src = _span(tmp / "aug.csv", _august())
    with pytest.raises(
        ConversionError,
        match=rf"--label 'wind' disagrees with --schema_from {re.escape(first_span)}, whose label is 'weather'",
    ):
        _csv(src, tmp / "aug", "--schema_from", first_span, "--label", "wind")
    assert _csv(src, tmp / "aug", "--schema_from", first_span, "--label", "weather").label == "weather"


def test_a_missing_or_broken_schema_dataset_is_one_clear_error(tmp, capsys):
    src = write_text(tmp / "a.csv", "a,b\n1,2\n")
    nowhere = str(tmp / "nowhere")
    assert (
        convert.main(["--source", "csv", "--input", src, "--output", str(tmp / "out"), "--schema_from", nowhere]) == 1
    )
    assert capsys.readouterr().err == (
        f"error: --schema_from {nowhere} is not a converted dataset: it has no dataset_info.json (a conversion that "
        "did not finish writes none); name the directory of a dataset converted before\n"
    )
    assert not os.path.exists(tmp / "out")
    with pytest.raises(
        ConversionError, match=r"names a metadata file: name its dataset's directory, --schema_from .*first$"
    ):
        _csv(src, tmp / "out", "--schema_from", tmp / "first" / "dataset_info.json")
    write_text(tmp / "broken" / "dataset_info.json", '{"format_version": 2, "features": [')
    with pytest.raises(
        ConversionError,
        match=r"--schema_from .*broken: its dataset_info.json is not valid: it is not valid JSON \(cut short\?\)",
    ):
        _csv(src, tmp / "out", "--schema_from", tmp / "broken")
    with pytest.raises(ConversionError, match=r"--schema_from .*nowhere is not a converted dataset"):
        WriteDataset(str(tmp / "out"), schema_from=nowhere)  # at construction, before any pipeline runs
    assert not os.path.exists(tmp / "out")


def test_a_class_listed_twice_in_hand_edited_labels_is_refused_naming_the_file_and_class(tmp, first_span):
    edited = str(tmp / "edited")
    shutil.copytree(first_span, edited)
    meta = os.path.join(edited, "dataset_info.json")
    info = json.loads(open(meta).read())
    assert info["labels"] == list(_CLASSES)
    info["labels"] = ["drizzle", "fog", "rain", "Snow", "sun", "fog"]  # a class added by hand, one twice
    open(meta, "w").write(json.dumps(info))
    what = r"metadata.labels lists class\(es\) \['fog'\] more than once \(at positions \[1, 5\] for 'fog'\)"
    with pytest.raises(ValueError, match=rf"{re.escape(meta)} is not usable dataset metadata: {what}"):
        ingest.load_info(edited)
    # --schema_from would carry them to every later span: refused before any row is read.
    src = _span(tmp / "aug.csv", _august())
    with pytest.raises(ConversionError, match=rf"--schema_from {re.escape(edited)}: .*{what}"):
        _csv(src, tmp / "aug", "--schema_from", edited)
    assert not os.path.exists(tmp / "aug")


@pytest.mark.slow
def test_a_schema_on_gcs_is_carried_and_one_gcs_refuses_names_the_role(tmp, capsys, monkeypatch):
    from tests.gcs import GcsEmulator  # a real GCS server on loopback

    emulator = GcsEmulator(str(tmp))
    try:
        for k, v in emulator.env().items():
            monkeypatch.setenv(k, v)
        emulator.client().create_bucket("bkt")
        # (The first gs:// job of a process waits ~20 s while Beam looks for credentials.)
        days = _span(tmp / "first.csv", _days("2012/01", "2012/07"))
        first = _csv(days, "gs://bkt/spans/first", "--label", "weather")
        src = _span(tmp / "aug.csv", _august(), whole_numbers=["precipitation"])
        info = _csv(src, tmp / "aug", "--schema_from", "gs://bkt/spans/first/")
        assert _schema(info) == _schema(first) and info.labels == _CLASSES
        assert info.source["schema_from"] == {"dataset": "gs://bkt/spans/first", "job": first.source["job"]}
        with pytest.raises(ConversionError, match=r"--schema_from gs://bkt/spans/none is not a converted dataset"):
            _csv(src, tmp / "none", "--schema_from", "gs://bkt/spans/none")
        # IAM is not emulated: the relay answers 403 for this bucket, as GCS would.
        argv = ["--source", "csv", "--input", src, "--output", str(tmp / "refused")]
        argv += ["--schema_from", "gs://forbidden/d"]
        assert convert.main(argv) == 1
        (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert error.startswith("error: permission denied on --schema_from gs://forbidden/d/dataset_info.json: 403")
        assert "roles/storage.objectViewer on the bucket of the dataset whose schema it carries" in error
        assert not (tmp / "refused").exists()
    finally:
        emulator.stop()


def test_options_that_conflict_with_a_carried_schema_are_refused(tmp, first_span):
    src = _span(tmp / "aug.csv", _august())
    with pytest.raises(
        ConversionError, match=r"--column gives column types, and --schema_from .* gives every column's type: use one"
    ):
        _csv(src, tmp / "o", "--schema_from", first_span, "--column", "precipitation:float32")
    photos = tmp / "photos" / "cat"
    photos.mkdir(parents=True)
    with pytest.raises(
        ConversionError, match=r"--schema_from applies to --source csv and parquet .*not --source images"
    ):
        run_convert("--source", "images", "--input", tmp / "photos", "--output", tmp / "o", "--schema_from", first_span)
    lists = convert_table(tmp / "lists", pa.table({"a": [1, 2], "v": pa.array([[0.5], []], pa.list_(pa.float64()))}))
    with pytest.raises(
        ConversionError, match=r"has list features \{'v': 'lists of float32'\}, but a CSV cell holds one value"
    ):
        _csv(write_text(tmp / "l.csv", "a,v\n1,2\n"), tmp / "o", "--schema_from", lists)
    assert not os.path.exists(tmp / "o")


def _write(rows, out, **kwargs) -> ingest.DatasetInfo:
    with test_pipeline.TestPipeline() as p:
        _ = p | beam.Create(rows, reshuffle=False) | WriteDataset(str(out), **kwargs)
    return ingest.load_info(str(out))


def test_write_dataset_carries_the_schema_of_a_csv_span(tmp, first_span):
    # As from a database: numbers as numbers, August's whole precipitation as Python ints.
    rows = [
        {
            "date": d["date"],
            "precipitation": int(float(d["precipitation"])),
            "temp_max": float(d["temp_max"]),
            "temp_min": float(d["temp_min"]),
            "wind": float(d["wind"]),
            "weather": d["weather"],
        }
        for d in _august()
    ]
    rows[0]["weather"] = "hail"
    rows[1]["wind"] = "gusty"
    info = _write(rows, tmp / "rows", schema_from=first_span, max_bad_fraction=0.1)
    first = ingest.load_info(first_span)
    assert _schema(info) == _schema(first) and (info.label, info.labels) == ("weather", _CLASSES)
    assert info.options["schema_from"] == first_span and info.source["schema_from"]["job"] == first.source["job"]
    reasons = sorted(q["reason"] for q in quarantine_lines(tmp / "rows"))
    assert len(reasons) == 2 and reasons[0].startswith("column 'wind': 'gusty' is text, but the column holds float32")
    assert reasons[1].startswith("label column 'weather': 'hail' is not one of the classes")
    got = read_examples(tmp / "rows")
    assert len(got) == 29 and all(r["precipitation"] == [0.0] and type(r["precipitation"][0]) is float for r in got)
    # Columns are the schema's, or the job stops naming the odd one.
    with pytest.raises(Exception, match=r"the input of WriteDataset has column\(s\) \['humidity'\] that --schema_from"):
        _write([{**r, "humidity": 80} for r in rows[2:]], tmp / "extra", schema_from=first_span)
    with pytest.raises(ConversionError, match=r"--label 'wind' disagrees with --schema_from"):
        WriteDataset(str(tmp / "x"), schema_from=first_span, label="wind")


def test_write_dataset_fits_lists_to_a_carried_fixed_length(tmp):
    table = pa.table({"id": [1, 2], "pair": pa.array([[1.5, 2.5], [3.0, 4.0]], pa.list_(pa.float64(), 2))})
    schema = convert_table(tmp / "d1", table)
    rows = [
        {"id": 3, "pair": [1, 2]},
        {"id": 4, "pair": [1.5, 2.5, 3.5]},
        {"id": 5, "pair": None},
        {"id": 6, "pair": [7, 8]},
    ]
    info = _write(rows, tmp / "rows", schema_from=schema, max_bad_fraction=0.5, layout="rows")
    assert _schema(info) == _schema(ingest.load_info(schema)) and info.feature("pair").shape == (2,)
    (bad,) = quarantine_lines(tmp / "rows")
    assert bad["reason"].startswith(
        "column 'pair': [1.5, 2.5, 3.5] holds 3 values, but the column holds lists of 2 float32"
    )
    got = {r["id"][0]: r for r in read_examples(tmp / "rows")}
    assert got == {3: {"id": [3], "pair": [1.0, 2.0]}, 5: {"id": [5]}, 6: {"id": [6], "pair": [7.0, 8.0]}}


@pytest.mark.parametrize("layout", ["blocks", "rows"])
def test_missing_values_take_the_carried_default(tmp, first_span, layout):
    shutil.copytree(first_span, tmp / "first")
    meta = json.loads((tmp / "first" / "dataset_info.json").read_text())
    next(f for f in meta["features"] if f["name"] == "temp_min")["default"] = -99.0  # a hand-set default
    (tmp / "first" / "dataset_info.json").write_text(json.dumps(meta))
    days = _august()
    days[0]["temp_min"] = days[1]["temp_min"] = ""
    info = _csv(_span(tmp / "aug.csv", days), tmp / "aug", "--schema_from", tmp / "first", "--layout", layout)
    assert info.feature("temp_min").default == -99.0 and info.feature("temp_min").missing == 2
    features = next(iter(ingest.make_dataset(str(tmp / "aug"), batch_size=64, shuffle=False, label=False)))
    temp_min = dict(zip((d.decode() for d in features["date"].numpy()), features["temp_min"].numpy().tolist()))
    assert temp_min["2012/08/01"] == temp_min["2012/08/02"] == -99.0
    assert temp_min["2012/08/03"] == pytest.approx(float(days[2]["temp_min"]))


def test_schema_from_is_one_declared_option_of_the_cli_and_write_dataset():
    argv = ["--source", "csv", "--input", "x.csv", "--output", "out", "--schema_from", "gs://b/day1/"]
    from_cli = JobOptions.from_args(convert.build_parser().parse_args(argv))
    assert from_cli.schema_from == JobOptions.of_keywords("out", schema_from="gs://b/day1").schema_from == "gs://b/day1"
    assert JobOptions.of_keywords("out", schema_from=pathlib.Path("/data/day1")).schema_from == "/data/day1"
    assert "schema_from" in RECORDED and "schema_from" in JobOptions.keywords()
    with pytest.raises(ConversionError, match=r"--schema_from must name a converted dataset's directory"):
        JobOptions.of_keywords("out", schema_from="/")


def test_a_span_laid_out_otherwise_than_its_schema_is_warned_of(tmp, first_span, caplog):
    src = _span(tmp / "aug.csv", _august())
    with caplog.at_level(logging.WARNING, logger="beam_jobs._config"):
        _csv(src, tmp / "same", "--schema_from", first_span)
    assert "make_dataset will not read them" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="beam_jobs._config"):
        _csv(src, tmp / "rows", "--schema_from", first_span, "--layout", "rows")
    assert re.search(
        r"written with --layout blocks --block_rows 1024 --compression none, this span with "
        r"--layout rows --compression none: make_dataset will not read them as one",
        caplog.text,
    )


def test_the_schemas_splits_are_carried_unless_splits_is_given(tmp):
    # Without them a later span was silently train-only, and failed only when its eval split was read.
    _csv(_span(tmp / "jan.csv", _days("2012/01", "2012/03")), tmp / "first", "--splits", "train=0.75,eval=0.25")
    span = _span(tmp / "aug.csv", _august())
    info = _csv(span, tmp / "carried", "--schema_from", tmp / "first")
    assert info.options["splits"] == {"train": 0.75, "eval": 0.25}
    assert [s.name for s in info.splits] == ["train", "eval"] and all(s.records > 0 for s in info.splits)
    assert len(read_examples(tmp / "carried", "eval")) + len(read_examples(tmp / "carried")) == 31
    info = _csv(span, tmp / "given", "--schema_from", tmp / "first", "--splits", "train=1.0")
    assert [s.name for s in info.splits] == ["train"] and info.options["splits"] == {"train": 1.0}
    # WriteDataset's keyword is the same declared option.
    numbers = ("precipitation", "temp_max", "temp_min", "wind")
    rows = [{c: float(d[c]) if c in numbers else d[c] for c in _COLUMNS} for d in _august()]
    assert [s.name for s in _write(rows, tmp / "written", schema_from=str(tmp / "first")).splits] == ["train", "eval"]


def _users(path, day: int) -> str:
    """A day of 40 users' events, 3 each: `user`, `day`, `v`."""
    return write_text(path, "user,day,v\n" + "".join(f"u{i % 40},{day},{i}\n" for i in range(120)))


def _users_by_split(dataset) -> dict:
    return {s: {r["user"][0] for r in read_examples(dataset, s)} for s in ("train", "eval")}


def test_the_schemas_split_key_is_carried_unless_split_key_is_given(tmp):
    # Without it day 2 split by the record: every user in both train and eval of the spans read together.
    _csv(_users(tmp / "d1.csv", 1), tmp / "day1", "--splits", "train=0.5,eval=0.5", "--split_key", "user")
    day2 = _users(tmp / "d2.csv", 2)
    info = _csv(day2, tmp / "day2", "--schema_from", tmp / "day1")
    assert info.options["split_key"] == "user"
    days = [_users_by_split(tmp / "day1"), _users_by_split(tmp / "day2")]
    assert days[0] == days[1] and days[1]["train"] and days[1]["eval"] and not days[1]["train"] & days[1]["eval"]
    # WriteDataset's keyword is the same declared option, carried the same way.
    rows = [{"user": f"u{i % 40}", "day": 3, "v": i} for i in range(120)]
    assert _write(rows, tmp / "day3", schema_from=str(tmp / "day1")).options["split_key"] == "user"
    assert _users_by_split(tmp / "day3") == days[0]
    # Given, it overrides: another column, or '' for the record content (a user in both splits).
    assert _csv(day2, tmp / "by_v", "--schema_from", tmp / "day1", "--split_key", "v").options["split_key"] == "v"
    info = _csv(day2, tmp / "by_record", "--schema_from", tmp / "day1", "--split_key", "")
    by_record = _users_by_split(tmp / "by_record")
    assert info.options["split_key"] is None and by_record["train"] & by_record["eval"]
