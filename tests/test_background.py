"""Background writes: in order, and a failed write is never lost."""

from __future__ import annotations

import io

import pytest

from beam_jobs._background import BackgroundWriter


class _Sink(io.BytesIO):
    def close(self):
        self.final = self.getvalue()
        super().close()


def test_writes_arrive_in_order_and_close_closes_the_file():
    sink = _Sink()
    with BackgroundWriter(sink, depth=1) as w:
        for i in range(200):
            w.write(b"%d," % i)
    assert sink.closed and sink.final == b"".join(b"%d," % i for i in range(200))


def test_a_failed_write_is_raised_by_close():
    class Full(_Sink):
        def write(self, data):
            raise OSError("no space left on device")

    w = BackgroundWriter(Full())
    w.write(b"x")
    with pytest.raises(OSError, match="no space"):
        w.close()
