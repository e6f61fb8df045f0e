"""Windows between processes: a worker writes a window's columns into a shared buffer, the
consumer reads them in place.

    worker: columns (numpy, from TensorFlow) --one copy--> slot buffer (a memfd, mapped)
            --(slot, layout: dtype, shape, offset per column) over the socket--> consumer
    consumer: the same buffer, mapped --views--> batches cut from the window

A buffer is an anonymous file (`memfd_create`) whose descriptor is passed over the
worker's socket once (SCM_RIGHTS): nothing is ever named in /dev/shm, so a process killed
at any point leaves nothing behind, and the memory goes when the last mapping does. A
slot grows (a new, larger buffer) when a window does not fit. Text columns travel as
their bytes joined and the offsets between them.
"""

from __future__ import annotations

import dataclasses
import mmap
import os

import numpy as np

__all__ = ["Buffer", "Column", "layout", "read", "write"]

_ALIGN = 64  # each column starts on a cache line


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class Buffer:
    """A shared buffer of `size` bytes: a new memfd, or one a peer sent (`fd`), mapped here."""

    def __init__(self, size: int, fd: int | None = None):
        if fd is None:
            if not hasattr(os, "memfd_create"):
                raise OSError(
                    "ingest's worker processes need Linux (os.memfd_create) for shared buffers; "
                    "use processes=0 on this system"
                )
            fd = os.memfd_create("ingest-window", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
        self.fd, self.size = fd, size
        self.map = mmap.mmap(fd, size)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view of it still lives: the mapping goes with the last one
            pass
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclasses.dataclass(frozen=True)
class Column:
    """Where one column of a window lies in a buffer.

    Numbers: `dtype`, `shape`, at `offset`. Text (`dtype` "bytes"): `shape` of its values,
    the [n + 1] int64 offsets between them at `offset`, their bytes at `data`.
    """

    dtype: str
    shape: tuple
    offset: int
    data: int = 0


def _text_parts(column: np.ndarray) -> tuple:
    flat = column.reshape(-1)
    ends = np.fromiter((len(v) for v in flat), np.int64, flat.size)
    return np.concatenate([[0], np.cumsum(ends)]), b"".join(flat)


def layout(columns: list) -> tuple:
    """Columns -> ([Column], bytes needed, the text columns' parts): where each will lie."""
    placed, parts, at = [], {}, 0
    for i, column in enumerate(columns):
        if column.dtype == object:
            offsets, data = parts[i] = _text_parts(column)
            placed.append(Column("bytes", column.shape, at, at + _aligned(offsets.nbytes)))
            at = _aligned(placed[-1].data + len(data))
        else:
            placed.append(Column(column.dtype.str, column.shape, at))
            at = _aligned(at + column.nbytes)
    return placed, at, parts


def write(buffer: Buffer, columns: list, placed: list, parts: dict) -> None:
    """Copies the window's columns into the buffer where `layout` placed them (the one copy)."""
    view = memoryview(buffer.map)
    for i, (column, where) in enumerate(zip(columns, placed)):
        if i in parts:
            offsets, data = parts[i]
            np.frombuffer(view, np.int64, offsets.size, where.offset)[:] = offsets
            view[where.data : where.data + len(data)] = data
        else:
            np.frombuffer(view, column.dtype, column.size, where.offset).reshape(column.shape)[...] = column
    del view


def read(buffer: Buffer, placed: list) -> list:
    """The window's columns as they lie in the buffer: numbers as read-only views; text as
    (offsets, bytes, shape), cut into values only for the rows a batch takes."""
    out = []
    for where in placed:
        if where.dtype == "bytes":
            n = int(np.prod(where.shape, dtype=np.int64))
            offsets = np.frombuffer(buffer.map, np.int64, n + 1, where.offset)
            out.append(_Text(offsets, memoryview(buffer.map)[where.data : where.data + int(offsets[-1])], where.shape))
        else:
            dtype = np.dtype(where.dtype)
            count = int(np.prod(where.shape, dtype=np.int64))
            array = np.frombuffer(buffer.map, dtype, count, where.offset).reshape(where.shape)
            array.flags.writeable = False
            out.append(array)
    return out


@dataclasses.dataclass(frozen=True)
class _Text:
    """A text column in a buffer; `rows(a, b)` makes the values of rows [a, b) (a copy)."""

    offsets: np.ndarray
    data: memoryview
    shape: tuple

    def rows(self, a: int, b: int) -> np.ndarray:
        inner = int(np.prod(self.shape[1:], dtype=np.int64))
        o, data = self.offsets, self.data
        values = [bytes(data[o[i] : o[i + 1]]) for i in range(a * inner, b * inner)]
        out = np.empty(len(values), object)
        out[:] = values
        return out.reshape((b - a,) + tuple(self.shape[1:]))
