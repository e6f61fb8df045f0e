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
            "tags": pa.array([[1] * (i % 3) for i in range(ROWS)], pa.list_(pa.int64())),
            "y": [["cat", "dog", "emu"][i % 3] for i in range(ROWS)],
        }
    )
    return convert_table(tmp_path_factory.mktemp("pre"), table, "--label", "y")


def test_the_numbers_are_feature_spaces(dataset):
    keras = pytest.importorskip("keras")
    pre = ingest.preprocessing(dataset)
    space = ingest.feature_space(
        dataset, features={"x": "float_normalized", "n": "float_normalized", "city": "string_categorical"}
    )
    for name in ("x", "n"):
        layer = space.preprocessors[name]
        mean, std = pre.numbers[name]
        assert mean == pytest.approx(float(layer.adapt_mean.numpy()[0]), rel=1e-6)
        assert std**2 == pytest.approx(float(layer.adapt_variance.numpy()[0]), rel=1e-5)
    assert isinstance(space.preprocessors["city"], keras.layers.StringLookup)
    assert pre.vocabulary_sizes == {"city": space.preprocessors["city"].vocabulary_size()} == {"city": 13}
    assert pre.classes == ("cat", "dog", "emu")
    assert pre.missing == {"x": ROWS // 10}
    assert set(pre.left_out) == {"tags"}


def test_it_standardizes_numpy_and_torch_batches_alike(dataset):
    torch = pytest.importorskip("torch")
    pre = ingest.preprocessing(dataset, features=["x", "n"])
    with ingest.loader(dataset, batch_size=ROWS, processes=0, seed=1, features=["x", "n"]) as loader:
        features, _ = next(iter(loader))
    m = pre.matrix(features)
    assert m.shape == (ROWS, 2) and m.dtype == np.float32
    mean, std = pre.numbers["x"]
    np.testing.assert_allclose(m[:, 0], (features["x"] - mean) / std, rtol=1e-6)
    # The filled column standardized over every row: mean 0, std 1, as feature_space's layer gives.
    assert abs(m[:, 0].mean()) < 1e-4 and abs(m[:, 0].std() - 1) < 1e-4
    t = pre.matrix({k: torch.from_numpy(v) for k, v in features.items()})
    np.testing.assert_allclose(t.numpy(), m, rtol=1e-6)
    assert "standardized" in pre.summary and "40 rows missing" in pre.summary


def test_it_reads_metadata_only_and_names_what_is_wrong(dataset):
    with pytest.raises(ValueError, match=r"features \['nope'\] do not exist"):
        ingest.preprocessing(dataset, features=["nope"])
    with pytest.raises(ValueError, match=r"no statistics for split 'eval'"):
        ingest.preprocessing(dataset, split="eval")
