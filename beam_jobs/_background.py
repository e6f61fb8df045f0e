"""I/O that overlaps with compute, in one helper thread each.

File writes and Arrow's CSV and Parquet readers release the GIL, so while a helper
copies a buffer into the page cache or parses the next block, the caller encodes the
current one (tf.data's prefetch, for a Beam DoFn).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading

__all__ = ["BackgroundWriter", "OneAhead", "prefetched"]

_DONE = object()


class BackgroundWriter:
    """Wraps a writable file: `write` queues the buffer and returns at once (at most
    `depth` buffers wait, which bounds memory); the thread writes them in order. `close`
    waits for the queue, closes the file and re-raises a write error. Buffers must not
    change after they are queued."""

    def __init__(self, f, *, depth: int = 2):
        self._f = f
        self._queue: queue.Queue = queue.Queue(depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self._thread.start()

    def _run(self):
        while (data := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._f.write(data)
                except BaseException as e:  # re-raised in the caller's thread
                    self._error = e

    def write(self, data) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(data)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._f.close()
        if self._error is not None:
            raise self._error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def prefetched(items, *, depth: int = 1):
    """Yields from the iterable `items`, which a helper thread runs up to `depth` items
    ahead; an exception in it is raised here, at the item where it happened."""
    pending: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def run():
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        pending.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            pending.put((_DONE, None))
        except BaseException as e:  # re-raised in the consumer's thread
            pending.put((_DONE, e))

    thread = threading.Thread(target=run, name="ingest-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = pending.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()  # the consumer stopped early (or failed): let the helper end
        while thread.is_alive():
            try:
                pending.get(timeout=0.1)
            except queue.Empty:
                pass


class OneAhead:
    """Runs calls in a helper thread, one at a time, while the caller goes on: `submit`
    first waits for the call before it (re-raising its error), so the helper holds one
    call's arguments at most; `close` (or leaving a `with` block) waits for the last."""

    def __init__(self, name: str):
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        self._pending = None

    def submit(self, fn, *args) -> None:
        self.wait()
        self._pending = self._pool.submit(fn, *args)

    def wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
