"""TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C of the data."""

from __future__ import annotations

import struct

import google_crc32c
import numpy as np

__all__ = ["frame_records", "iter_frames", "read_frames", "TFRecordError"]

_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class TFRecordError(ValueError):
    pass


def _masked_crc(data) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_records(buf: np.ndarray, offsets: np.ndarray):
    """Frames the records `buf[offsets[i]:offsets[i+1]]`.

    Returns `(framed_bytes, frame_offsets, data_crcs)`; `data_crcs` (unmasked CRC32C of
    each record) doubles as a stable content hash for split assignment.
    """
    raw = buf.tobytes()  # google_crc32c takes bytes only, not memoryview slices
    n = len(offsets) - 1
    out = bytearray()
    frame_offsets = np.empty(n + 1, np.int64)
    crcs = np.empty(n, np.uint32)
    value = google_crc32c.value
    for i in range(n):
        frame_offsets[i] = len(out)
        a, b = int(offsets[i]), int(offsets[i + 1])
        header = _LEN.pack(b - a)
        data = raw[a:b]
        crc = value(data)
        crcs[i] = crc
        out += header
        out += _CRC.pack(_masked_crc(header))
        out += data
        out += _CRC.pack((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
    frame_offsets[n] = len(out)
    return bytes(out), frame_offsets, crcs


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


def read_frames(f, *, source: str = "<file>"):
    """Yields whole frames from a readable binary file, streaming (no full read)."""
    while True:
        header = f.read(12)
        if not header:
            return
        if len(header) < 12:
            raise TFRecordError(f"{source}: truncated record header")
        (length,) = _LEN.unpack_from(header, 0)
        rest = f.read(length + 4)
        if len(rest) < length + 4:
            raise TFRecordError(f"{source}: truncated record (length {length})")
        yield header + rest
