"""TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C of the data."""

from __future__ import annotations

import struct

import google_crc32c
import numpy as np
import pyarrow as pa

__all__ = ["frames_array", "frames_data", "iter_frames", "TFRecordError"]

_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class TFRecordError(ValueError):
    pass


def _masked_crc(data) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frames_array(buf, offsets: np.ndarray) -> pa.Array:
    """Frames `buf[offsets[i]:offsets[i+1]]` as an Arrow binary array (no copy), so
    reordering them (`take`) runs in C++."""
    data = buf if isinstance(buf, pa.Buffer) else pa.py_buffer(buf)
    return pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(np.ascontiguousarray(offsets, np.int64)), data])


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
        if end - pos < 12:
            raise TFRecordError(f"{source}: truncated record header at byte {pos}")
        (length,) = _LEN.unpack_from(data, pos)
        stop = pos + 12 + length + 4
        if stop > end:
            raise TFRecordError(f"{source}: truncated record at byte {pos} (length {length})")
        if verify:
            (crc,) = _CRC.unpack_from(data, pos + 12 + length)
            if crc != _masked_crc(bytes(mv[pos + 12 : pos + 12 + length])):
                raise TFRecordError(f"{source}: CRC mismatch in record at byte {pos}")
        yield mv[pos:stop]
        pos = stop
