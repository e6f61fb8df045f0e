"""Writes that overlap with compute: a file's writes run in one helper thread.

File writes release the GIL, so while the helper copies one buffer into the page cache
(or uploads it), the caller encodes or gathers the next one.
"""

from __future__ import annotations

import queue
import threading

__all__ = ["BackgroundWriter"]


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
