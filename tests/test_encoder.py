"""The columnar encoder against protobuf's own encoding, on edge cases and random schemas."""

from __future__ import annotations

import math
from unittest import mock

import google_crc32c
import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from hypothesis import example, given, settings
from hypothesis import strategies as st

from beam_jobs.encode import scatter
from beam_jobs.encode.examples import encode_batch
from beam_jobs.encode.tfrecord import TFRecordError, iter_frames
from tests.conftest import examples

_I64 = st.integers(-(2**63), 2**63 - 1)
_F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
_BYTES = st.one_of(
    st.binary(max_size=40), st.text(max_size=20).map(lambda s: s.encode("utf-8")), st.just(b"x" * 300), st.just(b"")
)
_VALUES = {"int64": _I64, "float32": _F32, "bytes": _BYTES}
_ARROW = {"int64": pa.int64(), "float32": pa.float32(), "bytes": pa.large_binary()}


def _reference(columns, n):
    """What protobuf serializes for the same rows (feature map order does not matter)."""
    out = []
    for r in range(n):
        ex = tf.train.Example()
        for name, dtype, arr in columns:
            v = arr[r].as_py()
            if v is None:
                continue
            values = v if isinstance(v, list) else [v]
            f = ex.features.feature[name]
            {"int64": f.int64_list, "float32": f.float_list, "bytes": f.bytes_list}[dtype].value.extend(values)
        out.append(ex)
    return out


def _same(a: tf.train.Example, b: tf.train.Example) -> bool:
    fa, fb = a.features.feature, b.features.feature
    if set(fa) != set(fb):
        return False
    for k in fa:
        ka, kb = fa[k].WhichOneof("kind"), fb[k].WhichOneof("kind")
        va, vb = list(getattr(fa[k], ka).value), list(getattr(fb[k], kb).value)
        if ka != kb or len(va) != len(vb):
            return False
        for x, y in zip(va, vb):
            if not (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))):
                return False
    return True


@st.composite
def _batches(draw):
    n = draw(st.integers(1, 40))
    columns = []
    for i in range(draw(st.integers(1, 6))):
        dtype = draw(st.sampled_from(["int64", "float32", "bytes"]))
        shape = draw(st.sampled_from(["scalar", "list", "fixed"]))
        value = _VALUES[dtype]
        # Scalars and fixed-length lists take the slot layout; varying lists and long or
        # uneven strings the general path; a batch can mix both.
        if shape == "scalar":
            cell, typ = value, _ARROW[dtype]
        elif shape == "list":
            cell, typ = st.lists(value, max_size=6), pa.large_list(_ARROW[dtype])
        else:
            k = draw(st.integers(1, 4))
            cell, typ = st.lists(value, min_size=k, max_size=k), pa.large_list(_ARROW[dtype])
        null = st.none() if draw(st.booleans()) else st.nothing()
        cells = draw(st.lists(st.one_of(null, cell), min_size=n, max_size=n))
        columns.append((f"feat_{i}_é" + "k" * draw(st.sampled_from([0, 130])), dtype, pa.array(cells, typ)))
    return columns, n


def _records(columns, n, framed):
    if not framed:
        buf, offsets = encode_batch(columns, n)
        return [bytes(buf[offsets[i] : offsets[i + 1]]) for i in range(n)]
    buf, offsets, crcs = encode_batch(columns, n, framed=True)
    frames = [bytes(f) for f in iter_frames(buf.tobytes(), verify=True)]
    assert len(frames) == n and [len(f) for f in frames] == np.diff(offsets).tolist()
    records = [f[12:-4] for f in frames]
    assert crcs.tolist() == [google_crc32c.value(r) for r in records]
    return records


@settings(max_examples=examples(200), deadline=None)
@given(_batches(), st.booleans())
def test_encoded_records_equal_protobuf_encoding(batch, framed):
    columns, n = batch
    records = _records(columns, n, framed)
    expected = _reference(columns, n)
    for got, want in zip(records, expected):
        assert _same(tf.train.Example.FromString(got), want)
    # And TensorFlow's own parser reads them.
    specs = {
        name: tf.io.VarLenFeature({"int64": tf.int64, "float32": tf.float32, "bytes": tf.string}[d])
        for name, d, _ in columns
    }
    tf.io.parse_example(records, specs)


@settings(max_examples=examples(150), deadline=None)
@given(_batches(), st.sampled_from(["streamed", "gathered"]))
@example(([("e", "bytes", pa.array([[], None], pa.large_list(pa.large_binary())))], 2), "streamed")  # no values
def test_each_way_of_laying_out_values_gives_protobufs_bytes(batch, way):
    """Rows with many values (blocks) have them encoded back to back and copied a row at
    a time, by slices; rows with few, scattered and gathered byte by byte. Each way alone
    on every kind of column (long strings, 10-byte varints, empty lists, nulls)."""
    columns, n = batch
    streamed = way == "streamed"
    with mock.patch.multiple(
        scatter, _STREAM_VALUES=0 if streamed else 10**9, _SLICE_COPY_BYTES=0 if streamed else 10**9
    ):
        records = _records(columns, n, framed=True)
    for got, want in zip(records, _reference(columns, n)):
        assert _same(tf.train.Example.FromString(got), want)


def test_edge_values_round_trip_through_parse_example():
    columns = [
        ("i", "int64", pa.array([0, -1, 2**63 - 1, -(2**63), 127, 128], pa.int64())),
        ("f", "float32", pa.array([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.4e38], pa.float32())),
        ("s", "bytes", pa.array([b"", "日本語".encode(), b"\x00", b"y" * 100_000, b"a", b"b"], pa.large_binary())),
    ]
    for framed in (False, True):
        _check_edge_values(_records(columns, 6, framed))


def _check_edge_values(records):
    parsed = tf.io.parse_example(
        records,
        {
            "i": tf.io.FixedLenFeature([], tf.int64),
            "f": tf.io.FixedLenFeature([], tf.float32),
            "s": tf.io.FixedLenFeature([], tf.string),
        },
    )
    assert parsed["i"].numpy().tolist() == [0, -1, 2**63 - 1, -(2**63), 127, 128]
    f = parsed["f"].numpy()
    assert f[2] == np.inf and f[3] == -np.inf and np.isnan(f[4]) and np.signbit(f[1])
    assert parsed["s"].numpy()[1].decode() == "日本語" and len(parsed["s"].numpy()[3]) == 100_000


def test_framing_is_what_tfrecord_reader_expects(tmp_path):
    columns = [("v", "int64", pa.array(list(range(50)), pa.int64()))]
    buf, frame_offsets, crcs = encode_batch(columns, 50, framed=True)
    framed = buf.tobytes()
    path = tmp_path / "x.tfrecord"
    path.write_bytes(framed)
    values = [
        tf.train.Example.FromString(r).features.feature["v"].int64_list.value[0]
        for r in tf.data.TFRecordDataset(str(path)).as_numpy_iterator()
    ]
    assert values == list(range(50))
    assert len(list(iter_frames(framed, verify=True))) == 50
    with pytest.raises(TFRecordError, match="truncated"):
        list(iter_frames(framed[:-3]))
    corrupt = bytearray(framed)
    corrupt[20] ^= 0xFF
    with pytest.raises(TFRecordError, match="CRC mismatch"):
        list(iter_frames(bytes(corrupt), verify=True))
