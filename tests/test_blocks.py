"""The runtime's block parser against blocks written with protobuf from docs/block_format.md."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.contract import FeatureSpec
from ingest.pipeline._functions import own_functions
from ingest.pipeline.blocks.parse import parse_blocks, permute_rows
from tests.conftest import examples

_KIND = {"int64": "int64_list", "float32": "float_list", "bytes": "bytes_list"}
_NUMPY = {"int64": np.int64, "float32": np.float32, "bytes": object}


def _default(spec: FeatureSpec):
    return spec.default.encode() if spec.dtype == "bytes" else spec.default


def _set_list(feature: tf.train.Feature, kind: str, values) -> None:
    # SetInParent: an empty list still names its kind, as the layout says every feature has one.
    getattr(feature, kind).SetInParent()
    getattr(feature, kind).value.extend(values)


def write_blocks(specs, rows, block_rows: int, *, coded: bool = False) -> list:
    """The reference writer: rows (dicts, None = missing) -> serialized block Examples, per the doc.

    `coded`: bytes columns as format 3 writes them, a dictionary of the block's distinct
    values (in the reverse of their first use, unlike the encoder) and a code per value.
    """
    blocks = []
    for start in range(0, len(rows), block_rows):
        block = rows[start : start + block_rows]
        example = tf.train.Example()
        features = example.features.feature
        _set_list(features["__rows__"], "int64_list", [len(block)])
        for spec in specs:
            values, lengths, missing = [], [], []
            for position, row in enumerate(block):
                value = row[spec.name]
                if value is None:
                    missing.append(position)
                    if spec.is_scalar:
                        values.append(_default(spec))
                    elif not spec.is_variable_length:
                        values.extend([_default(spec)] * spec.shape[0])
                    else:
                        lengths.append(0)
                elif spec.is_scalar:
                    values.append(value)
                else:
                    values.extend(value)
                    lengths.append(len(value))
            if coded and spec.dtype == "bytes":
                dictionary = list(dict.fromkeys(values))[::-1]
                _set_list(features[spec.name + "/codes"], "int64_list", [dictionary.index(v) for v in values])
                values = dictionary
            _set_list(features[spec.name], _KIND[spec.dtype], values)
            if spec.is_variable_length:
                _set_list(features[spec.name + "/row_lengths"], "int64_list", lengths)
            if missing:
                _set_list(features[spec.name + "/missing"], "int64_list", missing)
        blocks.append(example.SerializeToString())
    return blocks


def _random_values(rng: np.random.Generator, dtype: str, size: int) -> list:
    if dtype == "int64":
        return rng.integers(-(2**63), 2**63, size=size, dtype=np.int64).tolist()
    if dtype == "float32":
        # Any float32 bit pattern but NaN: infinities, -0.0 and subnormals included.
        bits = rng.integers(0, 2**32, size=size, dtype=np.uint32).view(np.float32)
        return np.where(np.isnan(bits), np.float32(1.5), bits).tolist()
    return [rng.bytes(int(n)) for n in rng.integers(0, 6, size=size)]


def random_rows(rng: np.random.Generator, specs, n: int, missing_rates) -> list:
    rows = [{} for _ in range(n)]
    for spec, rate in zip(specs, missing_rates):
        for row in rows:
            if rng.random() < rate:
                row[spec.name] = None
            elif spec.is_scalar:
                row[spec.name] = _random_values(rng, spec.dtype, 1)[0]
            else:
                size = spec.shape[0] if spec.shape[0] is not None else int(rng.integers(0, 5))
                row[spec.name] = _random_values(rng, spec.dtype, size)
    return rows


def _expected(spec: FeatureSpec, rows):
    """What the rows should parse to: missing -> the default (dense) or an empty list (variable)."""
    if spec.is_scalar:
        return [_default(spec) if r[spec.name] is None else r[spec.name] for r in rows]
    if not spec.is_variable_length:
        return [[_default(spec)] * spec.shape[0] if r[spec.name] is None else r[spec.name] for r in rows]
    return [[] if r[spec.name] is None else r[spec.name] for r in rows]


def _comparable(array: np.ndarray) -> np.ndarray:
    # float32 bit for bit: -0.0 must stay -0.0.
    return array.view(np.uint32) if array.dtype == np.float32 else array


def assert_rows_equal(spec: FeatureSpec, got, rows) -> None:
    expected = _expected(spec, rows)
    if spec.is_variable_length:
        assert isinstance(got, tf.RaggedTensor) and got.row_splits.dtype == tf.int64, spec
        flat = [v for row in expected for v in row]
        want_splits = np.cumsum([0] + [len(row) for row in expected])
        np.testing.assert_array_equal(got.row_splits.numpy(), want_splits, err_msg=spec.name)
        got_values, want = got.values.numpy(), np.array(flat, dtype=_NUMPY[spec.dtype])
    else:
        got_values = got.numpy()
        want_shape = (len(rows),) + tuple(spec.shape)
        want = np.array(expected, dtype=_NUMPY[spec.dtype]).reshape(want_shape)
        assert got_values.shape == want_shape, (spec.name, got_values.shape, want_shape)
    np.testing.assert_array_equal(_comparable(got_values), _comparable(want), err_msg=spec.name)


def _presence_expected(spec: FeatureSpec, rows) -> np.ndarray:
    return np.array([r[spec.name] is not None for r in rows], dtype=bool).reshape(len(rows))


def _blocks_tensor(blocks) -> tf.Tensor:
    return tf.constant(blocks, dtype=tf.string, shape=[len(blocks)])


@st.composite
def _schemas(draw):
    specs, rates = [], []
    for i in range(draw(st.integers(1, 5))):
        dtype = draw(st.sampled_from(["int64", "float32", "bytes"]))
        shape = draw(st.sampled_from([(), (1,), (3,), (None,)]))
        default = None
        if draw(st.booleans()):
            default = {
                "int64": st.integers(-(2**63), 2**63 - 1),
                "float32": st.floats(width=32, allow_nan=False),
                "bytes": st.text(max_size=3),
            }[dtype]
            default = draw(default)
        specs.append(FeatureSpec(f"c{i}" if i % 2 else f"group/c{i}", dtype, shape, default=default))
        rates.append(draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])))
    return specs, rates


# Format 3 and 2 blocks, read as such and as blocks that each say what they are: drawn with
# the rest, not all four on every example (each eager parse costs ~30 ms: four a draw made
# this test a minute of the suite's CPU).
@settings(max_examples=examples(300), deadline=None)
@given(
    schema=_schemas(),
    n=st.integers(0, 300),
    block_rows=st.sampled_from([1, 2, 5, 64]),
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from([(True, True), (True, None), (False, False), (False, None)]),
)
def test_parse_blocks_gives_back_every_row_of_the_reference_blocks(schema, n, block_rows, seed, kind):
    specs, rates = schema
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, specs, n, rates)
    coded, codes = kind
    blocks = write_blocks(specs, rows, block_rows, coded=coded)
    values, presence = parse_blocks(_blocks_tensor(blocks), specs, with_presence=True, codes=codes)
    assert set(values) == set(presence) == {s.name for s in specs}
    for spec in specs:
        assert_rows_equal(spec, values[spec.name], rows)
        expected = _presence_expected(spec, rows)
        np.testing.assert_array_equal(presence[spec.name].numpy(), expected, err_msg=spec.name)
    assert_same_columns(parse_blocks(_blocks_tensor(blocks), specs, codes=codes), values)
    take = rng.integers(0, n, size=rng.integers(0, 2 * n + 1)) if n else np.zeros(0, np.int64)
    taken, taken_presence = parse_blocks(_blocks_tensor(blocks), specs, with_presence=True, codes=codes, take=take)
    for spec in specs:
        assert_rows_equal(spec, taken[spec.name], [rows[i] for i in take])
        np.testing.assert_array_equal(taken_presence[spec.name].numpy(), presence[spec.name].numpy()[take])


def assert_same_columns(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for name in a:
        if isinstance(a[name], tf.RaggedTensor):
            np.testing.assert_array_equal(a[name].row_splits.numpy(), b[name].row_splits.numpy(), err_msg=name)
            a_values, b_values = a[name].values.numpy(), b[name].values.numpy()
        else:
            a_values, b_values = a[name].numpy(), b[name].numpy()
        np.testing.assert_array_equal(_comparable(a_values), _comparable(b_values), err_msg=name)


_MIXED = [
    FeatureSpec("id", "int64"),
    FeatureSpec("x", "float32", default=-1.5),
    FeatureSpec("vec", "float32", (3,)),
    FeatureSpec("name", "bytes", default="?"),
    FeatureSpec("tags", "int64", (None,)),
    FeatureSpec("words", "bytes", (None,)),
]


def _mixed_rows(n: int, seed: int = 7) -> list:
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, _MIXED[1:], n, [0.2, 0.3, 0.1, 0.3, 0.5])
    for i, row in enumerate(rows):
        row["id"] = i
    return rows


def _parsed_in_map(ds: tf.data.Dataset) -> tf.data.Dataset:
    # As the pipeline maps it (ingest/pipeline/_functions.py): traced without AutoGraph,
    # whose conversion of the parse module was ~3 s of each such test.
    with own_functions():
        return ds.map(lambda b: parse_blocks(b, _MIXED, with_presence=True))


def test_parse_blocks_in_a_tf_data_map_gives_the_same_rows():
    rows = _mixed_rows(300)
    blocks = write_blocks(_MIXED, rows, 8)  # 38 blocks, the last one of 4 rows
    ds = tf.data.Dataset.from_tensor_slices(blocks).batch(7)
    ds = _parsed_in_map(ds)
    windows = list(ds)
    assert len(windows) == 6
    values = {s.name: tf.concat([w[0][s.name] for w in windows], axis=0) for s in _MIXED}
    presence = {s.name: tf.concat([w[1][s.name] for w in windows], axis=0) for s in _MIXED}
    for spec in _MIXED:
        assert_rows_equal(spec, values[spec.name], rows)
        np.testing.assert_array_equal(presence[spec.name].numpy(), _presence_expected(spec, rows), err_msg=spec.name)


def test_a_block_without_missing_rows_has_every_row_present():
    specs = [FeatureSpec("x", "int64", default=9), FeatureSpec("t", "bytes", (None,))]
    rows = [{"x": 1, "t": [b"a"]}, {"x": None, "t": None}, {"x": 3, "t": []}, {"x": 4, "t": [b"b", b"c"]}]
    blocks = write_blocks(specs, rows, 2)
    assert b"x/missing" not in blocks[1] and b"x/missing" in blocks[0]
    values, presence = parse_blocks(_blocks_tensor(blocks), specs, with_presence=True)
    assert values["x"].numpy().tolist() == [1, 9, 3, 4]
    assert values["t"].to_list() == [[b"a"], [], [], [b"b", b"c"]]
    assert presence["x"].numpy().tolist() == [True, False, True, True]
    assert presence["t"].numpy().tolist() == [True, False, True, True]


def _corrupt(block: bytes, change) -> bytes:
    example = tf.train.Example.FromString(block)
    change(example.features.feature)
    return example.SerializeToString()


def _drop_last(values):
    del values[-1]


def _bump_first(values):
    values[0] += 1


_CORRUPTIONS = {
    "scalar one value short": (
        lambda f: _drop_last(f["id"].int64_list.value),
        r"block feature `id` holds 7 values for 8 rows \(block 1 of the 3 parsed together\)",
    ),
    "fixed one value short": (
        lambda f: _drop_last(f["vec"].float_list.value),
        r"block feature `vec` holds 23 values for 8 rows of 3",
    ),
    "row lengths not summing to the values": (
        lambda f: _bump_first(f["tags/row_lengths"].int64_list.value),
        r"block feature `tags` holds \d+ values but its `tags/row_lengths` sum to \d+ \(block 1 ",
    ),
    "one row length too few": (
        lambda f: _drop_last(f["words/row_lengths"].int64_list.value),
        r"block feature `words/row_lengths` holds 7 lengths for 8 rows",
    ),
    "a missing position past the block": (
        lambda f: f["x/missing"].int64_list.value.append(8),
        r"block feature `x/missing` names row 8 of a block of 8 rows \(block 1 ",
    ),
}


def _malformed_window(change) -> list:
    rows = _mixed_rows(20)
    for row in rows[8:16]:
        row["x"], row["words"] = row["x"] if row["id"] % 2 else None, [b"w"] * (row["id"] % 3)
    blocks = write_blocks(_MIXED, rows, 8)
    blocks[1] = _corrupt(blocks[1], change)
    return blocks


@pytest.mark.parametrize("case", sorted(_CORRUPTIONS))
def test_a_malformed_block_raises_naming_the_feature(case):
    change, message = _CORRUPTIONS[case]
    blocks = _malformed_window(change)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        parse_blocks(_blocks_tensor(blocks), _MIXED, with_presence=True)


@pytest.mark.parametrize("case", sorted(_CORRUPTIONS))
def test_a_malformed_block_raises_inside_a_tf_data_map(case):
    change, message = _CORRUPTIONS[case]
    ds = tf.data.Dataset.from_tensor_slices(_malformed_window(change)).batch(3)
    ds = _parsed_in_map(ds)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        list(ds)


def test_a_negative_row_length_that_sums_right_is_rejected():
    def shift(features):
        lengths = features["words/row_lengths"].int64_list.value
        lengths[0] -= 6
        lengths[1] += 6

    message = r"`words/row_lengths` holds the negative length -\d \(block 1 of the 3 parsed"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        parse_blocks(_blocks_tensor(_malformed_window(shift)), _MIXED)


def _permuted_window(seed):
    rows = _mixed_rows(200)
    values, presence = parse_blocks(_blocks_tensor(write_blocks(_MIXED, rows, 16)), _MIXED, with_presence=True)
    window = dict(values)
    window.update({f"{name}/present": p for name, p in presence.items()})
    return rows, permute_rows(window, seed)


def _assert_aligned(rows, permuted) -> np.ndarray:
    ids = permuted["id"].numpy()
    assert sorted(ids.tolist()) == list(range(len(rows)))
    reordered = [rows[i] for i in ids]
    for spec in _MIXED:
        assert_rows_equal(spec, permuted[spec.name], reordered)
        got = permuted[f"{spec.name}/present"].numpy()
        np.testing.assert_array_equal(got, _presence_expected(spec, reordered), err_msg=spec.name)
    return ids


def test_permute_rows_keeps_every_row_and_its_columns_together():
    rows, permuted = _permuted_window(tf.constant([1, 2], tf.int64))
    ids = _assert_aligned(rows, permuted)
    assert ids.tolist() != list(range(len(rows)))


def test_permute_rows_with_the_same_seed_gives_the_same_order():
    first = _permuted_window(tf.constant([5, 6], tf.int32))[1]["id"].numpy()
    again = _permuted_window(tf.constant([5, 6], tf.int32))[1]["id"].numpy()
    other = _permuted_window(tf.constant([5, 7], tf.int32))[1]["id"].numpy()
    np.testing.assert_array_equal(first, again)
    assert first.tolist() != other.tolist()


def test_permute_rows_without_a_seed_still_keeps_rows_aligned():
    rows, permuted = _permuted_window(None)
    _assert_aligned(rows, permuted)


def test_permute_rows_in_a_tf_data_map():
    rows = _mixed_rows(100)
    ds = tf.data.Dataset.from_tensors(write_blocks(_MIXED, rows, 64))
    with own_functions():
        ds = ds.map(lambda b: permute_rows(parse_blocks(b, _MIXED), tf.constant([3, 4], tf.int64)))
    (permuted,) = list(ds)
    ids = permuted["id"].numpy()
    assert sorted(ids.tolist()) == list(range(100))
    reordered = [rows[i] for i in ids]
    for spec in _MIXED:
        assert_rows_equal(spec, permuted[spec.name], reordered)
    eager = permute_rows(
        parse_blocks(_blocks_tensor(write_blocks(_MIXED, rows, 64)), _MIXED), tf.constant([3, 4], tf.int64)
    )
    np.testing.assert_array_equal(eager["id"].numpy(), ids)


def test_a_window_of_blocks_from_before_and_after_dictionaries_reads_each_as_it_says():
    """Spans converted before and after format 3, read as one: each block says what it holds."""
    rows = _mixed_rows(64)
    plain, coded = write_blocks(_MIXED, rows, 8), write_blocks(_MIXED, rows, 8, coded=True)
    assert all(a != b for a, b in zip(plain, coded))
    window = [plain[i] if i % 3 else coded[i] for i in range(len(plain))]
    values, presence = parse_blocks(_blocks_tensor(window), _MIXED, with_presence=True)
    for spec in _MIXED:
        assert_rows_equal(spec, values[spec.name], rows)
        np.testing.assert_array_equal(presence[spec.name].numpy(), _presence_expected(spec, rows), err_msg=spec.name)
    # Told that every block is coded, a plain one is an error naming it, not a misread.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"block feature `name/codes` holds 0 values for 8 rows"):
        parse_blocks(_blocks_tensor(window), _MIXED, codes=True)


def _coded_window(change) -> list:
    blocks = write_blocks(_MIXED, _mixed_rows(24), 8, coded=True)
    blocks[1] = _corrupt(blocks[1], change)
    return blocks


def _set_code(values, code):
    values[-1] = code


_CODE_CORRUPTIONS = {
    "a code past the dictionary": (
        lambda f: _set_code(f["name/codes"].int64_list.value, len(f["name"].bytes_list.value)),
        r"block feature `name/codes` holds the code (\d+) for a dictionary of \1 values \(block 1 ",
    ),
    "a negative code": (
        lambda f: _set_code(f["words/codes"].int64_list.value, -1),
        r"block feature `words/codes` holds the code -1 for a dictionary of \d+ values \(block 1 ",
    ),
    "a code short": (
        lambda f: _drop_last(f["name/codes"].int64_list.value),
        r"block feature `name/codes` holds 7 values for 8 rows \(block 1 ",
    ),
}


@pytest.mark.parametrize("case", sorted(_CODE_CORRUPTIONS))
@pytest.mark.parametrize("codes", [True, None])
def test_a_block_whose_codes_miss_its_dictionary_raises_naming_it(case, codes):
    change, message = _CODE_CORRUPTIONS[case]
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        parse_blocks(_blocks_tensor(_coded_window(change)), _MIXED, codes=codes, take=tf.range(24, dtype=tf.int64))
