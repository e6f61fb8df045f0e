"""`ingest.feature_space` against `FeatureSpace.adapt` on the same data, and `ingest describe`."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from keras.utils import FeatureSpace

import ingest
from ingest import __main__ as cli
from tests.conftest import convert_table

ROWS = 20_000


def _table(rows: int = ROWS, *, missing: bool, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)

    def mask():
        return rng.random(rows) < 0.1 if missing else None

    words = np.array(["sun", "moon", "star", "comet", "nova", ""], dtype=object)
    return pa.table(
        {
            "price": pa.array(rng.lognormal(3, 1, rows).astype(np.float32), mask=mask()),
            "count": pa.array(rng.integers(0, 1000, rows), mask=mask()),  # int64 into float normalization
            "city": pa.array(words[rng.integers(0, len(words), rows)], pa.string(), mask=mask()),
            "level": pa.array(rng.integers(1, 6, rows), mask=mask()),
            "y": pa.array(rng.integers(0, 2, rows)),
        }
    )


def _specs():
    return {
        "price": FeatureSpace.float_normalized(),
        "count": FeatureSpace.float_normalized(),
        "city": FeatureSpace.string_categorical(),
        "level": FeatureSpace.integer_categorical(),
    }


def _adapted_on_the_dataset(path: str, output_mode: str):
    space = FeatureSpace(features=_specs(), output_mode=output_mode)
    ds = ingest.make_dataset(path, batch_size=1024, split="train", num_epochs=1, shuffle=False)
    space.adapt(ds.map(lambda x, y: {k: x[k] for k in _specs()}))
    return space


@pytest.fixture(scope="module", params=[False, True], ids=["complete", "with-missing"])
def dataset(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("fs")
    return convert_table(root, _table(missing=request.param), "--label", "y", "--splits", "train=0.8,eval=0.2")


def test_outputs_equal_those_of_adapt_on_the_same_data(dataset):
    ours = ingest.feature_space(dataset, features=_specs(), output_mode="dict")
    theirs = _adapted_on_the_dataset(dataset, "dict")
    x, _ = next(iter(ingest.make_dataset(dataset, batch_size=512, split="eval", num_epochs=1)))
    batch = {k: x[k] for k in _specs()}
    a, b = ours(batch), theirs(batch)
    for name in ("price", "count"):
        assert np.abs(a[name].numpy() - b[name].numpy()).max() <= 1e-4 * max(1.0, np.abs(b[name].numpy()).max())
    for name in ("city", "level"):
        assert ours.preprocessors[name].get_vocabulary() == theirs.preprocessors[name].get_vocabulary()
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())


def test_concat_output_and_max_tokens_follow_keras(dataset):
    specs = {"city": FeatureSpace.string_categorical(max_tokens=3), "price": FeatureSpace.float_normalized()}
    ours = ingest.feature_space(dataset, features=specs)
    theirs = FeatureSpace(
        features={"city": FeatureSpace.string_categorical(max_tokens=3), "price": FeatureSpace.float_normalized()}
    )
    ds = ingest.make_dataset(dataset, batch_size=1024, split="train", num_epochs=1, shuffle=False)
    theirs.adapt(ds.map(lambda x, y: {k: x[k] for k in specs}))
    assert ours.preprocessors["city"].get_vocabulary() == theirs.preprocessors["city"].get_vocabulary()
    x, _ = next(iter(ds))
    batch = {k: x[k] for k in specs}
    np.testing.assert_allclose(ours(batch).numpy(), theirs(batch).numpy(), atol=1e-4)


def test_default_specs_come_from_schema_and_statistics(dataset):
    space = ingest.feature_space(dataset, output_mode="dict")
    assert set(space.features) == {"price", "count", "city", "level"}  # not the label
    assert type(space.preprocessors["city"]).__name__ == "StringLookup"
    assert type(space.preprocessors["level"]).__name__ == "IntegerLookup"
    assert type(space.preprocessors["count"]).__name__ == "Normalization"  # 1000 values: a number
    x, _ = next(iter(ingest.make_dataset(dataset, batch_size=64, split="train", num_epochs=1)))
    out = space({k: x[k] for k in space.features})
    assert out["city"].shape == (64, 7) and out["count"].shape == (64, 1)  # 6 words + out-of-vocabulary


def test_the_summary_shows_each_features_spec_and_width_and_a_spec_overrides_it(dataset, capsys):
    space = ingest.feature_space(dataset, summary=True)
    table = capsys.readouterr().out
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table.splitlines()[2:]}
    # Levels 1-5, and 0 where a record has none (make_dataset fills the default); one more for unknowns.
    levels = 5 + (ingest.load_info(dataset).statistics.feature("level", "train").missing > 0)
    assert rows["level"] == [str(levels), "integer_categorical", str(levels + 1), "at most 100 values: one-hot |"]
    assert rows["count"][1:] == ["float_normalized", "1", "more than 100 values: a number |"]
    assert rows["city"][1:3] == ["string_categorical", "7"] and rows["price"][:3] == [
        "not counted",
        "float_normalized",
        "1",
    ]
    # The widths add up to what the space outputs.
    x, _ = next(iter(ingest.make_dataset(dataset, batch_size=4, split="train", num_epochs=1)))
    width = space({k: x[k] for k in space.features}).shape[-1]
    assert rows["total (4 features)"][2] == str(width) == str(1 + 1 + 7 + levels + 1)
    # The spec column is what features= takes: one changed, the rest as picked.
    specs = {name: row[1] for name, row in rows.items() if not name.startswith("total")}
    other = ingest.feature_space(dataset, features={**specs, "level": "float_normalized"}, summary=True)
    assert f"| level | {levels} | float_normalized | 1 | given |" in capsys.readouterr().out
    assert other({k: x[k] for k in other.features}).shape[-1] == width - levels


def test_discretization_boundaries_split_the_training_values_evenly(dataset):
    space = ingest.feature_space(dataset, features={"price": FeatureSpace.float_discretized(num_bins=4)})
    ds = ingest.make_dataset(dataset, batch_size=4096, split="train", num_epochs=1)
    price = np.concatenate([x["price"].numpy() for x, _ in ds])
    bins = np.asarray(space({"price": tf.constant(price)})).argmax(-1)
    share = np.bincount(bins, minlength=4) / len(price)
    missing = ingest.load_info(dataset).statistics.feature("price", "train").missing / len(price)
    # Missing prices are filled with 0.0, all in the first bin; the rest split evenly.
    np.testing.assert_allclose(share, [0.25 * (1 - missing) + missing] + [0.25 * (1 - missing)] * 3, atol=0.02)


def test_errors_name_the_problem(dataset):
    with pytest.raises(ValueError, match=r"no statistics for split 'test'"):
        ingest.feature_space(dataset, features=_specs(), split="test")
    with pytest.raises(ValueError, match=r"feature 'nope' is not a feature of .*features: \['price'"):
        ingest.feature_space(dataset, features={"nope": FeatureSpace.float_normalized()})


def test_a_misspelt_feature_or_type_name_is_answered_with_the_nearest(dataset):
    with pytest.raises(ValueError, match=r"feature 'prise' \(did you mean 'price'\?\) is not a feature of"):
        ingest.feature_space(dataset, features={"prise": FeatureSpace.float_normalized()})
    types = "float, float_normalized, float_rescaled, float_discretized, integer_categorical, integer_hashed, "
    with pytest.raises(
        ValueError,
        match=rf"feature 'price': 'float_normalised' \(did you mean 'float_normalized'\?\) is not a FeatureSpace "
        rf"type; the types: {types}string_categorical, string_hashed$",
    ):
        ingest.feature_space(dataset, features={"price": "float_normalised"})
    # The names Keras takes are those listed: each builds.
    space = ingest.feature_space(dataset, features={"price": "float_normalized", "city": "string_categorical"})
    assert type(space.preprocessors["city"]).__name__ == "StringLookup"


def test_a_spec_of_the_wrong_kind_names_the_feature(dataset):
    with pytest.raises(
        ValueError, match=r"feature 'city' holds text values, but its FeatureSpace spec .*Normalization"
    ):
        ingest.feature_space(dataset, features={"city": FeatureSpace.float_normalized()})
    with pytest.raises(ValueError, match=r"feature 'price' holds float32 values, .*StringLookup, which takes text"):
        ingest.feature_space(dataset, features={"price": FeatureSpace.string_categorical()})


def test_default_specs_leave_out_a_number_column_without_values_naming_it(tmp, caplog):
    import logging

    rng = np.random.default_rng(1)
    table = pa.table(
        {
            "x": rng.random(500),
            "empty": pa.array([None] * 500, pa.float64()),
            "y": rng.integers(0, 2, 500),
        }
    )
    path = convert_table(tmp, table, "--label", "y")
    with caplog.at_level(logging.WARNING, logger="ingest._feature_space"):
        space = ingest.feature_space(path)
    assert list(space.features) == ["x"] and "'empty' is left out of the FeatureSpace" in caplog.text


# --- describe -------------------------------------------------------------------------------


def test_describe_prints_features_label_per_split_and_quarantine(dataset, capsys, tmp_path):
    png = tmp_path / "stats.png"
    assert cli.main(["describe", dataset, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    info = ingest.load_info(dataset)
    for name in ("price", "count", "city", "level", "y (label)"):
        assert f"| {name} |" in out
    assert "Label 'y' per split:" in out and "| label | train | eval |" in out
    train = info.statistics.feature("y", "train")
    zero = next(t.count for t in train.top if t.value == 0)
    assert f"{zero:,} ({100 * zero / train.count:.1f}%)" in out
    assert "Quarantine: 0 records" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote" in out and "(5 features)" in out


def test_describe_one_split_and_a_bad_split_fails_in_one_line(dataset, capsys):
    assert cli.main(["describe", dataset, "--split", "eval"]) == 0
    out = capsys.readouterr().out
    eval_price = ingest.load_info(dataset).statistics.feature("price", "eval")
    assert "Features (split 'eval'):" in out and f"{eval_price.mean:,.4g}" in out
    assert cli.main(["describe", dataset, "--split", "nope"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no statistics for split 'nope'")


def test_describe_of_one_split_shows_that_split_s_labels_only(dataset, capsys):
    assert cli.main(["describe", dataset, "--split", "eval"]) == 0
    out = capsys.readouterr().out
    assert "Label 'y' in split 'eval':" in out and "| label | eval |" in out
    assert "| label | train" not in out and "per split" not in out


def test_describe_of_an_empty_split_says_it_is_empty(tmp, capsys):
    path = convert_table(tmp, _table(5, missing=False), "--label", "y", "--splits", "train=0.999,eval=0.001")
    assert ingest.load_info(path).split("eval").records == 0  # what the test is about
    assert cli.main(["describe", path, "--split", "eval"]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"Split 'eval' is empty: the conversion put 0 records in it.*Splits with records: train \(5\)", out
    )
    assert "| feature |" not in out and "| label |" not in out


def test_describe_shows_the_quarantine(tmp):
    table = _table(2000, missing=False)
    labels = table.column("y").to_pylist()
    labels[5] = None  # a row without a label is quarantined
    table = table.set_column(table.schema.get_field_index("y"), "y", pa.array(labels))
    path = convert_table(tmp, table, "--label", "y")
    from ingest import _describe

    text = _describe.describe(ingest.load_info(path), path)
    assert "Quarantine: 1 records (missing_label 1)" in text


def test_describe_histograms_keep_point_masses():
    from ingest import _describe
    from ingest.statistics import FeatureStatistics

    rng = np.random.default_rng(0)
    values = np.where(rng.random(100_000) < 0.82, 0.0, rng.uniform(1, 100, 100_000))  # 82% zeros
    q = tuple(np.quantile(values, np.linspace(0, 1, 101)))
    edges, share = _describe._histogram(FeatureStatistics(count=len(values), missing=0, quantiles=q))
    truth = np.histogram(values, edges)[0] / len(values)
    assert share.sum() == pytest.approx(1.0)
    assert share[0] == pytest.approx(truth[0], abs=0.02) and share[0] > 0.8
    assert np.abs(share - truth).max() < 0.02
    # A constant column is one bar.
    edges, share = _describe._histogram(FeatureStatistics(count=5, missing=0, quantiles=(3.0,) * 101))
    assert share.tolist() == [1.0]


@pytest.mark.parametrize(
    "part, total, shown",
    [(0, 5, "0%"), (1, 3, "33.3%"), (1, 10_000, "0.01%"), (1, 30_000, "0.004%"), (1, 1000, "0.1%"), (4, 4, "100%")]
    + [(9999, 10_000, "99.9%"), (1, 0, "")],
)
def test_small_shares_are_not_printed_as_zero(part, total, shown):
    from ingest import _describe

    assert _describe.percent(part, total) == shown
