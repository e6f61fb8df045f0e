"""Missing values are never silently plausible: the mask make_dataset and the loader give."""

from __future__ import annotations

import numpy as np
import pytest

import ingest
from tests.conftest import run_convert, write_text


def _convert(root, name: str, text: str, *args) -> str:
    out = str(root / name)
    run_convert("--source", "csv", "--input", write_text(root / f"{name}.csv", text), "--output", out, *args)
    return out


@pytest.fixture(scope="module")
def spans(tmp_path_factory):
    """Two daily spans: the first lacks `x` in some rows, the second lacks `s`."""
    root = tmp_path_factory.mktemp("missing")
    day1 = "x,s,y,label\n" + "".join(f"{'' if i % 4 == 1 else i},w{i % 3},{i / 2},{i % 2}\n" for i in range(40))
    first = _convert(root, "day1", day1, "--label", "label")
    day2 = "x,s,y,label\n" + "".join(f"{i},{'NA' if i % 5 == 2 else f'w{i % 3}'},{i / 2},{i % 2}\n" for i in range(40))
    second = _convert(root, "day2", day2, "--label", "label", "--schema_from", first)
    return first, second


def _rows(path, **kwargs) -> dict:
    """{column: numpy array over the whole split}, in file order."""
    batches = list(ingest.make_dataset(path, batch_size=1000, shuffle=False, **kwargs).as_numpy_iterator())
    (x, _), *_ = batches
    return x


def test_each_feature_with_missing_values_gets_a_mask_true_exactly_where_the_record_lacked_it(spans):
    x = _rows(spans[0])
    assert sorted(x) == ["s", "x", "x_missing", "y"]  # s and y lack nothing in this span: no mask
    assert x["x_missing"].dtype == np.bool_
    assert (x["x_missing"] == (x["y"] * 2 % 4 == 1)).all()  # y = i / 2: the rows with i % 4 == 1
    assert (x["x"][x["x_missing"]] == 0).all() and x["x_missing"].sum() == 10
    filled = _rows(spans[0], missing="fill")
    assert sorted(filled) == ["s", "x", "y"] and (filled["x"] == x["x"]).all()


def test_spans_mask_every_feature_missing_in_any_span_and_text_ids_keep_the_mask(spans):
    x = _rows(list(spans))
    assert sorted(k for k in x if k.endswith("_missing")) == ["s_missing", "x_missing"]
    i = (x["y"] * 2).astype(int)
    first = np.arange(len(i)) < 40
    assert (x["x_missing"] == (first & (i % 4 == 1))).all()
    assert (x["s_missing"] == (~first & (i % 5 == 2))).all()
    ids = _rows(list(spans), text="ids")
    assert ids["s"].dtype == np.int64 and (ids["s_missing"] == x["s_missing"]).all()
    assert (ids["s"][~ids["s_missing"]] > 0).all()  # every present value is in the vocabulary


def test_the_loader_gives_the_same_masks_as_numpy_bools(spans):
    loader = ingest.loader(list(spans), batch_size=1000, shuffle=False, processes=0)
    ((x, _),) = list(loader)
    expected = _rows(list(spans))
    assert sorted(x) == sorted(expected)
    for name in ("x_missing", "s_missing"):
        assert x[name].dtype == np.bool_ and (x[name] == expected[name]).all()


def test_a_column_named_as_a_mask_is_refused_naming_missing_fill(tmp_path):
    text = "a,a_missing,label\n1,0,0\n,1,1\n3,0,0\n"
    path = _convert(tmp_path, "clash", text, "--label", "label")
    with pytest.raises(ValueError, match=r"feature 'a_missing'.*missing='fill'"):
        ingest.make_dataset(path, batch_size=2)
    with pytest.raises(ValueError, match=r"missing must be one of \('mask', 'fill'\)"):
        ingest.make_dataset(path, batch_size=2, missing="nan")
    ((x, _),) = list(ingest.make_dataset(path, batch_size=3, shuffle=False, missing="fill").as_numpy_iterator())
    assert sorted(x) == ["a", "a_missing"]
    assert sorted(zip(x["a"].tolist(), x["a_missing"].tolist())) == [(0, 1), (1, 0), (3, 0)]  # as written
    with pytest.raises(ValueError, match=r"feature 'a_missing'"):  # read or not, the name would mean two things
        ingest.make_dataset(path, batch_size=2, features=["a"])
