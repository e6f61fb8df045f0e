"""The general encoder path: any column, any list lengths, written by scatter.

Used for the columns the slot layout of `encode.examples` cannot hold compactly: lists
whose lengths vary, and long or very uneven strings. Each column's map entries are
computed for all rows at once with numpy (varint sizes, packed float and int64 payloads,
bytes lists) and scattered into a buffer of their own.

Wire format (proto3):
  Example  { Features features = 1; }
  Features { map<string, Feature> feature = 1; }   # entry: key = 1, value = 2
  Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
  *List    { repeated T value = 1; }                # float and int64 packed
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["Column", "varint_size", "put_varint", "varint_bytes"]

_FEATURE_TAG = {"bytes": 0x0A, "float32": 0x12, "int64": 0x1A}
_U8 = np.uint8


def varint_size(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint64, copy=False)
    size = np.ones(v.shape, np.int64)
    if not v.size or v.max() < 0x80:  # lengths and small counts: one pass, not nine
        return size
    for shift in range(7, 64, 7):
        size += v >= (np.uint64(1) << np.uint64(shift))
    return size


def put_varint(buf: np.ndarray, pos: np.ndarray, v: np.ndarray) -> None:
    v = v.astype(np.uint64, copy=False)
    while v.size:
        more = v >= 0x80
        if not more.any():  # the last byte of every varint left (often the only one)
            buf[pos] = v.astype(_U8)
            return
        buf[pos] = ((v & np.uint64(0x7F)) | (more.astype(np.uint64) << np.uint64(7))).astype(_U8)
        v = v[more] >> np.uint64(7)
        pos = pos[more] + 1


def _put_const(buf: np.ndarray, pos: np.ndarray, const: bytes) -> None:
    if len(const) == 1:
        buf[pos] = const[0]
    else:
        buf[pos[:, None] + np.arange(len(const))] = np.frombuffer(const, _U8)


# Segments at least this long on average are copied one slice at a time (a memcpy each,
# ~0.4 us of Python); shorter ones by one gather over every byte (8 bytes of index each,
# ~4 ns a byte): the loop wins from ~100 bytes a segment, blocks' are kilobytes.
_SLICE_COPY_BYTES = 256
# Rows with at least this many values on average (blocks, long lists) have their values
# encoded back to back first, then each row's payload copied whole.
_STREAM_VALUES = 16


def _copy_segments(buf, dst_starts, src, src_starts, lengths) -> None:
    """buf[dst_starts[i]:+lengths[i]] = src[src_starts[i]:+lengths[i]] for all i."""
    if lengths.size == 0:
        return
    if int(lengths.sum()) >= _SLICE_COPY_BYTES * lengths.size:
        for d, s, n in zip(dst_starts.tolist(), src_starts.tolist(), lengths.tolist()):
            buf[d : d + n] = src[s : s + n]
        return
    width = int(lengths[0])
    if np.all(lengths == width):
        if width:
            idx = np.arange(width)
            buf[dst_starts[:, None] + idx] = src[src_starts[:, None] + idx]
        return
    total = int(lengths.sum())
    if total == 0:
        return
    seg_starts = np.cumsum(lengths) - lengths
    within = np.arange(total, dtype=np.int64) - np.repeat(seg_starts, lengths)
    buf[np.repeat(dst_starts, lengths) + within] = src[np.repeat(src_starts, lengths) + within]


class Column:
    """A column as present-mask, per-row value counts and flat values."""

    def __init__(self, name: str, dtype: str, array: pa.Array):
        self.key = name.encode("utf-8")
        self.dtype = dtype
        n = len(array)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        self.all_present = array.null_count == 0
        if self.all_present:
            self.present = np.ones(n, bool)
        else:
            self.present = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), bool)
        if (
            pa.types.is_list(array.type)
            or pa.types.is_large_list(array.type)
            or pa.types.is_fixed_size_list(array.type)
        ):
            # Rebuild a compact list array so offsets start at 0 and nulls hold no values.
            present_rows = array if self.all_present else array.filter(pa.array(self.present))
            if pa.types.is_fixed_size_list(present_rows.type):
                w = present_rows.type.list_size
                counts_present = np.full(len(present_rows), w, np.int64)
                flat = present_rows.flatten()
            else:
                present_rows = present_rows.cast(pa.large_list(present_rows.type.value_type))
                offsets = np.asarray(present_rows.offsets.to_numpy(), np.int64)
                counts_present = np.diff(offsets)
                flat = present_rows.flatten()
            if flat.null_count:
                raise ValueError(f"column {name!r}: lists must not contain null elements")
        else:
            counts_present = np.ones(int(self.present.sum()), np.int64)
            flat = array if self.all_present else array.filter(pa.array(self.present))
        if dtype == "float64":
            # float_list holds 32-bit floats only: a double is stored as its int64 bit
            # pattern (docs/block_format.md), read back with tf.bitcast.
            self.dtype = dtype = "int64"
            flat = flat.cast(pa.float64()).view(pa.int64())
        self.counts = np.zeros(n, np.int64)
        self.counts[self.present] = counts_present
        self.counts_present = counts_present
        if dtype == "bytes":
            flat = flat.cast(pa.large_binary())
            bufs = flat.buffers()
            offs = np.frombuffer(bufs[1], np.int64)[flat.offset : flat.offset + len(flat) + 1]
            self.data = np.frombuffer(bufs[2], _U8) if bufs[2] is not None else np.zeros(0, _U8)
            self.value_starts = offs[:-1]
            self.value_lengths = np.diff(offs)
        elif dtype == "float32":
            self.values = np.ascontiguousarray(flat.cast(pa.float32()).to_numpy(zero_copy_only=False), np.float32)
        else:
            self.values = np.ascontiguousarray(flat.cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64)

    def layout(self):
        """Per present row: payload length, list-message length, feature length, entry length."""
        k = self.counts_present
        value_row_start = np.cumsum(k) - k
        if self.dtype == "float32":
            payload = 4 * k
        else:
            if self.dtype == "int64":
                value_sizes = varint_size(self.values.view(np.uint64))
            else:
                value_sizes = 1 + varint_size(self.value_lengths) + self.value_lengths
            # Where each value's bytes start within the column's values, and the total last.
            self.value_starts_in_payload = np.concatenate([[0], np.cumsum(value_sizes)])
            cs = self.value_starts_in_payload
            payload = cs[value_row_start + k] - cs[value_row_start]
        # A bytes list is its repeated values; float and int64 lists are packed.
        list_len = payload if self.dtype == "bytes" else np.where(k > 0, 1 + varint_size(payload) + payload, 0)
        self.value_row_start = value_row_start
        self.payload = payload
        self.list_len = list_len
        self.feature_len = 1 + varint_size(list_len) + list_len
        self.key_prefix = b"\x0a" + varint_bytes(len(self.key)) + self.key + b"\x12"
        self.entry_len = len(self.key_prefix) + varint_size(self.feature_len) + self.feature_len
        self.item_len = 1 + varint_size(self.entry_len) + self.entry_len
        return self.item_len

    def write(self, buf: np.ndarray, pos: np.ndarray) -> None:
        """Write the map item of every present row; `pos` holds their start offsets."""
        buf[pos] = 0x0A
        p = pos + 1
        put_varint(buf, p, self.entry_len)
        p = p + varint_size(self.entry_len)
        _put_const(buf, p, self.key_prefix)
        p = p + len(self.key_prefix)
        put_varint(buf, p, self.feature_len)
        p = p + varint_size(self.feature_len)
        buf[p] = _FEATURE_TAG[self.dtype]
        p = p + 1
        put_varint(buf, p, self.list_len)
        p = p + varint_size(self.list_len)
        k = self.counts_present
        if self.dtype in ("float32", "int64"):
            has_values = k > 0
            q = p[has_values]
            buf[q] = 0x0A
            q = q + 1
            put_varint(buf, q, self.payload[has_values])
            p = p.copy()
            p[has_values] = q + varint_size(self.payload[has_values])
        if self.dtype == "float32":
            src = self.values.view(_U8)
            _copy_segments(buf, p, src, 4 * self.value_row_start, 4 * k)
            return
        cs = self.value_starts_in_payload
        if k.sum() and k.sum() >= _STREAM_VALUES * k.size:
            if self.dtype == "int64":
                stream = np.empty(int(cs[-1]), _U8)
                put_varint(stream, cs[:-1], self.values.view(np.uint64))
            else:
                first, end = self.value_starts[0], self.value_starts[-1] + self.value_lengths[-1]
                stream = _bytes_entries(self.data[first:end], self.value_lengths)
            _copy_segments(buf, p, stream, cs[self.value_row_start], self.payload)
            return
        # Per value: its offset inside its row's payload.
        row_of_value = np.repeat(np.arange(len(k)), k)
        if row_of_value.size == 0:
            return
        value_pos = p[row_of_value] + cs[:-1] - cs[self.value_row_start[row_of_value]]
        if self.dtype == "int64":
            put_varint(buf, value_pos, self.values.view(np.uint64))
            return
        buf[value_pos] = 0x0A
        vp = value_pos + 1
        put_varint(buf, vp, self.value_lengths)
        vp = vp + varint_size(self.value_lengths)
        _copy_segments(buf, vp, self.data, self.value_starts, self.value_lengths)


def _bytes_entries(data: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every value's entry in a BytesList (tag 1, its length, its bytes), back to back;
    `data`: the values' bytes back to back. One masked copy moves all the values' bytes,
    where a gather would index every byte."""
    prefix = 1 + varint_size(lengths)
    starts = np.cumsum(prefix + lengths) - (prefix + lengths)
    total = int(starts[-1] + prefix[-1] + lengths[-1]) if len(lengths) else 0
    out = np.empty(total, _U8)
    is_value = np.ones(total, bool)
    for j in range(int(prefix.max()) if len(prefix) else 0):
        is_value[starts[prefix > j] + j] = False
    out[is_value] = data
    out[starts] = 0x0A
    put_varint(out, starts + 1, lengths)
    return out


def varint_bytes(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
