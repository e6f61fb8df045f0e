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
    # Two masks, each shared by two columns, so that a batch tells which rows lacked a value
    # (`_with_masks`): price is never 0 and level never 0 otherwise.
    numbers, codes = (rng.random(rows) < 0.1, rng.random(rows) < 0.1) if missing else (None, None)
    words = np.array(["sun", "moon", "star", "comet", "nova", ""], dtype=object)
    return pa.table(
        {
            "price": pa.array(rng.lognormal(3, 1, rows).astype(np.float32), mask=numbers),
            "count": pa.array(rng.integers(0, 1000, rows), mask=numbers),  # int64 into float normalization
            "city": pa.array(words[rng.integers(0, len(words), rows)], pa.string(), mask=codes),
            "level": pa.array(rng.integers(1, 6, rows), mask=codes),
            "y": pa.array(rng.integers(0, 2, rows)),
        }
    )


def _with_masks(x: dict) -> dict:
    """The batch with make_dataset(missing="mask")'s masks, where it does not yield them
    itself: `_table`'s price and count lack values in the same rows, city and level too."""
    x = dict(x)
    for name, witness in (("price", "price"), ("count", "price"), ("city", "level"), ("level", "level")):
        x.setdefault(name + "_missing", tf.equal(x[witness], 0))
    return x


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
    # missing="fill": a missing value is the default, as adapt() on the dataset counts it.
    ours = ingest.feature_space(dataset, features=_specs(), output_mode="dict", missing="fill")
    theirs = _adapted_on_the_dataset(dataset, "dict")
    x, _ = next(iter(ingest.make_dataset(dataset, batch_size=512, split="eval", num_epochs=1)))
    batch = {k: x[k] for k in _specs()}
    a, b = ours(batch), theirs(batch)
    assert set(a) == set(b)  # no indicators
    for name in ("price", "count"):
        assert np.abs(a[name].numpy() - b[name].numpy()).max() <= 1e-4 * max(1.0, np.abs(b[name].numpy()).max())
    for name in ("city", "level"):
        assert ours.preprocessors[name].get_vocabulary() == theirs.preprocessors[name].get_vocabulary()
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())


def test_missing_values_are_imputed_from_the_values_present_and_indicated(dataset):
    """As scikit-learn's SimpleImputer(add_indicator=True) fitted on the training rows: the
    mean of the present prices, the most frequent present level; numbers from the data here."""
    train = [_with_masks(x) for x, _ in ingest.make_dataset(dataset, batch_size=4096, split="train", num_epochs=1)]
    col = {k: np.concatenate([np.asarray(x[k]).reshape(-1) for x in train]) for k in train[0]}
    price, lacked = col["price"][~col["price_missing"]], col["price_missing"]
    levels, counts = np.unique(col["level"][~col["level_missing"]], return_counts=True)
    space = ingest.feature_space(dataset, features=_specs(), output_mode="dict")
    assert set(space.missing) == ({"price", "count", "city", "level"} if lacked.any() else set())
    x = _with_masks(next(iter(ingest.make_dataset(dataset, batch_size=512, split="eval", num_epochs=1)))[0])
    out = {k: np.asarray(v) for k, v in space(x).items()}
    mask = np.asarray(x["price_missing"])
    expected = np.where(mask, 0.0, (np.asarray(x["price"]) - price.mean()) / price.std())
    np.testing.assert_allclose(out["price"][:, 0], expected, atol=1e-3)
    vocabulary = space.preprocessors["level"].get_vocabulary()
    assert sorted(vocabulary[1:]) == levels.tolist()  # no 0: the fill is not a level
    top = vocabulary.index(levels[counts.argmax()])
    level_mask = np.asarray(x["level_missing"])
    assert (out["level"][level_mask].argmax(-1) == top).all()
    if lacked.any():
        assert mask.any() and level_mask.any()
        np.testing.assert_array_equal(out["price_missing"][:, 0], mask.astype(np.float32))
        np.testing.assert_array_equal(out["level_missing"][:, 0], level_mask.astype(np.float32))
        # Concatenated, the indicators come after the features, in name order.
        flat = ingest.feature_space(dataset, features=_specs())(x).numpy()
        np.testing.assert_array_equal(flat[:, -4:], np.stack([x[f"{n}_missing"] for n in sorted(_specs())], 1))
    else:
        assert not any(k.endswith("_missing") for k in out)


def test_a_batch_without_the_masks_is_refused_naming_them(dataset):
    space = ingest.feature_space(dataset, features=_specs())
    x, _ = next(iter(ingest.make_dataset(dataset, batch_size=8, split="train", num_epochs=1)))
    x = {k: v for k, v in x.items() if not k.endswith("_missing")}  # as make_dataset(missing="fill") gives
    if not space.missing:
        assert space(dict(x)).shape == (8, 1 + 1 + 7 + 6)
        return
    with pytest.raises(ValueError, match=r"the batch has no \['price_missing', 'count_missing', .*missing='fill'"):
        space(dict(x))


def test_concat_output_and_max_tokens_follow_keras(dataset):
    specs = {"city": FeatureSpace.string_categorical(max_tokens=3), "price": FeatureSpace.float_normalized()}
    ours = ingest.feature_space(dataset, features=specs, missing="fill")
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
    out = space(_with_masks(x))
    assert out["city"].shape == (64, 7) and out["count"].shape == (64, 1)  # 6 words + out-of-vocabulary
    assert ("city_missing" in out) == bool(space.missing)
    # A list of names, as make_dataset takes it: defaults for those.
    some = ingest.feature_space(dataset, features=["level", "price"], output_mode="dict")
    assert list(some.features) == ["price", "level"] and type(some.preprocessors["level"]).__name__ == "IntegerLookup"
    with pytest.raises(ValueError, match=r"feature 'levle' \(did you mean 'level'\?\) is not a feature of"):
        ingest.feature_space(dataset, features=["levle"])


def _rows(table: str) -> dict:
    return {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table.splitlines()[2:]}


def test_the_summary_shows_each_features_spec_and_width_and_a_spec_overrides_it(dataset, capsys):
    space = ingest.feature_space(dataset, summary=True)
    rows = _rows(capsys.readouterr().out)
    lacked = ingest.load_info(dataset).statistics.feature("level", "train").missing
    assert rows["level"] == ["5", "integer_categorical", "6", "5 values (at most 100): one-hot |"]
    assert rows["count"][1:] == ["float_normalized", "1", "1,000 values (more than 100, not an identifier): a number |"]
    assert rows["city"][1:3] == ["string_categorical", "7"] and rows["price"][:3] == [
        "not counted",
        "float_normalized",
        "1",
    ]
    indicators = [name for name in rows if name.endswith("_missing")]
    assert len(indicators) == (4 if lacked else 0)
    if lacked:
        assert rows["level_missing"][:3] == [f"{lacked:,} missing", "indicator", "1"]
        assert rows["level_missing"][3].startswith("imputed with the most frequent value (")
        assert rows["price_missing"][3].startswith("imputed with the mean (")
    # The widths add up to what the space outputs.
    x, _ = next(iter(ingest.make_dataset(dataset, batch_size=4, split="train", num_epochs=1)))
    width = space(_with_masks(x)).shape[-1]
    assert rows["total (4 features)"][2] == str(width) == str(1 + 1 + 7 + 6 + len(indicators))
    # The spec column is what features= takes: one changed, the rest as picked.
    specs = {name: row[1] for name, row in rows.items() if not name.startswith("total") and name not in indicators}
    other = ingest.feature_space(dataset, features={**specs, "level": "float_normalized"}, summary=True)
    assert "| level | 5 | float_normalized | 1 | given |" in capsys.readouterr().out
    assert other(_with_masks(x)).shape[-1] == width - 5
    # missing="fill": the default counted as a value, no indicators (a level 0 where one lacked).
    ingest.feature_space(dataset, summary=True, missing="fill")
    rows = _rows(capsys.readouterr().out)
    assert rows["level"][:3] == [str(5 + (lacked > 0)), "integer_categorical", str(6 + (lacked > 0))]
    assert not any(name.endswith("_missing") for name in rows)


@pytest.mark.parametrize("missing", ["fill", "mask"])
def test_discretization_boundaries_split_the_training_values_evenly(dataset, missing):
    space = ingest.feature_space(
        dataset, features={"price": FeatureSpace.float_discretized(num_bins=4)}, missing=missing, output_mode="dict"
    )
    ds = ingest.make_dataset(dataset, batch_size=4096, split="train", num_epochs=1)
    batches = [_with_masks(x) for x, _ in ds]
    x = {k: tf.concat([b[k] for b in batches], 0) for k in ("price", "price_missing")}
    bins = np.asarray(space(x)["price"]).argmax(-1)
    share = np.bincount(bins, minlength=4) / len(bins)
    lacked = ingest.load_info(dataset).statistics.feature("price", "train").missing / len(bins)
    rest = 0.25 * (1 - lacked)
    if missing == "fill":  # missing prices are 0.0, all in the first bin; the rest split evenly
        np.testing.assert_allclose(share, [rest + lacked, rest, rest, rest], atol=0.02)
    else:  # imputed with the median of the present prices: in the bin above it
        np.testing.assert_allclose(share, [rest, rest, rest + lacked, rest], atol=0.02)


def test_the_space_saves_loads_and_builds_a_model_with_its_masks_and_ids(tmp_path):
    import keras

    rng = np.random.default_rng(5)
    table = _table(3000, missing=True).append_column("user", pa.array(rng.permutation(3000)))
    path = convert_table(tmp_path, table, "--label", "y")
    space = ingest.feature_space(path)
    assert type(space.preprocessors["user"]).__name__ == "Hashing"  # 3,000 values in 3,000 rows: an id
    x = _with_masks(next(iter(ingest.make_dataset(path, batch_size=64, num_epochs=1, shuffle=False)))[0])
    out = space(x)
    assert set(out) == {"concat", "user"} and out["user"].dtype == tf.int64
    space.save(str(tmp_path / "space.keras"))
    back = keras.models.load_model(str(tmp_path / "space.keras"))
    assert back.missing == space.missing and set(back.missing) == {"price", "count", "city", "level"}
    for key, value in back(x).items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(out[key]))
    # Keras' own way to a model: the space's inputs (masks included) to its encoded features.
    encoded = space.get_encoded_features()
    user = keras.layers.Flatten()(keras.layers.Embedding(space.preprocessors["user"].num_bins, 4)(encoded["user"]))
    model = keras.Model(
        space.get_inputs(), keras.layers.Dense(1)(keras.layers.Concatenate()([encoded["concat"], user]))
    )
    assert model({k: x[k] for k in sorted(space.get_inputs())}).shape == (64, 1)
    # One record, as FeatureSpace takes it: each output without the batch dimension.
    one = space({k: v[0] for k, v in x.items()})
    assert one["concat"].shape == out["concat"].shape[1:] and one["user"].shape == (1,)
    np.testing.assert_allclose(one["concat"], out["concat"][0], atol=1e-6)


def _stats(count: int, distinct: int | None, *, exact: bool = True, top: int = 0, mean=None):
    from ingest.statistics import FeatureStatistics, ValueCount

    values = tuple(ValueCount(f"v{i}" if mean is None else i, 1) for i in range(top))
    return FeatureStatistics(
        count=count,
        missing=0,
        distinct=distinct,
        distinct_exact=exact if distinct is not None else None,
        top=values,
        top_exact=exact if top else None,
        mean=mean,
        std=None if mean is None else 1.0,
    )


@pytest.mark.parametrize(
    "dtype, stats, recorded, spec, why",
    [
        # Few values, text or int: one-hot.
        ("text", _stats(900, 6, top=6), 6, "string_categorical", "6 values (at most 100): one-hot"),
        ("int64", _stats(900, 5, top=5, mean=2.0), None, "integer_categorical", "5 values (at most 100): one-hot"),
        # 105 airports, recorded: looked up in the vocabulary, ids for an embedding; no hashing.
        ("text", _stats(9000, 105, top=105), 105, 'string_categorical(output_mode="int")', "105 values recorded"),
        # 26k e-mails with no vocabulary (past the conversion's limit): no fewer bins than values.
        ("text", _stats(30_000, 26_000, exact=False, top=1000), None, 'string_hashed(32768, output_mode="int")', ""),
        ("text", _stats(900, 60, exact=False, top=60), None, "string_hashed(64)", "hashed into 64 bins"),
        # Ints: an identifier when at least half its values are distinct, else a number.
        ("int64", _stats(3000, 3000, top=1000, mean=1.0), None, 'integer_hashed(4096, output_mode="int")', "3,000"),
        ("int64", _stats(800, 500, top=500, mean=1.0), None, 'integer_categorical(output_mode="int")', "looked up"),
        ("int64", _stats(16_000, 1000, top=1000, mean=1.0), None, "float_normalized", "not an identifier"),
        ("int64", _stats(15_000, None, mean=1.0), None, 'integer_hashed(16384, output_mode="int")', "over 10,000"),
        ("int64", _stats(1_000_000, None, mean=1.0), None, "float_normalized", "an id? give it integer_hashed"),
        ("float32", _stats(1_000_000, None, mean=1.0), None, "float_normalized", "a number"),
    ],
)
def test_default_specs_follow_the_stated_rules(dtype, stats, recorded, spec, why):
    from ingest import contract
    from ingest.bridges._feature_space import _pick, _spec_name

    feature = contract.FeatureSpec("f", "bytes" if dtype == "text" else dtype, text=dtype == "text")
    picked, reason = _pick(feature, stats, recorded, False, 32)
    space = FeatureSpace(features={"f": picked})
    assert _spec_name(space.features["f"]) == spec and why in reason


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
    with caplog.at_level(logging.WARNING, logger="ingest.bridges._feature_space"):
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
    from ingest.inspection import _describe

    text = _describe.describe(ingest.load_info(path), path)
    assert "Quarantine: 1 records (missing_label 1)" in text


def test_describe_histograms_keep_point_masses():
    from ingest.inspection import _describe
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
    from ingest.inspection import _describe

    assert _describe.percent(part, total) == shown
