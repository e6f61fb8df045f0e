"""ingest.preprocessing: feature_space's numbers without Keras, for PyTorch, JAX and numpy models."""

import numpy as np
import pyarrow as pa
import pytest

import ingest
from tests.conftest import convert_table

ROWS = 400


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(9)
    x = rng.normal(5, 2, ROWS)
    table = pa.table(
        {
            "x": pa.array([None if i % 10 == 0 else float(v) for i, v in enumerate(x)], pa.float32()),
            "n": rng.integers(0, 1000, ROWS),
            "city": [f"c{i % 12}" for i in range(ROWS)],
            "w": [None if i % 8 == 0 else ["ant", "bee", "bee", "cow"][i % 4] for i in range(ROWS)],
            "tags": pa.array([[1] * (i % 3) for i in range(ROWS)], pa.list_(pa.int64())),
            "y": [["cat", "dog", "emu"][i % 3] for i in range(ROWS)],
        }
    )
    return convert_table(tmp_path_factory.mktemp("pre"), table, "--label", "y")


def _with_masks(features: dict) -> dict:
    """The batch with make_dataset(missing="mask")'s masks, where the loader does not yield
    them itself: x is never 0.0 and w never "" (or id 0) but where a record lacked it."""
    out = dict(features)
    if "x" in features:
        out.setdefault("x_missing", features["x"] == 0)
    if "w" in features:
        out.setdefault("w_missing", features["w"] == (0 if features["w"].dtype.kind == "i" else b""))
    return out


@pytest.mark.parametrize("missing", ["mask", "fill"])
def test_the_numbers_are_feature_spaces(dataset, missing):
    keras = pytest.importorskip("keras")
    pre = ingest.preprocessing(dataset, missing=missing)
    space = ingest.feature_space(
        dataset,
        features={"x": "float_normalized", "n": "float_normalized", "city": "string_categorical"},
        missing=missing,
    )
    for name in ("x", "n"):
        layer = space.preprocessors[name]
        mean, std = pre.numbers[name]
        assert mean == pytest.approx(float(layer.adapt_mean.numpy()[0]), rel=1e-6)
        assert std**2 == pytest.approx(float(layer.adapt_variance.numpy()[0]), rel=1e-5)
    assert isinstance(space.preprocessors["city"], keras.layers.StringLookup)
    assert (
        pre.vocabulary_sizes
        == {"city": space.preprocessors["city"].vocabulary_size(), "w": 4}
        == {
            "city": 13,
            "w": 4,
        }
    )
    assert pre.classes == ("cat", "dog", "emu")
    assert pre.missing == {"x": ROWS // 10, "w": ROWS // 8}
    assert set(pre.left_out) == {"tags"}
    if missing == "mask":
        assert pre.imputed["x"] == space.missing["x"] == pre.numbers["x"][0]
    else:
        assert pre.imputed == space.missing == {}


def test_it_standardizes_numpy_and_torch_batches_alike(dataset):
    torch = pytest.importorskip("torch")
    pre = ingest.preprocessing(dataset, features=["x", "n"])
    with ingest.loader(dataset, batch_size=ROWS, processes=0, seed=1, features=["x", "n"]) as loader:
        features, _ = next(iter(loader))
    features = _with_masks(features)
    m = pre.matrix(features)
    assert m.shape == (ROWS, 3) and m.dtype == np.float32  # x, n, then x's missing indicator
    lacked = features["x_missing"]
    present = features["x"][~lacked]
    mean, std = pre.numbers["x"]
    # The numbers are those of the values present; a missing x is the mean, 0 once standardized.
    assert mean == pytest.approx(present.mean(), rel=1e-5) and std == pytest.approx(present.std(), rel=1e-4)
    np.testing.assert_allclose(m[:, 0], np.where(lacked, 0.0, (features["x"] - mean) / std), atol=1e-6)
    assert (m[lacked, 0] == 0).all()  # the mean, standardized: 0 exactly, as feature_space gives
    np.testing.assert_array_equal(m[:, 2], lacked.astype(np.float32))
    assert lacked.sum() == ROWS // 10
    t = pre.matrix({k: torch.from_numpy(v) for k, v in features.items()})
    np.testing.assert_allclose(t.numpy(), m, rtol=1e-6, atol=1e-6)  # float32 rounding near 0
    assert "standardized" in pre.summary and "40 rows missing: imputed with" in pre.summary
    # missing="fill": the filled column standardized over every row: mean 0, std 1, as adapt() gives.
    filled = ingest.preprocessing(dataset, features=["x", "n"], missing="fill").matrix(features)
    assert filled.shape == (ROWS, 2) and abs(filled[:, 0].mean()) < 1e-4 and abs(filled[:, 0].std() - 1) < 1e-4


def test_its_matrix_is_feature_spaces_concatenation(dataset):
    pytest.importorskip("keras")
    space = ingest.feature_space(dataset, features={"x": "float_normalized"})
    pre = ingest.preprocessing(dataset, features=["x"])
    with ingest.loader(dataset, batch_size=ROWS, processes=0, seed=1, features=["x"]) as loader:
        features = _with_masks(next(iter(loader))[0])
    np.testing.assert_allclose(np.asarray(space(features)), pre.matrix(features), rtol=1e-5, atol=1e-6)


def test_missing_text_read_as_ids_is_the_most_frequent_id_and_indicated(dataset):
    pre = ingest.preprocessing(dataset, features=["w"])
    with ingest.loader(dataset, batch_size=ROWS, processes=0, seed=1, features=["w"], text="ids") as loader:
        ids = _with_masks(next(iter(loader))[0])
    vocabulary = ingest.load_info(dataset).vocabulary("w")
    assert pre.imputed == {"w": vocabulary.index("bee") + 1}  # "bee" is half the values present
    out = pre(ids)
    lacked = ids["w_missing"]
    assert lacked.sum() == ROWS // 8 and (ids["w"][lacked] == 0).all()  # id 0 read where missing
    assert (out["w"][lacked] == vocabulary.index("bee") + 1).all()
    np.testing.assert_array_equal(out["w"][~lacked], ids["w"][~lacked])
    np.testing.assert_array_equal(out["w_missing"], lacked * 1.0)


def test_it_reads_metadata_only_and_names_what_is_wrong(dataset):
    with pytest.raises(ValueError, match=r"features \['nope'\] do not exist"):
        ingest.preprocessing(dataset, features=["nope"])
    with pytest.raises(ValueError, match=r"no statistics for split 'eval'"):
        ingest.preprocessing(dataset, split="eval")
    with pytest.raises(ValueError, match=r"missing must be 'mask' or 'fill'"):
        ingest.preprocessing(dataset, missing="drop")
    pre = ingest.preprocessing(dataset, features=["x"])
    with pytest.raises(ValueError, match=r"feature 'x': the batch has no 'x_missing'.*missing='fill'"):
        pre({"x": np.zeros(3, np.float32)})
