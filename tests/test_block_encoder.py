"""The block encoder against docs/block_format.md, read back with protobuf (the independent reference)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_jobs.encode.blocks import ROWS_FEATURE, dictionary_encoded, encode_blocks
from beam_jobs.encode.tfrecord import iter_frames

_KIND = {"int64": "int64_list", "float32": "float_list", "bytes": "bytes_list"}
_DEFAULT = {"int64": 0, "float32": 0.0, "bytes": b""}
_ARROW = {"int64": pa.int64(), "float32": pa.float32(), "bytes": pa.large_binary()}


def _values(dtype):
    if dtype == "int64":
        return st.integers(-(2**63), 2**63 - 1)
    if dtype == "float32":
        return st.floats(width=32, allow_nan=False)
    return st.binary(max_size=12)


@st.composite
def _tables(draw):
    columns = []
    for i in range(draw(st.integers(1, 4))):
        dtype = draw(st.sampled_from(["int64", "float32", "bytes"]))
        shape = draw(st.sampled_from([(), (1,), (3,), (None,)]))
        columns.append((f"c{i}", dtype, shape))
    n = draw(st.integers(0, 40))
    rows = []
    for _ in range(n):
        row = {}
        for name, dtype, shape in columns:
            if draw(st.integers(0, 4)) == 0:
                row[name] = None
            elif shape == ():
                row[name] = draw(_values(dtype))
            else:
                size = shape[0] if shape[0] is not None else draw(st.integers(0, 4))
                row[name] = draw(st.lists(_values(dtype), min_size=size, max_size=size))
        rows.append(row)
    return columns, rows


def _arrow(columns, rows):
    out = []
    for name, dtype, shape in columns:
        values = [r[name] for r in rows]
        if shape == ():
            t = _ARROW[dtype]
        elif shape[0] is None:
            t = pa.large_list(_ARROW[dtype])
        else:
            t = pa.list_(_ARROW[dtype], shape[0])
        out.append((name, dtype, pa.array(values, t)))
    return out


def _read(buf, offsets) -> list:
    data = bytes(buf[offsets[0] : offsets[-1]])
    blocks = []
    for frame in iter_frames(data, verify=True):
        ex = tf.train.Example.FromString(bytes(frame[12:-4]))
        blocks.append({k: list(getattr(f, f.WhichOneof("kind")).value) if f.WhichOneof("kind") else []
                       for k, f in ex.features.feature.items()})  # fmt: skip
    return blocks


def _expected_rows(block, columns) -> list:
    """The rows a block holds, cut by the spec alone."""
    (n,) = block[ROWS_FEATURE]
    rows = [{} for _ in range(n)]
    for name, dtype, shape in columns:
        values = block[name]
        if dtype == "bytes":
            # A dictionary of distinct values and one code per value (format 3), in first-use
            # order; a block of distinct values leaves its codes, 0 ... n-1, out (format 4).
            dictionary, codes = values, block.get(f"{name}/codes")
            assert len(set(dictionary)) == len(dictionary)
            if codes is None:
                codes = list(range(len(dictionary)))
            else:
                assert set(codes) == set(range(len(dictionary))) and len(codes) > len(dictionary)
            assert list(dict.fromkeys(codes)) == list(range(len(dictionary)))  # first use
            values = [dictionary[c] for c in codes]
        if shape == ():
            assert len(values) == n
            cut = [[v] for v in values]
        elif shape[0] is not None:
            k = shape[0]
            assert len(values) == n * k
            cut = [values[i * k : (i + 1) * k] for i in range(n)]
        else:
            lengths = block[f"{name}/row_lengths"]
            assert len(lengths) == n and sum(lengths) == len(values)
            ends = np.cumsum([0, *lengths])
            cut = [values[ends[i] : ends[i + 1]] for i in range(n)]
        missing = set(block.get(f"{name}/missing", []))
        assert f"{name}/missing" not in block or missing, "an empty missing list is written only if needed"
        for i in range(n):
            rows[i][name] = None if i in missing else cut[i]
    return rows


def _as_lists(rows, columns) -> list:
    out = []
    for r in rows:
        row = {}
        for name, dtype, shape in columns:
            v = r[name]
            row[name] = None if v is None else ([v] if shape == () else list(v))
        out.append(row)
    return out


@settings(max_examples=150, deadline=None)
@given(_tables(), st.sampled_from([1, 2, 5, 64]))
def test_blocks_hold_every_row_as_the_spec_says(table, block_rows):
    columns, rows = table
    buf, offsets, _, sizes = encode_blocks(_arrow(columns, rows), len(rows), block_rows)
    blocks = _read(buf, offsets)
    assert [b[ROWS_FEATURE] for b in blocks] == [[int(s)] for s in sizes]
    assert all(s == block_rows for s in sizes[:-1]) and (not len(sizes) or 1 <= sizes[-1] <= block_rows)
    got = [row for block in blocks for row in _expected_rows(block, columns)]
    assert got == _as_lists(rows, columns)
    # A missing value is written as the default in its slots.
    for block in blocks:
        for name, dtype, shape in columns:
            for i in block.get(f"{name}/missing", []):
                width = 1 if shape == () else (shape[0] or 0)
                start = i * width if shape[0:1] != (None,) else None
                if start is not None:
                    codes = block.get(f"{name}/codes", range(len(block[name])))  # none: 0 ... n-1 (format 4)
                    values = block[name] if dtype != "bytes" else [block[name][c] for c in codes]
                    assert values[start : start + width] == [_DEFAULT[dtype]] * width


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 6), max_size=40),
    st.lists(st.integers(0, 40), max_size=6),
    st.booleans(),
)
def test_block_dictionaries_list_each_blocks_values_in_first_use_order(words, cuts, distinct):
    values = [b"v%d" % i for i in range(len(words))] if distinct else [b"w%d" % w for w in words]
    starts = np.array(sorted([0, len(values), *[min(c, len(values)) for c in cuts]]), np.int64)  # empty blocks too
    dictionary, dictionary_starts, codes = dictionary_encoded(pa.array(values, pa.large_binary()), starts)
    expected_dictionary, expected_codes, expected_starts = [], [], [0]
    for b in range(len(starts) - 1):
        block = values[starts[b] : starts[b + 1]]
        first_use = list(dict.fromkeys(block))
        expected_dictionary += first_use
        expected_codes += [first_use.index(v) for v in block]
        expected_starts.append(len(expected_dictionary))
    assert dictionary.to_pylist() == expected_dictionary
    assert dictionary_starts.tolist() == expected_starts and dictionary_starts.dtype == np.int64
    assert codes.tolist() == expected_codes and codes.dtype == np.int64


def test_given_defaults_fill_missing_scalars():
    cols = [
        ("x", "int64", pa.array([1, None, 3], pa.int64())),
        ("s", "bytes", pa.array([None, b"a", b"b"], pa.large_binary())),
    ]
    buf, offsets, _, sizes = encode_blocks(cols, 3, 2, defaults={"x": -1, "s": "?"})
    blocks = _read(buf, offsets)
    assert sizes.tolist() == [2, 1]
    assert blocks[0]["x"] == [1, -1] and blocks[0]["x/missing"] == [1]
    assert blocks[0]["s"] == [b"?", b"a"] and blocks[0]["s/missing"] == [0]
    assert "x/missing" not in blocks[1] and "s/missing" not in blocks[1]


def test_blocks_are_a_quarter_of_the_row_layouts_bytes_on_a_wide_table():
    from beam_jobs.encode.examples import encode_batch

    rng = np.random.default_rng(0)
    n = 4096
    cols = [(f"f{i}", "float32", pa.array(rng.random(n, dtype=np.float32))) for i in range(12)]
    cols += [(f"i{i}", "int64", pa.array(rng.integers(0, 1000, n))) for i in range(6)]
    cols += [
        (f"s{i}", "bytes", pa.array([b"cat%d" % v for v in rng.integers(0, 9, n)], pa.large_binary())) for i in range(3)
    ]
    rows_buf, _, _ = encode_batch(cols, n, framed=True)
    block_buf, _, _, _ = encode_blocks(cols, n, 1024)
    assert len(block_buf) < 0.4 * len(rows_buf)  # a size property of the format, not a timing


def test_column_names_the_layout_uses_are_refused():
    for name in ("__rows__", "x/missing", "x/row_lengths"):
        cols = [("x", "int64", pa.array([1])), (name, "int64", pa.array([2]))]
        with pytest.raises(ValueError, match=r"take a name the block layout uses"):
            encode_blocks(cols, 1, 4)


def test_bad_block_size_is_refused():
    with pytest.raises(ValueError, match="block_rows must be at least 1"):
        encode_blocks([("x", "int64", pa.array([1]))], 1, 0)


def test_the_runtime_parser_reads_what_the_encoder_writes():
    from ingest import contract
    from ingest.pipeline.blocks.parse import parse_blocks

    n = 37
    cols = [
        ("id", "int64", pa.array(range(n), pa.int64())),
        ("x", "float32", pa.array([None if i % 5 == 0 else i / 4 for i in range(n)], pa.float32())),
        ("s", "bytes", pa.array([b"v%d" % i for i in range(n)], pa.large_binary())),
        ("fixed", "int64", pa.array([[i, -i] for i in range(n)], pa.list_(pa.int64(), 2))),
        (
            "tags",
            "bytes",
            pa.array([None if i == 3 else [b"t"] * (i % 3) for i in range(n)], pa.large_list(pa.large_binary())),
        ),
    ]
    specs = [
        contract.FeatureSpec("id", "int64", ()),
        contract.FeatureSpec("x", "float32", (), default=-1.0),
        contract.FeatureSpec("s", "bytes", ()),
        contract.FeatureSpec("fixed", "int64", (2,)),
        contract.FeatureSpec("tags", "bytes", (None,)),
    ]
    buf, offsets, _, _ = encode_blocks(cols, n, 8, defaults={"x": -1.0})
    frames = [bytes(f[12:-4]) for f in iter_frames(bytes(buf))]
    values, presence = parse_blocks(tf.constant(frames), specs, with_presence=True)
    assert values["id"].numpy().tolist() == list(range(n))
    assert values["x"].numpy().tolist() == [-1.0 if i % 5 == 0 else i / 4 for i in range(n)]
    assert presence["x"].numpy().tolist() == [i % 5 != 0 for i in range(n)]
    assert values["fixed"].numpy().tolist() == [[i, -i] for i in range(n)]
    assert values["tags"].to_list() == [[] if i == 3 else [b"t"] * (i % 3) for i in range(n)]
    assert presence["tags"].numpy().tolist() == [i != 3 for i in range(n)]


def test_a_null_element_of_a_present_fixed_size_list_is_refused_not_filled():
    def fixed(values):  # three rows of two, the last missing
        return [
            ("f", "int64", pa.FixedSizeListArray.from_arrays(pa.array(values), 2, mask=pa.array([False, False, True])))
        ]

    encode_blocks(fixed([1, 2, 3, 4, None, None]), 3, 2)  # a missing row's slots may hold nulls
    with pytest.raises(ValueError, match=r"column 'f': lists must not contain null elements"):
        encode_blocks(fixed([1, 2, 3, None, 5, 6]), 3, 2)
