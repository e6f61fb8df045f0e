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


def test_prefetched_yields_everything_in_order_and_raises_where_the_source_failed():
    from beam_jobs._background import prefetched

    assert list(prefetched(iter(range(1000)), depth=3)) == list(range(1000))

    def failing():
        yield 1
        yield 2
        raise ValueError("cannot parse CSV file x.csv after row 2")

    got = []
    with pytest.raises(ValueError, match="after row 2"):
        for item in prefetched(failing()):
            got.append(item)
    assert got == [1, 2]


def test_prefetched_stops_its_thread_when_the_consumer_stops_early():
    import threading

    from beam_jobs._background import prefetched

    before = threading.active_count()
    for item in prefetched(iter(range(10**9))):
        if item == 5:
            break
    assert threading.active_count() == before
