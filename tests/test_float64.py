"""float64 end to end (#47): a column float32 would change is stored as float64 and read back exactly.

The expected values come from pandas and pyarrow reading the same input, never from ingest.
"""

from __future__ import annotations

import json
import math
import os
import re

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from apache_beam.testing.test_pipeline import TestPipeline

import ingest
from beam_jobs import WriteDataset
from ingest import __main__ as cli
from ingest import contract
from tests.conftest import read_examples, run_convert, write_text

ROWS = 300
LAYOUTS = ["blocks", "rows"]


def _money_csv(path, rows: int = ROWS, *, seed: int = 3) -> str:
    """id, price (cents up to a billion: float32 keeps ~7 digits), ratio (quarters: float32
    keeps them), word (text), y; every 17th price missing."""
    rng = np.random.default_rng(seed)
    lines = ["id,price,ratio,word,y"]
    for i in range(rows):
        price = "123456789.12" if i == 0 else f"{rng.integers(0, 10**9)}.{rng.integers(0, 100):02d}"
        lines.append(f"{i},{'' if i % 17 == 5 else price},{rng.integers(-8, 8) / 4},w{i % 5},{i % 3}")
    return write_text(path, "\n".join(lines) + "\n")


def _convert_csv(src, out, *args) -> contract.DatasetInfo:
    return run_convert("--source", "csv", "--input", src, "--output", out, *args)


@pytest.fixture(scope="module")
def money(tmp_path_factory):
    root = tmp_path_factory.mktemp("money")
    src = _money_csv(root / "in" / "a.csv")
    for layout in LAYOUTS:
        extra = ("--block_rows", "32", "--num_shards", "2") if layout == "blocks" else ()
        _convert_csv(src, root / layout, "--layout", layout, *extra)
    return root, src


def _expected(src) -> pd.DataFrame:
    return pd.read_csv(src).set_index("id")


def _all_rows(path, **kw) -> dict:
    """{name: numpy array} of every row of the train split, in one batch."""
    ds = ingest.make_dataset(path, batch_size=10 * ROWS, num_epochs=1, shuffle=False, label=False, **kw)
    (batch,) = list(ds)
    return batch


@pytest.mark.parametrize("layout", LAYOUTS)
def test_csv_decimals_float32_would_change_are_float64_and_read_back_exactly(money, layout):
    root, src = money
    info = ingest.load_info(str(root / layout))
    assert {f.name: f.dtype for f in info.features} == {
        "id": "int64",
        "price": "float64",  # 123456789.12 as float32 is 123456792
        "ratio": "float32",  # quarters: float32 keeps them, so the column stays float32
        "word": "bytes",
        "y": "int64",
    }
    assert info.format_version == contract.FLOAT64_SINCE
    batch = _all_rows(str(root / layout))
    assert batch["price"].dtype == tf.float64 and batch["ratio"].dtype == tf.float32
    want = _expected(src)
    got = dict(zip(batch["id"].numpy().tolist(), batch["price"].numpy().tolist()))
    assert got[0] == 123456789.12
    for i, price in want["price"].items():
        assert got[i] == (0.0 if math.isnan(price) else price), i  # a missing price: the default, 0.0
    ratios = dict(zip(batch["id"].numpy().tolist(), batch["ratio"].numpy().tolist()))
    assert ratios == want["ratio"].to_dict()
    # The format spec's reader (tests/conftest.py) decodes the stored bit patterns alike.
    spec = {r["id"][0]: r.get("price") for r in read_examples(str(root / layout))}
    assert spec[0] == [123456789.12] and spec[5] is None


# Over 5 s on a busy 2-core machine (a two-worker run, 2026-12-03): the slow tier.
@pytest.mark.slow
def test_shuffled_seekable_text_ids_and_span_reads_keep_float64(money, tmp):
    root, src = money
    blocks = str(root / "blocks")
    want = {i: (0.0 if math.isnan(p) else p) for i, p in _expected(src)["price"].items()}
    ds = ingest.make_dataset(blocks, batch_size=50, num_epochs=1, shuffle=True, seed=7, label=False)
    pairs = [(i, p) for b in ds for i, p in zip(b["id"].numpy().tolist(), b["price"].numpy().tolist())]
    assert sorted(pairs) == sorted(want.items())
    assert [i for i, _ in pairs] != sorted(i for i, _ in pairs)  # it was shuffled
    ids = _all_rows(blocks, text="ids")
    assert ids["word"].dtype == tf.int64 and ids["price"].dtype == tf.float64
    # A later day carried by --schema_from: prices float32 would keep stay float64.
    day2 = write_text(tmp / "day2.csv", "id,price,ratio,word,y\n1000,1.5,0.25,w1,0\n1001,2.25,0.5,w2,1\n")
    info = _convert_csv(day2, tmp / "day2", "--schema_from", blocks, "--block_rows", "32")
    assert info.feature("price").dtype == "float64"
    span = ingest.make_dataset([blocks, str(tmp / "day2")], batch_size=1000, num_epochs=1, label=False)
    (batch,) = list(span)
    got = dict(zip(batch["id"].numpy().tolist(), batch["price"].numpy().tolist()))
    assert batch["price"].dtype == tf.float64 and got[1000] == 1.5 and got[0] == 123456789.12


def _doubles_table(rows: int = ROWS) -> pa.Table:
    rng = np.random.default_rng(11)
    d = rng.normal(size=rows) * 1e3  # ~16 significant digits: float32 changes them
    return pa.table(
        {
            "id": np.arange(rows),
            "d": pa.array(d, mask=np.arange(rows) % 13 == 4),
            "kept": pa.array(np.resize([0.5, 0.1, -2.25, 1e-3, 7.0], rows)),  # doubles float32 keeps
            "f32": rng.normal(size=rows).astype(np.float32),  # a Parquet float stays float32
            "vl": pa.array([rng.normal(size=i % 4).tolist() for i in range(rows)], pa.list_(pa.float64())),
            "fx": pa.array([rng.normal(size=2).tolist() for _ in range(rows)], pa.list_(pa.float64(), 2)),
        }
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_parquet_doubles_float32_would_change_are_float64_and_read_back_exactly(tmp, layout):
    table = _doubles_table()
    os.makedirs(tmp / "in")
    pq.write_table(table, tmp / "in" / "a.parquet")
    info = run_convert(
        "--source", "parquet", "--input", tmp / "in" / "a.parquet", "--output", tmp / "ds", "--layout", layout
    )
    assert {f.name: (f.dtype, f.shape) for f in info.features} == {
        "id": ("int64", ()),
        "d": ("float64", ()),
        "kept": ("float32", ()),
        "f32": ("float32", ()),
        "vl": ("float64", (None,)),
        "fx": ("float64", (2,)),
    }
    batch = _all_rows(str(tmp / "ds"))
    assert {k: v.dtype for k, v in batch.items() if k != "id"} == {
        "d": tf.float64,
        "d_missing": tf.bool,
        "kept": tf.float32,
        "f32": tf.float32,
        "vl": tf.float64,
        "fx": tf.float64,
    }
    order = batch["id"].numpy()
    want = table.to_pydict()
    assert batch["d"].numpy().tolist() == [0.0 if want["d"][i] is None else want["d"][i] for i in order]
    assert batch["d_missing"].numpy().tolist() == [want["d"][i] is None for i in order]
    assert batch["vl"].to_list() == [want["vl"][i] for i in order]
    assert batch["fx"].numpy().tolist() == [want["fx"][i] for i in order]
    assert batch["f32"].numpy().tolist() == table["f32"].to_numpy()[order].tolist()
    padded = _all_rows(str(tmp / "ds"), pad_lengths={"vl": 3}, features=["id", "vl"])
    assert padded["vl"].dtype == tf.float64 and padded["vl"].shape == (ROWS, 3)
    assert padded["vl"].numpy().tolist() == [want["vl"][i] + [0.0] * (3 - len(want["vl"][i])) for i in order]


def test_encode_record_batch_stores_doubles_float32_would_change_as_bit_patterns():
    from beam_jobs import encode_record_batch

    batch = pa.record_batch({"money": [123456789.12, -0.0, float("nan")], "kept": [0.5, 0.1, 2.0]})
    buf, offsets = encode_record_batch(batch)
    records = [bytes(buf[offsets[i] : offsets[i + 1]]) for i in range(3)]
    spec = {"money": tf.io.FixedLenFeature([], tf.int64), "kept": tf.io.FixedLenFeature([], tf.float32)}
    parsed = tf.io.parse_example(records, spec)
    money = tf.bitcast(parsed["money"], tf.float64).numpy()
    assert money[0] == 123456789.12 and math.copysign(1, money[1]) == -1 and math.isnan(money[2])
    assert parsed["kept"].numpy().tolist() == [0.5, np.float32(0.1), 2.0]


def test_column_flag_float64_stores_exactly_and_a_given_float32_warns_how_much_it_changed(money, tmp):
    root, src = money
    info = _convert_csv(src, tmp / "wide", "--column", "ratio:float64", "--column", "y:double")
    assert info.feature("ratio").dtype == "float64" and info.feature("y").dtype == "float64"
    batch = _all_rows(str(tmp / "wide"))
    assert batch["y"].dtype == tf.float64 and sorted(set(batch["y"].numpy().tolist())) == [0.0, 1.0, 2.0]
    info = _convert_csv(src, tmp / "narrow", "--column", "price:float32")
    assert info.feature("price").dtype == "float32"
    prices = _expected(src)["price"].dropna().to_numpy()
    changes = np.abs(prices - prices.astype(np.float32).astype(np.float64))
    (warning,) = [w for w in info.warnings if "'price'" in w]
    n, largest = re.search(r"float32 changed ([\d,]+) values?, the largest by (\S+) ", warning).groups()
    assert int(n.replace(",", "")) == int(np.count_nonzero(changes)) and float(largest) == pytest.approx(changes.max())
    assert "--column price:float64" in warning
    # The same prices as float32 and as float64: compared as numbers, not as a schema change.
    row = next(r for r in ingest.compare(str(root / "blocks"), str(tmp / "narrow")).rows if r.feature == "price")
    assert row.kind == "numeric" and not row.drifted and "dtype float64 -> float32" in row.note


def test_unknown_column_type_names_the_float_types(money, tmp):
    _, src = money
    with pytest.raises(ValueError, match=r"unknown type 'float128'; use one of int64, float32, float64"):
        _convert_csv(src, tmp / "x", "--column", "price:float128")


def test_statistics_describe_and_drift_of_a_float64_feature(money, capsys):
    root, src = money
    prices = _expected(src)["price"].dropna()
    info = ingest.load_info(str(root / "blocks"))
    s = info.statistics.overall["price"]
    assert s.max == prices.max() and s.min == prices.min()  # exact: the stored values are the input's
    assert s.mean == pytest.approx(prices.mean(), rel=1e-12) and s.missing == ROWS - len(prices)
    assert cli.main(["describe", str(root / "blocks")]) == 0
    assert re.search(r"\| price \| float64 \|", capsys.readouterr().out)
    report = ingest.compare(str(root / "blocks"), str(root / "rows"))
    row = next(r for r in report.rows if r.feature == "price")
    assert row.kind == "numeric" and row.distance == pytest.approx(0.0, abs=1e-9) and not row.drifted


def test_feature_space_and_preprocessing_normalize_a_float64_feature(money):
    root, _ = money
    blocks = str(root / "blocks")
    batch = _all_rows(blocks)
    # missing="fill": the defaults counted in, as adapt() on the filled batches would.
    space = ingest.feature_space(blocks, features={"price": "float_normalized"}, output_mode="dict", missing="fill")
    out = space({"price": batch["price"]})["price"].numpy()
    assert np.isfinite(out).all() and abs(out.mean()) < 1e-3 and out.std() == pytest.approx(1.0, rel=1e-3)
    # The default, missing="mask": imputed where the mask says, the rest normalized as float64 reads.
    masked = ingest.feature_space(blocks, features={"price": "float_normalized"}, output_mode="dict")
    out = masked(batch)["price"].numpy()
    assert np.isfinite(out).all() and (out[batch["price_missing"].numpy()] == 0).all()
    pre = ingest.preprocessing(blocks, features=["price"], missing="fill")
    mean, std = pre.numbers["price"]
    values = batch["price"].numpy()  # the missing ones are the default, as the batches hold them
    assert mean == pytest.approx(values.mean(), rel=1e-9) and std == pytest.approx(values.std(), rel=1e-6)
    assert pre.matrix({"price": values}).dtype == np.float32


# A worker process: over 5 s on a busy 2-core machine (the template imports TensorFlow).
@pytest.mark.parametrize("processes", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_the_loader_gives_numpy_float64(money, processes):
    root, _ = money
    blocks = str(root / "blocks")
    want = _all_rows(blocks)
    kw = dict(batch_size=10 * ROWS, num_epochs=1, shuffle=False, label=False, features=["id", "price"])
    with ingest.loader(blocks, processes=processes, **kw) as loader:
        (batch,) = list(loader)
    assert batch["price"].dtype == np.float64
    assert batch["price"].tolist() == want["price"].numpy().tolist()


def test_write_dataset_stores_python_floats_float32_would_change_as_float64(tmp):
    rows = [{"id": i, "money": 123456789.12 + i, "half": i / 2, "y": i % 2} for i in range(200)]
    with TestPipeline() as p:
        _ = p | beam.Create(rows, reshuffle=False) | WriteDataset(str(tmp / "ds"))
    info = ingest.load_info(str(tmp / "ds"))
    assert info.feature("money").dtype == "float64" and info.feature("half").dtype == "float32"
    batch = _all_rows(str(tmp / "ds"))
    got = dict(zip(batch["id"].numpy().tolist(), batch["money"].numpy().tolist()))
    assert got == {r["id"]: r["money"] for r in rows}


def test_a_float64_feature_in_older_metadata_is_refused(money, tmp):
    root, _ = money
    meta = json.loads((root / "blocks" / "dataset_info.json").read_text())
    meta["format_version"] = 4
    with pytest.raises(ValueError, match=r"float64 feature\(s\) \['price'\] but format_version 4"):
        contract.DatasetInfo.from_json(json.dumps(meta))
    spec = contract.FeatureSpec("x", "float64", missing=1, default=float("nan"))
    assert json.loads(json.dumps(spec.to_json()))["default"] == "NaN"
    assert math.isnan(contract.FeatureSpec.from_json(spec.to_json()).default)


def test_doubles_into_a_carried_float32_are_stored_with_a_warning_and_out_of_range_ones_quarantined(tmp):
    os.makedirs(tmp / "day1")
    os.makedirs(tmp / "day2")
    pq.write_table(pa.table({"x": [0.5, 0.25, 1.0]}), tmp / "day1" / "a.parquet")
    first = run_convert("--source", "parquet", "--input", tmp / "day1" / "a.parquet", "--output", tmp / "ds1")
    assert first.feature("x").dtype == "float32" and not first.warnings
    values = [123456789.12, 0.5, 1e300, 0.1]
    pq.write_table(pa.table({"x": values}), tmp / "day2" / "a.parquet")
    args = ("--source", "parquet", "--input", tmp / "day2" / "a.parquet", "--output", tmp / "ds2")
    info = run_convert(*args, "--schema_from", tmp / "ds1", "--max_bad_fraction", "0.5")
    assert info.feature("x").dtype == "float32" and info.quarantine["records"] == 1  # 1e300: beyond float32
    (warning,) = info.warnings
    change = abs(123456789.12 - float(np.float32(123456789.12)))  # 0.1 is kept: float32 prints it 0.1
    assert re.match(rf"feature 'x': float32 changed 1 value, the largest by {change:.6g} ", warning)
    with TestPipeline() as p:
        _ = (
            p
            | beam.Create([{"x": 123456789.12}, {"x": 0.5}], reshuffle=False)
            | WriteDataset(str(tmp / "ds3"), schema_from=str(tmp / "ds1"))
        )
    (warning,) = ingest.load_info(str(tmp / "ds3")).warnings
    assert re.match(rf"feature 'x': float32 changed 1 value, the largest by {change:.6g} ", warning)


def test_imputing_a_float64_keeps_its_digits():
    # Before the imputation, a float64 input was cast to float32: 123456789.12 became 123456792.
    from ingest.bridges._space_layer import ImputeMissing

    x = tf.constant([123456789.12, 0.0], tf.float64)
    out = ImputeMissing(2.5)(x, tf.constant([False, True]))
    assert out.dtype == tf.float64 and out.numpy().tolist() == [123456789.12, 2.5]
    ints = ImputeMissing(2.5)(tf.constant([7, 0], tf.int64), tf.constant([False, True]))
    assert ints.dtype == tf.float32 and ints.numpy().tolist() == [7.0, 2.5]
