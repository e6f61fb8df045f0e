"""TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C of the data."""

from __future__ import annotations

import struct

import google_crc32c
import numpy as np
import pyarrow as pa

__all__ = [
    "HEADER_BYTES",
    "FOOTER_BYTES",
    "frame_headers",
    "seal_frames",
    "offsets_of",
    "frames_array",
    "frames_data",
    "grouped_frames",
    "key_ranges",
    "iter_frames",
    "TFRecordError",
]

HEADER_BYTES = 12  # uint64 length + masked CRC32C of it
FOOTER_BYTES = 4  # masked CRC32C of the record
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class TFRecordError(ValueError):
    pass


def _crc32c_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc32c_table()


def mask_crc(crc):
    """TFRecord's CRC masking, for a Python int or a uint32 array."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_headers(lengths: np.ndarray) -> np.ndarray:
    """(n, 12) TFRecord headers: little-endian uint64 length, then its masked CRC32C."""
    n = len(lengths)
    out = np.empty((n, HEADER_BYTES), np.uint8)
    out[:, :8] = lengths.astype("<u8").view(np.uint8).reshape(n, 8)
    crc = np.full(n, 0xFFFFFFFF, np.uint32)
    for i in range(8):
        crc = _CRC_TABLE[(crc ^ out[:, i]) & 0xFF] ^ (crc >> np.uint32(8))
    out[:, 8:] = mask_crc(crc ^ np.uint32(0xFFFFFFFF)).astype("<u4").view(np.uint8).reshape(n, 4)
    return out


def seal_frames(buf: np.ndarray, frame_offsets: np.ndarray) -> np.ndarray:
    """Writes each frame's footer (masked CRC32C of its record); returns the CRCs."""
    n = len(frame_offsets) - 1
    if n == 0:
        return np.zeros(0, np.uint32)
    raw = buf.tobytes()  # google_crc32c takes bytes, not memoryview slices
    records = map(
        raw.__getitem__,
        map(slice, (frame_offsets[:-1] + HEADER_BYTES).tolist(), (frame_offsets[1:] - FOOTER_BYTES).tolist()),
    )
    crcs = np.fromiter(map(google_crc32c.value, records), np.uint32, n)
    footer = mask_crc(crcs).astype("<u4").view(np.uint8).reshape(n, FOOTER_BYTES)
    buf[(frame_offsets[1:] - FOOTER_BYTES)[:, None] + np.arange(FOOTER_BYTES)] = footer
    return crcs


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """[0, l0, l0+l1, ...]: where each of `lengths` starts, and the total last."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def frames_array(buf, offsets: np.ndarray) -> pa.Array:
    """The values `buf[offsets[i]:offsets[i+1]]` (frames, or any byte strings) as an Arrow
    binary array, without a copy, so reordering or joining them runs in C++."""
    data = buf if isinstance(buf, pa.Buffer) else pa.py_buffer(buf)
    return pa.Array.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(np.ascontiguousarray(offsets, np.int64)), data]
    )


def frames_data(frames: pa.Array):
    """The bytes of a binary array's values, back to back, and each value's length."""
    offsets = np.frombuffer(frames.buffers()[1], np.int64)[frames.offset : frames.offset + len(frames) + 1]
    data = frames.buffers()[2]
    if data is None:
        return memoryview(b""), np.zeros(0, np.int64)
    return memoryview(data)[offsets[0] : offsets[-1]], np.diff(offsets)


def iter_frames(data: bytes, *, source: str = "<bytes>", verify: bool = False):
    """Yields the frames (header + record + footer) of a TFRecord byte string."""
    pos, end = 0, len(data)
    mv = memoryview(data)
    while pos < end:
        if end - pos < HEADER_BYTES:
            raise TFRecordError(f"{source}: truncated record header at byte {pos}")
        (length,) = _LEN.unpack_from(data, pos)
        stop = pos + HEADER_BYTES + length + FOOTER_BYTES
        if stop > end:
            raise TFRecordError(f"{source}: truncated record at byte {pos} (length {length})")
        if verify:
            (crc,) = _CRC.unpack_from(data, pos + HEADER_BYTES + length)
            if crc != mask_crc(google_crc32c.value(bytes(mv[pos + HEADER_BYTES : pos + HEADER_BYTES + length]))):
                raise TFRecordError(f"{source}: CRC mismatch in record at byte {pos}")
        yield mv[pos:stop]
        pos = stop


def key_ranges(counts: np.ndarray):
    """Yields (key, first, end) for each key with items, given items grouped by key in key
    order and `counts[key]` items per key: the key's items are positions first..end-1."""
    first = 0
    for key in np.flatnonzero(counts):
        last = first + int(counts[key])
        yield int(key), first, last
        first = last


def grouped_frames(frames: pa.Array, counts: np.ndarray):
    """Yields (key, bytes, frame lengths) for each key with frames, given frames grouped
    by key in key order and `counts[key]` frames per key."""
    data, lengths = frames_data(frames)
    ends = offsets_of(lengths)
    for key, first, last in key_ranges(counts):
        yield key, data[int(ends[first]) : int(ends[last])], lengths[first:last]
